//! `WSS /api/callstream/ws` against a real server: the signed handshake (ours and an
//! independent signer), the protocol's replies and every disconnect and close path, final
//! transcripts of the Genesys call on both channels, analyze coalescing, quota exhaustion at
//! open and mid-call, and billing rows that add up to the audio streamed.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

use callstream_actors::usage::{UsageKind, UsageSource};
use common::upstream::{FakeUpstream, Reply};
use common::{usage_events, Env, Server};

const INTENT: &str = r#"{"intents": [{"intent": "order_status", "confidence": "high"}], "reasoning": "The caller asks about an order."}"#;
const CALL: &str = "fixtures/genesys-test-transcript-connector.wav";
const QUOTA_INFO: &str = "Transcription quota exhausted for this plan";

fn root() -> PathBuf {
    callstream_actors::package_dir(env!("CARGO_MANIFEST_DIR"))
}

fn fixture(rel: &str) -> PathBuf {
    root().join(rel)
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A server with a scripted intent provider and fast quota checks and usage writes.
async fn setup(extra: &[(&'static str, &str)]) -> (FakeUpstream, Env, Server) {
    let fake = FakeUpstream::start().await;
    fake.set_default(Reply::Text(vec![INTENT], (40, 20)));
    let mut vars = fake.env();
    vars.push(("CALLSTREAM_CALLS__QUOTA_CHECK_MS", "1000".into()));
    vars.push(("CALLSTREAM_CALLS__BILLING_FLUSH_MS", "1000".into()));
    vars.push(("CALLSTREAM_CALLS__DISCONNECT_GRACE_MS", "1000".into()));
    vars.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
    let env = Env::with(vars);
    let server = env.serve();
    (fake, env, server)
}

/// An organisation (plan `free` unless given) with a connector: (org id, client id, secret).
fn connector(env: &Env, plan: Option<&str>) -> (String, String, String) {
    let mut args = vec!["org", "create", "Acme"];
    if let Some(p) = plan {
        args.extend(["--plan", p]);
    }
    let org = env.cli_json(&args)["id"].as_str().unwrap().to_owned();
    let c = env.cli_json(&["connector", "create", &org]);
    (
        org,
        c["connector"]["client_id"].as_str().unwrap().to_owned(),
        c["client_secret"].as_str().unwrap().to_owned(),
    )
}

fn ws_url(server: &Server) -> String {
    format!("ws://{}/api/callstream/ws", server.addr)
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// The AudioHook headers of an upgrade request, signed by us with `secret` at `created`.
fn signed(server: &Server, client_id: &str, secret: &str, created: i64) -> Vec<(String, String)> {
    common::audiohook::signed_headers(server, client_id, secret, created)
}

async fn connect(server: &Server, headers: &[(String, String)]) -> Socket {
    let mut request = ws_url(server).into_client_request().unwrap();
    for (k, v) in headers {
        request.headers_mut().insert(
            tokio_tungstenite::tungstenite::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    tokio_tungstenite::connect_async(request).await.unwrap().0
}

#[derive(Debug, PartialEq)]
enum Frame {
    Text(Value),
    Close(u16, String),
}

async fn next(ws: &mut Socket) -> Frame {
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(20), ws.next())
            .await
            .expect("the server answers within 20 s");
        match msg {
            Some(Ok(Message::Text(t))) => return Frame::Text(serde_json::from_str(&t).unwrap()),
            Some(Ok(Message::Close(f))) => {
                return f.map_or(Frame::Close(1005, String::new()), |f| {
                    Frame::Close(u16::from(f.code), f.reason.to_string())
                })
            }
            Some(Ok(_)) => continue,
            Some(Err(_)) | None => return Frame::Close(1006, String::new()),
        }
    }
}

async fn next_text(ws: &mut Socket) -> Value {
    match next(ws).await {
        Frame::Text(v) => v,
        other => panic!("expected a message, got {other:?}"),
    }
}

/// A client that numbers its messages.
struct Client {
    id: String,
    seq: u64,
    serverseq: u64,
}

impl Client {
    /// A client for the session named in `headers`.
    fn of(headers: &[(String, String)]) -> Self {
        let id = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("audiohook-session-id"))
            .map_or_else(|| uuid::Uuid::new_v4().to_string(), |(_, v)| v.clone());
        Self {
            id,
            seq: 0,
            serverseq: 0,
        }
    }

    async fn send(&mut self, ws: &mut Socket, kind: &str, parameters: Value) {
        self.seq += 1;
        let m = json!({"version":"2","id":self.id,"type":kind,"seq":self.seq,
            "serverseq":self.serverseq,"position":"PT0S","parameters":parameters});
        ws.send(Message::text(m.to_string())).await.unwrap();
    }

    async fn recv(&mut self, ws: &mut Socket) -> Value {
        let v = next_text(ws).await;
        self.serverseq = v["seq"].as_u64().unwrap();
        v
    }
}

fn open_params(media: Value) -> Value {
    json!({"organizationId": uuid::Uuid::new_v4().to_string(),
        "conversationId": uuid::Uuid::new_v4().to_string(),
        "participant": {"id": uuid::Uuid::new_v4().to_string(), "ani": "+15550100", "aniName": "", "dnis": "+15550199"},
        "media": media, "language": "en-US"})
}

fn stereo_pcmu() -> Value {
    json!([{"type":"audio","format":"PCMU","channels":["external","internal"],"rate":8000}])
}

/// Runs `callstream call --json FILE` against `server` with a connector's credentials.
fn call(
    env: &Env,
    server: &Server,
    file: &str,
    client_id: &str,
    secret: &str,
    extra: &[&str],
) -> std::process::Output {
    let url = server.url("");
    let mut args = vec![
        "--json", "call", file, "--url", &url, "--key", client_id, "--secret", secret,
    ];
    args.extend_from_slice(extra);
    env.cli(&args)
}

/// Lines of `callstream call --json` (one server message each).
fn messages(stdout: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn of_type<'a>(messages: &'a [Value], kind: &'a str) -> Vec<&'a Value> {
    messages.iter().filter(|m| m["type"] == kind).collect()
}

/// The first `secs` seconds of the fixture call as interleaved stereo PCMU, as AudioHook sends it
/// (the WAV's data chunk is exactly that).
fn call_pcmu(secs: f64) -> Vec<u8> {
    let bytes = std::fs::read(fixture(CALL)).unwrap();
    let data = bytes.windows(4).position(|w| w == b"data").unwrap() + 8;
    let len = ((secs * 16_000.0) as usize).min(bytes.len() - data);
    bytes[data..data + len].to_vec()
}

/// Samples per channel of the fixture call, from its WAV header (8-bit PCMU, two channels).
fn call_samples() -> u64 {
    let bytes = std::fs::read(fixture(CALL)).unwrap();
    let data = bytes.windows(4).position(|w| w == b"data").unwrap();
    let len = u32::from_le_bytes(bytes[data + 4..data + 8].try_into().unwrap());
    u64::from(len) / 2
}

// The CLI runs block a worker; the scripted provider needs another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_genesys_call_gives_final_transcripts_on_both_channels_and_bills_exactly_its_audio() {
    let (_fake, env, server) = setup(&[]).await;
    let (org, client_id, secret) = connector(&env, None);
    let out = call(
        &env,
        &server,
        fixture(CALL).to_str().unwrap(),
        &client_id,
        &secret,
        &["--speed", "4"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let all = messages(&out.stdout);
    assert_eq!(all[0]["type"], "opened");
    assert_eq!(all[0]["parameters"]["media"], stereo_pcmu());
    assert_eq!(all.last().unwrap()["type"], "closed");
    // Server messages are numbered 1, 2, 3...
    for (i, m) in all.iter().enumerate() {
        assert_eq!(m["seq"], i as u64 + 1);
        assert_eq!(m["version"], "2");
    }
    let events = of_type(&all, "event");
    let mut per_channel = [Vec::new(), Vec::new()];
    for e in &events {
        let entities = e["parameters"]["entities"].as_array().unwrap();
        assert_eq!(entities.len(), 1);
        assert_eq!(entities[0]["type"], "transcript");
        let d = &entities[0]["data"];
        assert_eq!(d["isFinal"], true);
        assert_eq!(d["id"].as_str().unwrap().len(), 36);
        let secs = |v: &Value| -> f64 {
            let s = v.as_str().unwrap();
            assert!(s.starts_with("PT") && s.ends_with('S'), "{s}");
            s[2..s.len() - 1].parse().unwrap()
        };
        let (offset, duration) = (secs(&d["offset"]), secs(&d["duration"]));
        assert!(offset >= 0.0 && offset + duration <= 71.0, "{d}");
        let alt = &d["alternatives"][0];
        let confidence = alt["confidence"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&confidence));
        assert_eq!(alt["languages"], json!(["en-US"]));
        let display = &alt["interpretations"][0];
        assert_eq!(display["type"], "display");
        let text = display["transcript"].as_str().unwrap().to_owned();
        assert!(!text.is_empty());
        let tokens = display["tokens"].as_array().unwrap();
        assert!(!tokens.is_empty(), "{d}");
        for t in tokens {
            assert_eq!(t["type"], "word");
            let at = secs(&t["offset"]);
            assert!(
                at >= offset - 0.05 && at <= offset + duration + 0.05,
                "{t} in {d}"
            );
        }
        per_channel[d["channelId"].as_u64().unwrap() as usize].push((offset, text));
    }
    for (c, lines) in per_channel.iter().enumerate() {
        assert!(lines.len() >= 5, "channel {c}: {lines:?}");
        assert!(
            lines.windows(2).all(|w| w[0].0 < w[1].0),
            "channel {c} in time order: {lines:?}"
        );
    }
    let channel0: String = per_channel[0]
        .iter()
        .map(|l| l.1.to_lowercase() + " ")
        .collect();
    let channel1: String = per_channel[1]
        .iter()
        .map(|l| l.1.to_lowercase() + " ")
        .collect();
    assert!(
        channel0.contains("thanks for contacting the store"),
        "{channel0}"
    );
    assert!(channel1.contains("recent order"), "{channel1}");

    // Billing: the call's running total (written every second, and at the end) is its samples,
    // in whole milliseconds, in one ledger row.
    server.stop();
    let rows: Vec<_> = usage_events(&env.data_dir(), &org)
        .into_iter()
        .filter(|e| e.kind == UsageKind::AudioMs)
        .collect();
    assert!(rows
        .iter()
        .all(|e| e.source == UsageSource::Callstream && e.key_id == client_id));
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert!(rows[0].call_id.is_some());
    let billed: u64 = rows.iter().map(|e| e.amount).sum();
    assert_eq!(billed, call_samples() / 8);
}

// The CLI runs block a worker; the scripted provider needs another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn l16_mono_calls_and_probes() {
    let (_fake, env, server) = setup(&[]).await;
    let (org, client_id, secret) = connector(&env, None);
    let out = call(
        &env,
        &server,
        fixture("fixtures/formats/pcm8-mono-8k.wav")
            .to_str()
            .unwrap(),
        &client_id,
        &secret,
        &["--speed", "0", "--format", "l16"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let all = messages(&out.stdout);
    assert_eq!(
        all[0]["parameters"]["media"],
        json!([{"type":"audio","format":"L16","channels":["external"],"rate":8000}])
    );
    let events = of_type(&all, "event");
    assert!(!events.is_empty());
    assert!(events
        .iter()
        .all(|e| e["parameters"]["entities"][0]["data"]["channelId"] == 0));
    let used = env.audio_used(&org);

    // A probe opens and closes and bills nothing.
    let out = env.cli(&[
        "--json",
        "call",
        "-",
        "--probe",
        "--url",
        &server.url(""),
        "--key",
        &client_id,
        "--secret",
        &secret,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let kinds: Vec<_> = messages(&out.stdout)
        .iter()
        .map(|m| m["type"].clone())
        .collect();
    assert_eq!(kinds, ["opened", "closed"]);
    let after = env.audio_used(&org);
    assert_eq!(used, after);
    assert!((used - 3.275).abs() < 0.01, "{used}");
}

// The CLI runs block a worker; the scripted provider needs another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_credentials_close_with_4401_before_any_message() {
    let (_fake, env, server) = setup(&[]).await;
    let (_, client_id, secret) = connector(&env, None);
    let (_, other_id, other_secret) = connector(&env, None);
    let t = now();
    let mut cases: Vec<(&str, Vec<(String, String)>)> = vec![
        ("no headers", vec![]),
        (
            "wrong secret",
            signed(&server, &client_id, &other_secret, t),
        ),
        (
            "unknown connector",
            signed(&server, "cc_00000000000000000000000000000000", &secret, t),
        ),
        ("too old", signed(&server, &client_id, &secret, t - 60)),
        (
            "from the future",
            signed(&server, &client_id, &secret, t + 60),
        ),
    ];
    let mut unsigned = signed(&server, &client_id, &secret, t);
    unsigned.retain(|(k, _)| !k.starts_with("signature"));
    cases.push(("unsigned", unsigned));
    let mut no_key = signed(&server, &client_id, &secret, t);
    no_key.retain(|(k, _)| k != "x-api-key");
    cases.push(("no key", no_key));
    let mut tampered = signed(&server, &client_id, &secret, t);
    tampered[2].1 = uuid::Uuid::new_v4().to_string();
    cases.push(("tampered session id", tampered));
    let mut swapped = signed(&server, &client_id, &secret, t);
    swapped[3].1 = other_id.clone();
    cases.push(("key of another connector", swapped));
    // A valid request works once; replayed, it is refused.
    let good = signed(&server, &client_id, &secret, t);
    let headers = good.clone();
    let mut ws = connect(&server, &headers).await;
    let mut c = Client::of(&headers);
    c.send(&mut ws, "open", open_params(stereo_pcmu())).await;
    assert_eq!(c.recv(&mut ws).await["type"], "opened");
    drop(ws);
    cases.push(("replayed", good));
    for (name, headers) in cases {
        let mut ws = connect(&server, &headers).await;
        assert_eq!(
            next(&mut ws).await,
            Frame::Close(4401, "unauthorized".into()),
            "{name}"
        );
    }
    // A revoked connector, and one whose organisation is gone.
    env.cli_json(&["connector", "revoke", &client_id]);
    let mut ws = connect(&server, &signed(&server, &client_id, &secret, now())).await;
    assert_eq!(
        next(&mut ws).await,
        Frame::Close(4401, "unauthorized".into()),
        "revoked"
    );
    let (gone, gone_id, gone_secret) = connector(&env, None);
    env.cli_json(&["org", "delete", &gone]);
    let mut ws = connect(&server, &signed(&server, &gone_id, &gone_secret, now())).await;
    assert_eq!(
        next(&mut ws).await,
        Frame::Close(4401, "unauthorized".into()),
        "org deleted"
    );
    // The other connector of a live organisation still opens.
    let headers = signed(&server, &other_id, &other_secret, now());
    let mut ws = connect(&server, &headers).await;
    let mut c = Client::of(&headers);
    c.send(&mut ws, "open", open_params(stereo_pcmu())).await;
    assert_eq!(c.recv(&mut ws).await["type"], "opened");
}

// The CLI runs block a worker; the scripted provider needs another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_independent_rfc_9421_signer_is_accepted() {
    let (_fake, env, server) = setup(&[]).await;
    let (_, client_id, secret) = connector(&env, None);
    let pydeps = common::pydeps();
    let sign = |secret: &str| -> Vec<(String, String)> {
        let out = std::process::Command::new("python3")
            .arg(fixture("tests/support/sign_audiohook.py"))
            .args([&ws_url(&server), &client_id, secret])
            .env("PYTHONPATH", &pydeps)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "the signer runs (scripts/setup.sh --test installs it): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let headers: serde_json::Map<String, Value> = serde_json::from_slice(&out.stdout).unwrap();
        headers
            .into_iter()
            .map(|(k, v)| (k, v.as_str().unwrap().to_owned()))
            .collect()
    };
    let headers = sign(&secret);
    let session = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("audiohook-session-id"))
        .unwrap()
        .1
        .clone();
    let mut ws = connect(&server, &headers).await;
    let mut c = Client::of(&headers);
    assert_eq!(c.id, session);
    c.send(&mut ws, "open", open_params(stereo_pcmu())).await;
    assert_eq!(c.recv(&mut ws).await["type"], "opened");
    c.send(&mut ws, "close", json!({"reason": "end"})).await;
    assert_eq!(c.recv(&mut ws).await["type"], "closed");
    assert_eq!(next(&mut ws).await, Frame::Close(1000, String::new()));
    // The same signer with the wrong secret is refused.
    let wrong = base64_of(&[7u8; 32]);
    let mut ws = connect(&server, &sign(&wrong)).await;
    assert_eq!(
        next(&mut ws).await,
        Frame::Close(4401, "unauthorized".into())
    );
}

fn base64_of(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

// The CLI runs block a worker; the scripted provider needs another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_replies_and_disconnect_paths() {
    let (_fake, env, server) = setup(&[]).await;
    let (_, client_id, secret) = connector(&env, None);
    let fresh = || signed(&server, &client_id, &secret, now());

    // ping -> pong answering its seq, update -> updated, paused/resumed/discarded -> nothing,
    // close -> closed -> 1000.
    let headers = fresh();
    let mut ws = connect(&server, &headers).await;
    let mut c = Client::of(&headers);
    c.send(&mut ws, "open", open_params(stereo_pcmu())).await;
    let opened = c.recv(&mut ws).await;
    assert_eq!(
        (opened["seq"].clone(), opened["clientseq"].clone()),
        (json!(1), json!(1))
    );
    assert_eq!(opened["id"], c.id.as_str());
    c.send(&mut ws, "ping", json!({})).await;
    let pong = c.recv(&mut ws).await;
    assert_eq!(
        (pong["type"].clone(), pong["clientseq"].clone()),
        (json!("pong"), json!(2))
    );
    c.send(&mut ws, "paused", json!({})).await;
    c.send(
        &mut ws,
        "resumed",
        json!({"start": "PT0S", "discarded": "PT2S"}),
    )
    .await;
    c.send(
        &mut ws,
        "discarded",
        json!({"start": "PT2S", "discarded": "PT1S"}),
    )
    .await;
    c.send(&mut ws, "update", json!({"language": "en-GB"}))
        .await;
    let updated = c.recv(&mut ws).await;
    assert_eq!(
        (updated["type"].clone(), updated["clientseq"].clone()),
        (json!("updated"), json!(6))
    );
    ws.send(Message::binary(vec![0xFFu8; 3200])).await.unwrap();
    c.send(&mut ws, "close", json!({"reason": "end"})).await;
    let closed = c.recv(&mut ws).await;
    assert_eq!(closed["type"], "closed");
    assert_eq!(next(&mut ws).await, Frame::Close(1000, String::new()));

    // No supported media: disconnect (reason error), then 1000 once the client closes...
    let headers = fresh();
    let mut ws = connect(&server, &headers).await;
    let mut c = Client::of(&headers);
    let pcma = json!([{"type":"audio","format":"PCMA","channels":["external"],"rate":8000},
        {"type":"audio","format":"PCMU","channels":["external"],"rate":16000}]);
    c.send(&mut ws, "open", open_params(pcma.clone())).await;
    let d = c.recv(&mut ws).await;
    assert_eq!(d["type"], "disconnect");
    assert_eq!(d["parameters"]["reason"], "error");
    assert!(d["parameters"]["info"]
        .as_str()
        .unwrap()
        .contains("PCMU or L16"));
    c.send(&mut ws, "close", json!({"reason": "disconnect"}))
        .await;
    assert_eq!(c.recv(&mut ws).await["type"], "closed");
    assert_eq!(next(&mut ws).await, Frame::Close(1000, String::new()));
    // ...or after the grace period when it does not.
    let headers = fresh();
    let mut ws = connect(&server, &headers).await;
    let mut c = Client::of(&headers);
    c.send(&mut ws, "open", open_params(pcma)).await;
    assert_eq!(c.recv(&mut ws).await["type"], "disconnect");
    assert_eq!(next(&mut ws).await, Frame::Close(1000, String::new()));

    // Protocol errors: a skipped seq, audio before open, a frame that splits a sample.
    for case in ["seq", "early audio", "partial frame", "garbage"] {
        let headers = fresh();
        let mut ws = connect(&server, &headers).await;
        let mut c = Client::of(&headers);
        match case {
            "seq" => {
                c.send(&mut ws, "open", open_params(stereo_pcmu())).await;
                c.recv(&mut ws).await;
                c.seq += 1;
                c.send(&mut ws, "ping", json!({})).await;
            }
            "early audio" => ws.send(Message::binary(vec![0u8; 320])).await.unwrap(),
            "partial frame" => {
                c.send(&mut ws, "open", open_params(stereo_pcmu())).await;
                c.recv(&mut ws).await;
                ws.send(Message::binary(vec![0u8; 321])).await.unwrap();
            }
            _ => ws.send(Message::text("{not json")).await.unwrap(),
        }
        let d = c.recv(&mut ws).await;
        assert_eq!(
            (d["type"].as_str(), d["parameters"]["reason"].as_str()),
            (Some("disconnect"), Some("error")),
            "{case}: {d}"
        );
        assert_eq!(
            next(&mut ws).await,
            Frame::Close(1000, String::new()),
            "{case}"
        );
    }
}

// The CLI runs block a worker; the scripted provider needs another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn analyze_requests_during_a_run_collapse_into_one_follow_up() {
    // Runs may start back to back here (their spacing is the intent actor's own test).
    let (fake, env, server) = setup(&[("CALLSTREAM_CALLS__ANALYZE_INTERVAL_MS", "100")]).await;
    fake.set_delay(Duration::from_millis(1000));
    let (org, client_id, secret) = connector(&env, None);
    let headers = signed(&server, &client_id, &secret, now());
    let mut ws = connect(&server, &headers).await;
    let mut c = Client::of(&headers);
    c.send(&mut ws, "open", open_params(stereo_pcmu())).await;
    c.recv(&mut ws).await;
    // Before anyone has spoken: the fixed answer, without asking the model.
    c.send(&mut ws, "analyze", json!({})).await;
    let first = c.recv(&mut ws).await;
    assert_eq!(first["type"], "intent_update");
    assert_eq!(
        first["parameters"]["intent"]["intents"],
        json!([{"intent": "other", "confidence": "low"}])
    );
    assert!(fake.seen().is_empty(), "the model was not asked");
    // Speech (the call's first 12 s, sent at once); once a transcript is back, one analyze
    // request starts a run, and a burst of five comes while that run is with the model.
    // (Requests that come before a run has started are answered by that run.)
    for frame in call_pcmu(12.0).chunks(3200) {
        ws.send(Message::binary(frame.to_vec())).await.unwrap();
    }
    while c.recv(&mut ws).await["type"] != "event" {}
    c.send(&mut ws, "analyze", json!({})).await;
    fake.until_arrived(1).await;
    for _ in 0..5 {
        c.send(&mut ws, "analyze", json!({})).await;
    }
    let mut updates = 0;
    while updates < 2 {
        let u = c.recv(&mut ws).await;
        if u["type"] == "event" {
            continue;
        }
        assert_eq!(u["type"], "intent_update");
        assert_eq!(
            u["parameters"]["intent"],
            serde_json::from_str::<Value>(INTENT).unwrap()
        );
        updates += 1;
    }
    // Nothing more comes: the pong answers the next message.
    c.send(&mut ws, "ping", json!({})).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    loop {
        let m = c.recv(&mut ws).await;
        if m["type"] != "event" {
            assert_eq!(m["type"], "pong");
            break;
        }
    }
    assert_eq!(fake.seen().len(), 2, "exactly one run and one follow-up");
    // Each run's tokens (40 + 20, as the provider counts them) are billed to the organisation.
    let tokens = env.cli_json(&["usage", &org])["chat_tokens"]["used"].clone();
    assert_eq!(tokens, json!(120));
    let prompt = fake.seen()[0].body["messages"][1]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        prompt.contains("Customer: ") || prompt.contains("Agent: "),
        "{prompt}"
    );

    // With audio, the analysis reads the transcript so far, labelled by leg; a failed
    // analysis is answered with an error and the call goes on.
    fake.set_delay(Duration::ZERO);
    fake.push(Reply::Status(500, "overloaded"));
    let out = call(
        &env,
        &server,
        fixture(CALL).to_str().unwrap(),
        &client_id,
        &secret,
        &["--speed", "4", "--analyze-every", "30"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let all = messages(&out.stdout);
    let updates = of_type(&all, "intent_update");
    assert!(!updates.is_empty());
    assert_eq!(updates[0]["parameters"]["intent"], Value::Null);
    assert!(updates[0]["parameters"]["error"].as_str().is_some());
    let seen = fake.seen();
    let last = seen.last().unwrap().body["messages"][1]["content"]
        .as_str()
        .unwrap();
    assert!(
        last.contains("Customer: ") && last.contains("Agent: "),
        "{last}"
    );
}

// The CLI runs block a worker; the scripted provider needs another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_quota_disconnects_at_open_and_mid_call() {
    let (_fake, env, server) = setup(&[
        ("CALLSTREAM_PLANS__FREE__AUDIO_MINUTES_PER_MONTH", "1"),
        ("CALLSTREAM_PLANS__TEAM__AUDIO_MINUTES_PER_MONTH", "0"),
    ])
    .await;
    // At open.
    let (_, client_id, secret) = connector(&env, Some("team"));
    let out = call(
        &env,
        &server,
        fixture(CALL).to_str().unwrap(),
        &client_id,
        &secret,
        &["--speed", "4"],
    );
    assert_eq!(out.status.code(), Some(2));
    let kinds: Vec<_> = messages(&out.stdout)
        .iter()
        .map(|m| m["type"].clone())
        .collect();
    assert_eq!(kinds, ["disconnect", "closed"]);
    let d = &messages(&out.stdout)[0];
    assert_eq!(
        d["parameters"],
        json!({"reason": "error", "info": QUOTA_INFO})
    );

    // Mid-call: one minute of quota, a 70.8 s call streamed 8x, leased a second at a time.
    let (org, client_id, secret) = connector(&env, None);
    let out = call(
        &env,
        &server,
        fixture(CALL).to_str().unwrap(),
        &client_id,
        &secret,
        &["--speed", "8"],
    );
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let all = messages(&out.stdout);
    let d = of_type(&all, "disconnect");
    assert_eq!(d.len(), 1);
    assert_eq!(d[0]["parameters"]["info"], QUOTA_INFO);
    assert!(
        !of_type(&all, "event").is_empty(),
        "transcripts came before the quota ran out"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("socket closed with 1000"));
    // Audio is served under leases of the pool: the call gets the minute, not a second more.
    let used = env.audio_used(&org);
    assert!((used - 60.0).abs() < 1e-9, "{used}");
}

// The CLI runs block a worker; the scripted provider needs another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_client_is_timed_out() {
    let (_fake, env, server) = setup(&[("CALLSTREAM_CALLS__IDLE_TIMEOUT_MS", "1000")]).await;
    let (org, client_id, secret) = connector(&env, None);
    // Nothing at all after the upgrade.
    let headers = signed(&server, &client_id, &secret, now());
    let mut ws = connect(&server, &headers).await;
    assert_eq!(
        next(&mut ws).await,
        Frame::Close(1000, "idle timeout".into())
    );
    // Pings keep an open call alive; silence ends it.
    let headers = signed(&server, &client_id, &secret, now());
    let mut ws = connect(&server, &headers).await;
    let mut c = Client::of(&headers);
    c.send(&mut ws, "open", open_params(stereo_pcmu())).await;
    assert_eq!(c.recv(&mut ws).await["type"], "opened");
    ws.send(Message::binary(vec![0xFFu8; 3200])).await.unwrap();
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        c.send(&mut ws, "ping", json!({})).await;
        assert_eq!(c.recv(&mut ws).await["type"], "pong");
    }
    assert_eq!(
        next(&mut ws).await,
        Frame::Close(1000, "idle timeout".into())
    );
    // The 200 ms it streamed are billed.
    let used = env.audio_used(&org);
    assert!((used - 0.2).abs() < 1e-9, "{used}");
}

/// The PCMU samples of a mono mu-law fixture (its data chunk).
fn mono_pcmu(rel: &str) -> Vec<u8> {
    let bytes = std::fs::read(fixture(rel)).unwrap();
    let data = bytes.windows(4).position(|w| w == b"data").unwrap();
    let len = u32::from_le_bytes(bytes[data + 4..data + 8].try_into().unwrap()) as usize;
    bytes[data + 8..data + 8 + len].to_vec()
}

/// Streams `speech` on the external channel (the internal one silent) in 200 ms frames and
/// waits for final transcripts until one holds `marker`; returns their text and the last
/// one's language tags.
async fn say(ws: &mut Socket, c: &mut Client, speech: &[u8], marker: &str) -> (String, Value) {
    const SILENCE: u8 = 0xFF;
    for chunk in speech.chunks(1600) {
        let frame: Vec<u8> = chunk.iter().flat_map(|&s| [s, SILENCE]).collect();
        ws.send(Message::binary(frame)).await.unwrap();
    }
    // A second of silence ends the utterance.
    ws.send(Message::binary(vec![SILENCE; 16_000]))
        .await
        .unwrap();
    let mut texts = Vec::new();
    loop {
        let m = c.recv(ws).await;
        if m["type"] != "event" {
            continue;
        }
        let alt = &m["parameters"]["entities"][0]["data"]["alternatives"][0];
        texts.push(
            alt["interpretations"][0]["transcript"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
        // The sentence may come as more than one utterance.
        let text = texts.join(" ");
        if text.to_lowercase().contains(marker) {
            return (text, alt["languages"].clone());
        }
        assert!(texts.len() < 6, "no end of the sentence in {texts:?}");
    }
}

// The scripted provider needs a worker of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn languages_are_offered_as_bcp_47_tags_and_followed_mid_call() {
    let (_fake, env, server) = setup(&[]).await;
    let (_, client_id, secret) = connector(&env, None);
    let headers = signed(&server, &client_id, &secret, now());
    let mut ws = connect(&server, &headers).await;
    let mut c = Client::of(&headers);
    let mut open = open_params(stereo_pcmu());
    open["language"] = json!("es-ES");
    open["supportedLanguages"] = json!(true);
    c.send(&mut ws, "open", open).await;
    let opened = c.recv(&mut ws).await;
    assert_eq!(opened["type"], "opened");
    let tags: Vec<String> =
        serde_json::from_value(opened["parameters"]["supportedLanguages"].clone()).unwrap();
    // Genesys checks each tag against ^[a-z]{2,3}-[A-Za-z]{2,3}$.
    for tag in &tags {
        let (lang, region) = tag.split_once('-').unwrap();
        assert!(
            (2..=3).contains(&lang.len())
                && lang.bytes().all(|b| b.is_ascii_lowercase())
                && (2..=3).contains(&region.len())
                && region.bytes().all(|b| b.is_ascii_alphabetic()),
            "{tag}"
        );
    }
    for tag in [
        "en-US", "en-GB", "es-ES", "es-MX", "de-DE", "fr-FR", "fr-CA", "pt-BR",
    ] {
        assert!(tags.iter().any(|t| t == tag), "{tag} in {tags:?}");
    }

    let (spanish, languages) = say(
        &mut ws,
        &mut c,
        &mono_pcmu("fixtures/speech-cases/es.wav"),
        "quiero",
    )
    .await;
    assert_eq!(languages, json!(["es-ES"]));
    assert!(spanish.to_lowercase().contains("gracias"), "{spanish}");

    // The agent switches the call to German.
    c.send(&mut ws, "update", json!({"language": "de-DE"}))
        .await;
    assert_eq!(c.recv(&mut ws).await["type"], "updated");
    let (german, languages) = say(
        &mut ws,
        &mut c,
        &mono_pcmu("fixtures/speech-cases/de.wav"),
        "bestellung",
    )
    .await;
    assert_eq!(languages, json!(["de-DE"]));
    assert!(german.to_lowercase().contains("möchte"), "{german}");

    c.send(&mut ws, "close", json!({"reason": "end"})).await;
    loop {
        if c.recv(&mut ws).await["type"] == "closed" {
            break;
        }
    }
}

/// Admission control on the real engine: an instance at its ceiling of live calls
/// (`calls.max_calls_per_instance`) refuses another organisation's new call before the upgrade
/// (503 `at_capacity` with Retry-After), answers `full` on `/readyz`, counts the refusal in
/// `/metrics`, on the refused organisation's live page and in its live feed, and keeps
/// transcribing the call in progress; once that call ends the next one is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_instance_refuses_a_new_call_before_the_upgrade_and_keeps_its_calls() {
    let (_fake, env, server) = setup(&[("CALLSTREAM_CALLS__MAX_CALLS_PER_INSTANCE", "1")]).await;
    let a_org = env.org_on_plan("Calling", "team");
    let (a_id, a_secret) = env.connector(&a_org);
    let b_org = env.org_on_plan("Refused", "team");
    let (b_id, b_secret) = env.connector(&b_org);
    let password = "a long and good password";
    let client = common::dashboard::user_and_client(&env, &b_org, "b@example.com", password);
    let cookie =
        common::dashboard::session_cookie(&client, &server, "b@example.com", password).await;
    let mut feed = client
        .get(server.url("/dashboard/calls/events"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(feed.status(), 200);
    let readyz = server.url("/readyz");
    let ready = || {
        let url = readyz.clone();
        async move {
            let r = reqwest::get(url).await.unwrap();
            let status = r.status().as_u16();
            let body: Value = r.json().await.unwrap();
            (status, body["status"].clone(), body["live_calls"].clone())
        }
    };
    assert_eq!(ready().await, (200, json!("ready"), json!(0)));

    // A's call opens and streams the first part of the Genesys call.
    let headers = signed(&server, &a_id, &a_secret, now());
    let mut ws = connect(&server, &headers).await;
    let mut c = Client::of(&headers);
    c.send(&mut ws, "open", open_params(stereo_pcmu())).await;
    assert_eq!(c.recv(&mut ws).await["type"], "opened");
    let audio = call_pcmu(20.0);
    let (first, rest) = audio.split_at(audio.len() / 2 / 3200 * 3200);
    for frame in first.chunks(3200) {
        ws.send(Message::binary(frame.to_vec())).await.unwrap();
    }

    // The instance is full: B's call is refused before the upgrade.
    assert_eq!(ready().await, (503, json!("full"), json!(1)));
    let mut request = ws_url(&server).into_client_request().unwrap();
    for (k, v) in signed(&server, &b_id, &b_secret, now()) {
        request.headers_mut().insert(
            tokio_tungstenite::tungstenite::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    match tokio_tungstenite::connect_async(request).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            assert_eq!(resp.status(), 503);
            let retry: u64 = resp.headers()["retry-after"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            assert!(retry >= 1, "{retry}");
            let body: Value = serde_json::from_slice(resp.body().as_deref().unwrap()).unwrap();
            assert_eq!(body["error"]["code"], "at_capacity", "{body}");
        }
        other => panic!("expected 503, got {other:?}"),
    }
    assert_eq!(
        common::audiohook::metric(&server, "callstream_calls_refused_at_ceiling_total").await,
        1.0
    );
    // B's live page is told, and shows it when loaded.
    let told = tokio::time::timeout(Duration::from_secs(10), async {
        let mut seen = String::new();
        while let Ok(Some(chunk)) = feed.chunk().await {
            seen.push_str(&String::from_utf8_lossy(&chunk));
            if seen.contains(r#""type":"refused""#) {
                return;
            }
        }
    })
    .await;
    assert!(told.is_ok(), "the live feed did not tell of the refusal");
    let page = client
        .get(server.url("/dashboard/calls"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains(r#"id="refused" data-count="1""#), "{page}");

    // The call in progress is still transcribed to its end.
    for frame in rest.chunks(3200) {
        ws.send(Message::binary(frame.to_vec())).await.unwrap();
    }
    c.send(&mut ws, "close", json!({"reason": "end"})).await;
    let mut transcripts = 0;
    loop {
        let m = c.recv(&mut ws).await;
        match m["type"].as_str() {
            Some("event") => transcripts += 1,
            Some("closed") => break,
            _ => {}
        }
    }
    assert!(transcripts > 0, "the call in progress was transcribed");
    drop(ws);

    // Its place is free once it has ended: B's next call is taken.
    let freed = tokio::time::timeout(Duration::from_secs(20), async {
        while ready().await.0 != 200 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(freed.is_ok(), "the ended call's place was not freed");
    let headers = signed(&server, &b_id, &b_secret, now());
    let mut ws = connect(&server, &headers).await;
    let mut c = Client::of(&headers);
    c.send(&mut ws, "open", open_params(stereo_pcmu())).await;
    assert_eq!(c.recv(&mut ws).await["type"], "opened");
}
