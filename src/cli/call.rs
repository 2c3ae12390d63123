//! `callstream call FILE --url URL --key CLIENT_ID --secret SECRET`: streams an audio file to
//! a live-call endpoint as Genesys Cloud would (AudioHook v2, signed, 200 ms frames in real
//! time or faster) and prints what the server sends: final transcripts, intent updates,
//! `disconnect`, and how the socket closed.
//!
//! Exit status: 0 when the call ended with `closed` and close code 1000; 2 when the server sent
//! `disconnect` or closed with another code; 1 when the call could not be made.

use std::path::PathBuf;

use anyhow::Context;

use callstream::callclient::{load_audio, run_call, CallOptions, Received, WireFormat};

/// Arguments of `callstream call`.
#[derive(clap::Args)]
pub struct CallArgs {
    /// The audio to stream (WAV, FLAC, MP3, Ogg; one or two channels; resampled to 8 kHz).
    pub file: PathBuf,
    /// The endpoint, `ws://HOST:PORT/api/callstream/ws` (or `wss://`). An `http(s)://` base
    /// URL is completed.
    #[arg(long)]
    pub url: String,
    /// The connector's client id (sent as X-API-Key).
    #[arg(long)]
    pub key: String,
    /// The connector's client secret (base64); signs the upgrade request.
    #[arg(long, env = "CALLSTREAM_CLIENT_SECRET")]
    pub secret: Option<String>,
    /// Audio on the wire.
    #[arg(long, value_enum, default_value = "pcmu")]
    pub format: WireFormat,
    /// Pace: 1 is real time, 4 four times faster, 0 as fast as possible.
    #[arg(long, default_value_t = 1.0)]
    pub speed: f64,
    /// Ask for the intent of the transcript so far after every this many seconds of audio.
    #[arg(long)]
    pub analyze_every: Option<f64>,
    /// Language tag of the call.
    #[arg(long, default_value = "en-US")]
    pub language: String,
    /// Send a connection probe (nil conversation id) instead of the audio.
    #[arg(long)]
    pub probe: bool,
}

fn endpoint(url: &str) -> String {
    let url = url.trim_end_matches('/');
    let url = if let Some(rest) = url.strip_prefix("http://") {
        format!("ws://{rest}")
    } else if let Some(rest) = url.strip_prefix("https://") {
        format!("wss://{rest}")
    } else {
        url.to_owned()
    };
    if url.ends_with(callstream::config::CALLSTREAM_WS_PATH) {
        url
    } else {
        format!("{url}{}", callstream::config::CALLSTREAM_WS_PATH)
    }
}

fn print(received: &Received, json: bool) {
    let m = &received.message;
    if json {
        println!("{m}");
        return;
    }
    let at = received.at.as_secs_f64();
    match m["type"].as_str().unwrap_or_default() {
        "event" => {
            for entity in m["parameters"]["entities"].as_array().into_iter().flatten() {
                let d = &entity["data"];
                let offset = d["offset"].as_str().unwrap_or("PT0S");
                let secs: f64 = offset
                    .trim_start_matches("PT")
                    .trim_end_matches('S')
                    .parse()
                    .unwrap_or(0.0);
                let alt = &d["alternatives"][0];
                println!(
                    "[{}] channel {} ({:.2}): {}",
                    super::clock(secs),
                    d["channelId"],
                    alt["confidence"].as_f64().unwrap_or(0.0),
                    alt["interpretations"][0]["transcript"]
                        .as_str()
                        .unwrap_or("")
                );
            }
        }
        "intent_update" => println!("[{at:.1} s] intent: {}", m["parameters"]),
        "disconnect" => println!("[{at:.1} s] disconnect: {}", m["parameters"]),
        "opened" => println!("[{at:.1} s] opened: {}", m["parameters"]["media"]),
        "closed" => println!("[{at:.1} s] closed"),
        _ => {}
    }
}

/// Runs the command.
pub fn run(args: CallArgs, json: bool) -> anyhow::Result<std::process::ExitCode> {
    let channels = if args.probe {
        vec![Vec::new(), Vec::new()]
    } else {
        load_audio(&args.file).map_err(anyhow::Error::msg)?
    };
    let mut options = CallOptions::new(&endpoint(&args.url), &args.key, args.secret.as_deref());
    options.format = args.format;
    options.speed = args.speed;
    options.analyze_every = args.analyze_every;
    options.language = args.language;
    options.probe = args.probe;
    let runtime = tokio::runtime::Runtime::new()?;
    let outcome = runtime
        .block_on(run_call(&options, &channels, |m| print(m, json)))
        .context("the call failed")?;
    let (code, reason) = outcome.close.clone().unwrap_or((1005, String::new()));
    let transcripts = outcome.of_type("event").count();
    let disconnected = outcome.of_type("disconnect").count() > 0;
    let closed = outcome.of_type("closed").count() > 0;
    eprintln!(
        "socket closed with {code}{}; {transcripts} transcripts, {} intent updates for {} analyze, {:.1} s of audio sent",
        if reason.is_empty() { String::new() } else { format!(" ({reason})") },
        outcome.of_type("intent_update").count(),
        outcome.analyze_sent,
        outcome.audio_secs
    );
    Ok(if code == 1000 && closed && !disconnected {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::from(2)
    })
}
