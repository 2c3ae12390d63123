//! `bench files`: whole files through the transcription path, against a reference engine.

use super::*;

/// Words of a transcript, normalised as the word error rate compares them.
fn word_list<'a>(texts: impl Iterator<Item = &'a str>) -> Vec<String> {
    texts.flat_map(normalise).collect()
}

/// Writes 16 kHz channels as a 16-bit PCM WAV.
fn write_wav(path: &std::path::Path, channels: &[Vec<f32>]) -> anyhow::Result<()> {
    let frames = channels.first().map_or(0, Vec::len);
    let n = channels.len() as u16;
    let data_len = (frames * channels.len() * 2) as u32;
    let mut out = Vec::with_capacity(44 + data_len as usize);
    out.extend_from_slice(b"RIFF");
    out.extend_from_slice(&(36 + data_len).to_le_bytes());
    out.extend_from_slice(b"WAVEfmt ");
    out.extend_from_slice(&16u32.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&n.to_le_bytes());
    out.extend_from_slice(&(OUTPUT_RATE as u32).to_le_bytes());
    out.extend_from_slice(&(OUTPUT_RATE as u32 * 2 * u32::from(n)).to_le_bytes());
    out.extend_from_slice(&(2 * n).to_le_bytes());
    out.extend_from_slice(&16u16.to_le_bytes());
    out.extend_from_slice(b"data");
    out.extend_from_slice(&data_len.to_le_bytes());
    for i in 0..frames {
        for c in channels {
            let v = (c[i] * 32768.0).clamp(-32768.0, 32767.0) as i16;
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    std::fs::write(path, out)?;
    Ok(())
}

/// `bench files`: a long recording through the file path, packed and unpacked, and
/// optionally through faster-whisper.
pub(super) fn files(
    config: &Config,
    audio: &std::path::Path,
    repeat: usize,
    language: &str,
    faster_whisper: bool,
    set: Option<&std::path::Path>,
    text: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    use callstream_actors::asr::file::{transcribe_channels, Packing};
    use callstream_actors::asr::wer::correct_words;
    // The recording, and with a set the reference words of each channel.
    let (channels, references) = match set {
        None => (crate::cli::bench_analysis::load_audio(audio, repeat)?, None),
        Some(dir) => {
            let calls = crate::cli::labelled::read_calls(&dir.join("calls.txt"))?;
            let mut channels: Vec<Vec<f32>> = vec![Vec::new(), Vec::new()];
            let mut references = vec![String::new(), String::new()];
            for (n, call) in calls.iter().enumerate() {
                let path = dir.join(format!("call-{:02}.flac", n + 1));
                let audio = crate::cli::bench_analysis::load_audio(&path, 1)?;
                anyhow::ensure!(audio.len() == 2, "{}: not stereo", path.display());
                for (all, one) in channels.iter_mut().zip(audio) {
                    all.extend(one);
                }
                for (customer, said) in &call.turns {
                    let r = &mut references[usize::from(!customer)];
                    r.push_str(said);
                    r.push(' ');
                }
            }
            println!("{} calls of {} back to back", calls.len(), dir.display());
            (channels, Some(references))
        }
    };
    let score = |name: &str, words_by_channel: &[Vec<String>]| {
        if let Some(references) = &references {
            let (mut correct, mut count) = (0, WerCount::default());
            for (r, h) in references.iter().zip(words_by_channel) {
                let h = h.join(" ");
                correct += correct_words(r, &h);
                count = count + wer(r, &h);
            }
            println!(
                "{name}: {correct} of {} reference words correct, WER {:.1}%",
                count.reference_words,
                100.0 * count.rate()
            );
        }
    };
    let secs = channels
        .first()
        .map_or(0.0, |c| c.len() as f64 / OUTPUT_RATE as f64);
    println!(
        "{:.1} min, {} channels; model {}, beam {}, window >= {} ms; {} workers of one thread",
        secs / 60.0,
        channels.len(),
        config.models.whisper.display(),
        config.asr.beam_size,
        config.asr.min_window_ms,
        config.asr.workers
    );
    println!("engine                                     wall s  CPU s  windows  words");
    if let Some(dir) = text {
        std::fs::create_dir_all(dir)?;
        for (c, r) in references.iter().flatten().enumerate() {
            std::fs::write(dir.join(format!("reference-{c}.txt")), r.trim_end())?;
        }
    }
    let pool = callstream::speech::start_pool(config, None)?;
    let mut ours = Vec::new();
    for (name, file, packing) in [
        (
            "callstream, packed windows",
            "packed",
            config.transcribe.packing(),
        ),
        (
            "callstream, one window per utterance",
            "utterance",
            Packing::OFF,
        ),
    ] {
        let before = pool.snapshot().batches;
        let (cpu, started) = (cpu_seconds(), Instant::now());
        let segments = transcribe_channels(
            &pool,
            &channels,
            language,
            config.vad.config(),
            packing,
            &mut |_, _| {},
        )?;
        let (wall, cpu) = (started.elapsed().as_secs_f64(), cpu_seconds() - cpu);
        // Channel after channel, as faster-whisper's words come.
        let mut segments = segments;
        segments.sort_by(|a, b| a.channel.cmp(&b.channel).then(a.start.total_cmp(&b.start)));
        let words = word_list(segments.iter().map(|s| s.text.as_str()));
        if let Some(dir) = text {
            for c in 0..channels.len() {
                let lines: String = segments
                    .iter()
                    .filter(|s| s.channel == c)
                    .map(|s| format!("{:9.2} {}\n", s.start, s.text.trim()))
                    .collect();
                std::fs::write(dir.join(format!("{file}-{c}.txt")), lines)?;
            }
        }
        println!(
            "{name:<41}  {wall:>6.1}  {cpu:>5.1}  {:>7}  {:>5}",
            pool.snapshot().batches - before,
            words.len()
        );
        let by_channel: Vec<Vec<String>> = (0..channels.len())
            .map(|c| {
                word_list(
                    segments
                        .iter()
                        .filter(|s| s.channel == c)
                        .map(|s| s.text.as_str()),
                )
            })
            .collect();
        ours.push((name, words, by_channel));
    }
    if faster_whisper {
        let dir = std::env::temp_dir().join(format!("callstream-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let wav = dir.join("call.wav");
        write_wav(&wav, &channels)?;
        let pythonpath = std::env::var("CALLSTREAM_BENCH_PYTHONPATH").unwrap_or_else(|_| {
            format!(
                "{}/.cache/callstream/fw",
                std::env::var("HOME").unwrap_or_default()
            )
        });
        let output = std::process::Command::new("python3")
            .arg("scripts/bench/fw_compare.py")
            .arg(&config.models.whisper)
            .arg(&wav)
            .arg(config.asr.beam_size.to_string())
            .arg(language)
            .env("PYTHONPATH", pythonpath)
            .output()
            .context("cannot run python3")?;
        let _ = std::fs::remove_dir_all(&dir);
        anyhow::ensure!(
            output.status.success(),
            "faster-whisper failed (scripts/setup.sh --bench installs it): {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&output.stdout)?;
        let fw_words: Vec<String> = word_list(
            report["channels"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|c| c.as_array().into_iter().flatten())
                .filter_map(|w| w.as_str()),
        );
        println!(
            "{:<41}  {:>6.1}  {:>5.1}  {:>7}  {:>5}",
            "faster-whisper, 1 thread, its VAD",
            report["wall_s"].as_f64().unwrap_or(f64::NAN),
            report["cpu_s"].as_f64().unwrap_or(f64::NAN),
            "-",
            fw_words.len()
        );
        let fw_by_channel: Vec<Vec<String>> = report["channels"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                word_list(
                    c.as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|w| w.as_str()),
                )
            })
            .collect();
        score("faster-whisper", &fw_by_channel);
        let reference = fw_words.join(" ");
        for (name, words, _) in &ours {
            let count = wer(&reference, &words.join(" "));
            println!(
                "{name}: {:.1}% word difference from faster-whisper's transcript",
                100.0 * count.rate()
            );
        }
    }
    for (name, _, by_channel) in &ours {
        score(name, by_channel);
    }
    Ok(())
}
