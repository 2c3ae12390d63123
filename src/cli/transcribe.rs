//! `callstream transcribe FILE`: transcribes a file on this machine with the configured engine
//! and prints the transcript with timestamped segments.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use callstream::config::Config;
use callstream_actors::asr::file::{transcribe_channels, FileSegment};
use callstream_actors::audio::decode::{decode, OUTPUT_RATE};
use indicatif::{ProgressBar, ProgressStyle};

/// Arguments of `transcribe`.
#[derive(clap::Args)]
pub struct TranscribeArgs {
    /// The audio file (WAV, FLAC, MP3, Ogg Vorbis, Ogg Opus).
    file: PathBuf,
    /// Language code (see GET /api/languages).
    #[arg(long, default_value = "en")]
    language: String,
}

#[derive(serde::Serialize)]
struct Output<'a> {
    file: String,
    duration: f64,
    channels: usize,
    text: String,
    segments: &'a [FileSegment],
}

/// Runs `transcribe`.
pub fn run(config: &Config, args: TranscribeArgs, json: bool) -> anyhow::Result<()> {
    let bytes = std::fs::read(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    let ext = args
        .file
        .extension()
        .map(|e| e.to_string_lossy().to_lowercase());
    let audio = decode(bytes, ext.as_deref(), OUTPUT_RATE)
        .with_context(|| format!("{}", args.file.display()))?;
    let pool = callstream::speech::start_pool(config, None)?;
    let bar = ProgressBar::new(0).with_style(
        ProgressStyle::with_template(
            "{spinner} {msg} [{bar:30}] {pos}/{len} utterances, {elapsed}",
        )
        .expect("the template is valid")
        .progress_chars("=> "),
    );
    bar.set_message(format!("{:.0} s of audio", audio.duration_secs()));
    let started = Instant::now();
    let segments = transcribe_channels(
        &pool,
        &audio.channels,
        &args.language,
        config.vad.config(),
        &mut |done, total| {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        },
    )?;
    bar.finish_and_clear();
    let elapsed = started.elapsed().as_secs_f64();
    let text = segments
        .iter()
        .map(|s| s.text.as_str())
        .collect::<Vec<_>>()
        .join(" ");
    if json {
        let out = Output {
            file: args.file.display().to_string(),
            duration: audio.duration_secs(),
            channels: audio.channels.len(),
            text,
            segments: &segments,
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    for s in &segments {
        let channel = if audio.channels.len() > 1 {
            format!("ch{}  ", s.channel)
        } else {
            String::new()
        };
        println!(
            "[{} -> {}] {channel}{}",
            super::clock(s.start),
            super::clock(s.end),
            s.text
        );
    }
    eprintln!(
        "{} segments from {:.1} s of audio in {:.1} s ({:.2}x real time, {} workers)",
        segments.len(),
        audio.duration_secs(),
        elapsed,
        audio.duration_secs() / elapsed.max(1e-9),
        pool.workers()
    );
    Ok(())
}
