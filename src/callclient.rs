//! An AudioHook v2 client, as Genesys Cloud behaves: it signs the upgrade request (RFC 9421,
//! HMAC-SHA256 with the connector's client secret), opens the session offering the audio's
//! channels as PCMU or L16 at 8 kHz, streams 200 ms frames paced in real time (or faster),
//! pings every 5 s, asks for intent analyses when told to, closes when the audio ends and
//! waits for `closed`. It answers a server `disconnect` with `close`.
//!
//! Used by `callstream call` and `callstream bench calls`.

use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use serde_json::Value;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{self, Message};

use callstream_actors::audio::g711::encode_ulaw_into;
use callstream_actors::protocol::messages::{
    ClientEnvelope, ClientMessage, CloseParams, Duration as Pt, Empty, MediaEntry, OpenParams,
    Participant, PingParams, ServerEnvelope, ServerMessage, VERSION,
};

use crate::auth::rfc9421::{sign_audiohook, RequestParts};

/// Audio rate of AudioHook.
pub const RATE: usize = 8000;

/// How the audio goes on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WireFormat {
    /// G.711 mu-law.
    Pcmu,
    /// 16-bit linear, little-endian.
    L16,
}

/// What to stream and how.
#[derive(Debug, Clone)]
pub struct CallOptions {
    /// `ws://` or `wss://` URL of the endpoint.
    pub url: String,
    /// The connector's client id.
    pub client_id: String,
    /// The connector's client secret (base64), or `None` to send no signature.
    pub secret: Option<String>,
    /// Wire format.
    pub format: WireFormat,
    /// Frame length.
    pub frame_ms: u64,
    /// Pace: 1.0 is real time, 2.0 twice as fast, 0 as fast as the socket takes it.
    pub speed: f64,
    /// Send `analyze` after every this many seconds of audio.
    pub analyze_every: Option<f64>,
    /// Language tag of the `open`.
    pub language: String,
    /// Open as a connection probe (nil conversation and participant), send no audio.
    pub probe: bool,
    /// How long to wait for `closed` after `close`.
    pub close_timeout: Duration,
}

impl CallOptions {
    /// Options with the defaults: PCMU, 200 ms frames, real time, `en-US`.
    pub fn new(url: &str, client_id: &str, secret: Option<&str>) -> Self {
        Self {
            url: url.to_owned(),
            client_id: client_id.to_owned(),
            secret: secret.map(str::to_owned),
            format: WireFormat::Pcmu,
            frame_ms: 200,
            speed: 1.0,
            analyze_every: None,
            language: "en-US".to_owned(),
            probe: false,
            close_timeout: Duration::from_secs(120),
        }
    }
}

/// A message from the server, with when it arrived.
#[derive(Debug, Clone)]
pub struct Received {
    /// Time since the call was opened.
    pub at: Duration,
    /// The message (an envelope).
    pub message: Value,
}

/// How a call went.
#[derive(Debug, Clone, Default)]
pub struct CallOutcome {
    /// Every server text message, in order.
    pub messages: Vec<Received>,
    /// The close frame from the server: code and reason.
    pub close: Option<(u16, String)>,
    /// Seconds of audio sent (per channel).
    pub audio_secs: f64,
    /// When each frame was sent, since the call was opened, and the audio second it ends at.
    pub frames: Vec<(Duration, f64)>,
    /// `analyze` messages sent.
    pub analyze_sent: usize,
}

impl CallOutcome {
    /// Messages of one type.
    pub fn of_type<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a Received> + 'a {
        self.messages
            .iter()
            .filter(move |m| m.message["type"] == kind)
    }

    /// When the frame carrying audio second `t` was sent.
    pub fn sent_at(&self, t: f64) -> Option<Duration> {
        self.frames
            .iter()
            .find(|(_, end)| *end >= t)
            .map(|(at, _)| *at)
    }
}

/// Why a call could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// Bad options.
    #[error("{0}")]
    Options(String),
    /// The connection failed.
    #[error("connection failed: {0}")]
    Connect(String),
    /// The server answered the upgrade with an HTTP status instead of a socket (a cap, or
    /// an instance at its live-call capacity).
    #[error("refused with HTTP {status}: {body}")]
    Refused {
        /// The status.
        status: u16,
        /// Its body.
        body: String,
    },
    /// The server broke the protocol or went silent.
    #[error("protocol: {0}")]
    Protocol(String),
}

/// Interleaves per-channel samples into wire bytes.
pub fn interleave(channels: &[Vec<i16>], from: usize, to: usize, format: WireFormat) -> Vec<u8> {
    let n = channels.len();
    let mut pcm = Vec::with_capacity((to - from) * n);
    for i in from..to {
        for c in channels {
            pcm.push(c[i]);
        }
    }
    match format {
        WireFormat::Pcmu => {
            let mut out = vec![0u8; pcm.len()];
            encode_ulaw_into(&pcm, &mut out);
            out
        }
        WireFormat::L16 => pcm.iter().flat_map(|s| s.to_le_bytes()).collect(),
    }
}

