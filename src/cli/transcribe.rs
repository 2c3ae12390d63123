//! `callstream transcribe FILE`: transcribes a file on this machine with the configured engine
//! (the same use case as `POST /api/transcribe`, [`callstream::files::transcribe`]) and prints
//! the transcript with timestamped segments; with `--url`, uploads it to a server instead.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use callstream::config::Config;
use callstream::files::{Analyses, FileEngines, FileRequest};
use callstream_actors::asr::model_languages;
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
    /// Also classify the customer's intent (always done with --url).
    #[arg(long)]
    intent: bool,
    /// Also extract a BANT record.
    #[arg(long)]
    bant: bool,
    /// Also extract a NEAT-P record.
    #[arg(long)]
    neat: bool,
}

#[derive(serde::Serialize)]
struct Output {
    file: String,
    #[serde(flatten)]
    transcript: callstream::files::FileTranscript,
}

/// Runs `transcribe`.
pub fn run(config: &Config, args: TranscribeArgs, json: bool) -> anyhow::Result<()> {
    if let Some(url) = args.url.clone() {
        return remote(&url, args, json);
    }
    let bytes = std::fs::read(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    let extension = args
        .file
        .extension()
        .map(|e| e.to_string_lossy().to_lowercase());
    let analyses = Analyses {
        intent: args.intent,
        bant: args.bant,
        neat_p: args.neat,
    };
    // The language model is loaded only when an analysis asks for it.
    let llm = if analyses == Analyses::default() {
        None
    } else {
        Some(callstream::llm::build_provider(config)?)
    };
    let engines = FileEngines {
        pool: Arc::new(callstream::speech::start_pool(config, None)?),
        languages: Arc::new(model_languages(&config.models.whisper)?),
        vad: config.vad.config(),
        packing: config.transcribe.packing(),
        channel_roles: config.transcribe.channel_roles.clone(),
        max_duration_s: config.transcribe.max_duration_s,
        llm,
    };
    let workers = engines.pool.workers();
    let bar = ProgressBar::new(0).with_style(
        ProgressStyle::with_template("{spinner} {msg} [{bar:30}] {pos}/{len} windows, {elapsed}")
            .expect("the template is valid")
            .progress_chars("=> "),
    );
    bar.set_message("transcribing");
    let progress = {
        let bar = bar.clone();
        Box::new(move |done: usize, total: usize| {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        })
    };
    let request = FileRequest {
        bytes,
        extension,
        language: args.language.clone(),
        analyses,
        redact: false,
    };
    let started = Instant::now();
    let runtime = tokio::runtime::Runtime::new()?;
    let transcript = runtime
        .block_on(callstream::files::transcribe(
            &engines,
            request,
            None,
            Some(progress),
        ))
        .with_context(|| format!("{}", args.file.display()))?;
    bar.finish_and_clear();
    let elapsed = started.elapsed().as_secs_f64();
    if json {
        let out = Output {
            file: args.file.display().to_string(),
            transcript,
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    for s in &transcript.segments {
        let channel = if transcript.channels > 1 {
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
    print_analyses(&serde_json::to_value(&transcript)?)?;
    eprintln!(
        "{} segments from {:.1} s of audio in {:.1} s ({:.2}x real time, {} workers)",
        transcript.segments.len(),
        transcript.duration,
        elapsed,
        transcript.duration / elapsed.max(1e-9),
        workers
    );
    Ok(())
}

/// Prints the intent, BANT and NEAT-P records of a transcription response, where present.
fn print_analyses(response: &serde_json::Value) -> anyhow::Result<()> {
    if let Some(intent) = response.get("intent") {
        println!("intent: {intent}");
    }
    for record in ["bant", "neat_p"] {
        if let Some(r) = response.get(record) {
            println!("{record}: {}", serde_json::to_string_pretty(r)?);
        }
    }
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
    print_analyses(&response)
}
