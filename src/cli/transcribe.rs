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
    /// Send the file to a callstream server instead (its base URL, e.g. http://localhost:8080).
    #[arg(long, requires = "key")]
    url: Option<String>,
    /// API key for --url.
    #[arg(long, env = "CALLSTREAM_API_KEY", hide_env_values = true)]
    key: Option<String>,
    /// With --url: also extract a BANT record.
    #[arg(long, requires = "url")]
    bant: bool,
    /// With --url: also extract a NEAT-P record.
    #[arg(long, requires = "url")]
    neat: bool,
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
    if let Some(url) = args.url.clone() {
        return remote(&url, args, json);
    }
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

/// Uploads the file to `POST /api/transcribe` with a progress bar and prints the answer.
fn remote(url: &str, args: TranscribeArgs, json: bool) -> anyhow::Result<()> {
    let key = args.key.clone().context("--key is required with --url")?;
    let bytes = std::fs::read(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    let total = bytes.len() as u64;
    let name = args
        .file
        .file_name()
        .map_or_else(|| "audio".into(), |n| n.to_string_lossy().into_owned());
    let bar = ProgressBar::new(total).with_style(
        ProgressStyle::with_template("{spinner} {msg} [{bar:30}] {bytes}/{total_bytes}")
            .expect("the template is valid")
            .progress_chars("=> "),
    );
    bar.set_message("uploading");
    let runtime = tokio::runtime::Runtime::new()?;
    let response: serde_json::Value = runtime.block_on(async {
        let progress = bar.clone();
        let chunks: Vec<Vec<u8>> = bytes.chunks(64 * 1024).map(<[u8]>::to_vec).collect();
        let stream = futures_util::stream::iter(chunks.into_iter().map(move |c| {
            progress.inc(c.len() as u64);
            if progress.position() >= progress.length().unwrap_or(0) {
                progress.set_message("transcribing on the server");
            }
            Ok::<_, std::io::Error>(c)
        }));
        let part =
            reqwest::multipart::Part::stream_with_length(reqwest::Body::wrap_stream(stream), total)
                .file_name(name);
        let form = reqwest::multipart::Form::new()
            .part("file", part)
            .text("language", args.language.clone())
            .text("extract_bant", args.bant.to_string())
            .text("extract_neat", args.neat.to_string());
        let endpoint = format!("{}/api/transcribe", url.trim_end_matches('/'));
        let ticker = bar.clone();
        let tick = tokio::spawn(async move {
            loop {
                ticker.tick();
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        });
        let resp = reqwest::Client::new()
            .post(&endpoint)
            .header("X-API-Key", key)
            .multipart(form)
            .send()
            .await;
        tick.abort();
        let resp = resp.with_context(|| format!("cannot reach {endpoint}"))?;
        let status = resp.status();
        let body: serde_json::Value = resp
            .json()
            .await
            .context("the server's answer is not JSON")?;
        if !status.is_success() {
            anyhow::bail!(
                "{status}: {}",
                body["error"]["message"].as_str().unwrap_or("no message")
            );
        }
        Ok::<_, anyhow::Error>(body)
    })?;
    bar.finish_and_clear();
    if json {
        println!("{}", serde_json::to_string_pretty(&response)?);
        return Ok(());
    }
    let channels = response["channels"].as_u64().unwrap_or(1);
    for s in response["segments"].as_array().into_iter().flatten() {
        let who = if channels > 1 {
            format!("{}  ", s["speaker"].as_str().unwrap_or("?"))
        } else {
            String::new()
        };
        println!(
            "[{} -> {}] {who}{}",
            super::clock(s["start"].as_f64().unwrap_or(0.0)),
            super::clock(s["end"].as_f64().unwrap_or(0.0)),
            s["text"].as_str().unwrap_or("")
        );
    }
    println!("intent: {}", response["intent"]);
    for record in ["bant", "neat_p"] {
        if let Some(r) = response.get(record) {
            println!("{record}: {}", serde_json::to_string_pretty(r)?);
        }
    }
    Ok(())
}