fn uuid() -> String {
    uuid::Uuid::new_v4().to_string()
}

struct Client {
    id: String,
    seq: u64,
    serverseq: u64,
    position: f64,
}

impl Client {
    fn message(&mut self, message: ClientMessage) -> Message {
        self.seq += 1;
        let envelope = ClientEnvelope {
            version: VERSION.to_owned(),
            id: self.id.clone(),
            seq: self.seq,
            serverseq: self.serverseq,
            position: Pt(self.position),
            message,
        };
        Message::text(serde_json::to_string(&envelope).expect("client messages always serialize"))
    }

    fn close(&mut self, reason: &str) -> Message {
        self.message(ClientMessage::Close(CloseParams {
            reason: reason.to_owned(),
        }))
    }
}

/// Streams `channels` (8 kHz, one or two) as one call and reports every server message to
/// `on_message` as it arrives.
pub async fn run_call(
    options: &CallOptions,
    channels: &[Vec<i16>],
    mut on_message: impl FnMut(&Received),
) -> Result<CallOutcome, CallError> {
    if !(1..=2).contains(&channels.len()) {
        return Err(CallError::Options(format!(
            "{} channels; AudioHook carries 1 or 2",
            channels.len()
        )));
    }
    let mut request = options
        .url
        .as_str()
        .into_client_request()
        .map_err(|e| CallError::Options(format!("bad URL {}: {e}", options.url)))?;
    let uri = request.uri().clone();
    let authority = uri
        .authority()
        .map(|a| a.as_str().to_owned())
        .ok_or_else(|| CallError::Options("the URL has no host".into()))?;
    let target = uri
        .path_and_query()
        .map_or("/".to_owned(), |p| p.as_str().to_owned());
    let (session, org, correlation) = (uuid(), uuid(), uuid());
    let mut headers = vec![
        ("audiohook-organization-id".to_owned(), org.clone()),
        ("audiohook-correlation-id".to_owned(), correlation),
        ("audiohook-session-id".to_owned(), session.clone()),
        ("x-api-key".to_owned(), options.client_id.clone()),
    ];
    if let Some(secret) = &options.secret {
        let parts = RequestParts {
            method: "GET",
            target: &target,
            authority: &authority,
            headers: &headers,
        };
        let created = crate::clock::now_ms() / 1000;
        let (input, signature) = sign_audiohook(&parts, &options.client_id, secret, created)
            .map_err(CallError::Options)?;
        headers.push(("signature-input".to_owned(), input));
        headers.push(("signature".to_owned(), signature));
    }
    headers.push((
        "user-agent".to_owned(),
        "callstream-audiohook-client".to_owned(),
    ));
    for (k, v) in &headers {
        let name = tungstenite::http::HeaderName::from_bytes(k.as_bytes())
            .map_err(|e| CallError::Options(e.to_string()))?;
        let value = tungstenite::http::HeaderValue::from_str(v)
            .map_err(|e| CallError::Options(e.to_string()))?;
        request.headers_mut().insert(name, value);
    }
    let config = WebSocketConfig::default().max_message_size(Some(1 << 20));
    let (socket, _) = tokio_tungstenite::connect_async_with_config(request, Some(config), false)
        .await
        .map_err(|e| match e {
            tungstenite::Error::Http(response) => CallError::Refused {
                status: response.status().as_u16(),
                body: String::from_utf8_lossy(response.body().as_deref().unwrap_or_default())
                    .into_owned(),
            },
            e => CallError::Connect(e.to_string()),
        })?;
    let (mut tx, mut rx) = socket.split();
    let mut client = Client {
        id: session,
        seq: 0,
        serverseq: 0,
        position: 0.0,
    };
    let nil = "00000000-0000-0000-0000-000000000000";
    let channel_names = ["external", "internal"][..channels.len()]
        .iter()
        .map(|c| (*c).to_owned())
        .collect();
    let format = match options.format {
        WireFormat::Pcmu => "PCMU",
        WireFormat::L16 => "L16",
    };
    let participant = if options.probe {
        Participant {
            id: nil.to_owned(),
            ani: String::new(),
            ani_name: String::new(),
            dnis: String::new(),
        }
    } else {
        Participant {
            id: uuid(),
            ani: "+15550100".to_owned(),
            ani_name: "Caller".to_owned(),
            dnis: "+15550199".to_owned(),
        }
    };
    let open = ClientMessage::Open(OpenParams {
        organization_id: org,
        conversation_id: if options.probe {
            nil.to_owned()
        } else {
            uuid()
        },
        participant,
        media: vec![MediaEntry {
            kind: "audio".to_owned(),
            format: format.to_owned(),
            channels: channel_names,
            rate: RATE as u32,
        }],
        language: Some(options.language.clone()),
        supported_languages: None,
        continued_sessions: Vec::new(),
    });
    let started = Instant::now();
    let mut outcome = CallOutcome::default();
    tx.send(client.message(open))
        .await
        .map_err(|e| CallError::Connect(e.to_string()))?;

    let total = channels[0].len();
    let frame = (RATE as u64 * options.frame_ms / 1000).max(1) as usize;
    let mut sent = if options.probe { total } else { 0 };
    let mut opened = false;
    let mut closing = false;
    let mut next_analyze = options.analyze_every;
    let mut ping = tokio::time::interval_at(
        tokio::time::Instant::now() + Duration::from_secs(1),
        Duration::from_secs(5),
    );
    let pace = |samples: usize| {
        if options.speed > 0.0 {
            Duration::from_secs_f64(samples as f64 / RATE as f64 / options.speed)
        } else {
            Duration::ZERO
        }
    };
    let mut deadline: Option<Instant> = None;
    loop {
        // The next thing to do on our side: a frame when opened and audio is left, else close.
        let next_frame_at = started + pace(sent);
        let wait = if opened && !closing {
            next_frame_at.saturating_duration_since(Instant::now())
        } else {
            Duration::from_secs(3600)
        };
        if let Some(d) = deadline {
            if Instant::now() > d {
                return Err(CallError::Protocol("no closed within the timeout".into()));
            }
        }
        tokio::select! {
            incoming = rx.next() => {
                let msg = match incoming {
                    Some(Ok(m)) => m,
                    Some(Err(e)) => return Err(CallError::Connect(e.to_string())),
                    None => break,
                };
                match msg {
                    Message::Text(text) => {
                        let bad = |e: serde_json::Error| CallError::Protocol(format!("bad server message: {e}"));
                        let message: Value = serde_json::from_str(&text).map_err(bad)?;
                        let envelope = ServerEnvelope::deserialize(&message).map_err(bad)?;
                        client.serverseq = envelope.seq;
                        let received = Received { at: started.elapsed(), message };
                        on_message(&received);
                        outcome.messages.push(received);
                        match envelope.message {
                            ServerMessage::Opened(_) => opened = true,
                            ServerMessage::Disconnect(_) if !closing => {
                                closing = true;
                                deadline = Some(Instant::now() + options.close_timeout);
                                let close = client.close("disconnect");
                                tx.send(close).await.map_err(|e| CallError::Connect(e.to_string()))?;
                            }
                            _ => {}
                        }
                    }
                    Message::Close(frame) => {
                        outcome.close = Some(frame.map_or((1005, String::new()), |f| {
                            (u16::from(f.code), f.reason.to_string())
                        }));
                        break;
                    }
                    _ => {}
                }
            }
            _ = ping.tick(), if opened && !closing => {
                let ping = ClientMessage::Ping(PingParams::default());
                tx.send(client.message(ping)).await.map_err(|e| CallError::Connect(e.to_string()))?;
            }
            _ = tokio::time::sleep(wait), if opened && !closing => {
                if sent >= total {
                    closing = true;
                    deadline = Some(Instant::now() + options.close_timeout);
                    let close = client.close("end");
                    tx.send(close).await.map_err(|e| CallError::Connect(e.to_string()))?;
                    continue;
                }
                let end = (sent + frame).min(total);
                let bytes = interleave(channels, sent, end, options.format);
                tx.send(Message::binary(bytes)).await.map_err(|e| CallError::Connect(e.to_string()))?;
                sent = end;
                client.position = sent as f64 / RATE as f64;
                outcome.frames.push((started.elapsed(), client.position));
                if let Some(at) = next_analyze {
                    if client.position >= at {
                        tx.send(client.message(ClientMessage::Analyze(Empty {}))).await.map_err(|e| CallError::Connect(e.to_string()))?;
                        outcome.analyze_sent += 1;
                        next_analyze = options.analyze_every.map(|every| at + every);
                    }
                }
            }
        }
    }
    let _ = tx.close().await;
    outcome.audio_secs = if options.probe {
        0.0
    } else {
        sent as f64 / RATE as f64
    };
    if outcome.close.is_none() {
        outcome.close = Some((u16::from(CloseCode::Abnormal), String::new()));
    }
    Ok(outcome)
}

/// Reads an audio file into 8 kHz 16-bit channels.
pub fn load_audio(path: &std::path::Path) -> Result<Vec<Vec<i16>>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let ext = path.extension().and_then(|e| e.to_str());
    let audio = callstream_actors::audio::decode::decode(bytes, ext, RATE)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(audio
        .channels
        .iter()
        .map(|c| {
            c.iter()
                .map(|&v| (v * 32768.0).round().clamp(-32768.0, 32767.0) as i16)
                .collect()
        })
        .collect())
}
