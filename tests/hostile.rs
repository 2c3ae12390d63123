//! Hostile input and overload against the real server: files built to exhaust memory or crash
//! the decoder, garbage in every format, forms with thousands of parts, oversized frames on both
//! WebSockets, clients that stop reading or send their headers slowly, sign-in floods, secrets in
//! logs and MCP URLs aimed at the service's own network. Each test checks the status or close
//! code, that the process is alive afterwards, and where memory is the attack, that its peak
//! resident memory grew by less than a stated bound.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

use common::audiohook::{audiohook_request, message, metric, open, session_id};
use common::dashboard::{sign_in, sign_in_form};
use common::upstream::{FakeUpstream, Reply};
use common::{wav, Env, Server};

/// The most the server's peak resident memory may grow while it refuses or streams the hostile
/// uploads. The largest upload is 90 MB; the old decoder held hours of audio as f32 (6.5 GB
/// for one 10-hour file).
const MEMORY_BOUND_MIB: f64 = 400.0;

fn fixture(rel: &str) -> std::path::PathBuf {
    callstream_actors::package_dir(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// The FLAC fixture, its STREAMINFO saying it holds `secs` seconds (at 44.1 kHz).
fn flac_declaring(secs: u64) -> Vec<u8> {
    let mut f = std::fs::read(fixture("fixtures/formats/flac16-mono-44k.flac")).unwrap();
    assert_eq!(&f[..4], b"fLaC");
    let total = secs * 44_100;
    // STREAMINFO's 36-bit total sample count: the low nibble of byte 13 and bytes 14-17.
    f[21] = (f[21] & 0xF0) | ((total >> 32) as u8 & 0x0F);
    f[22..26].copy_from_slice(&(total as u32).to_be_bytes());
    f
}

async fn upload(server: &Server, key: &str, name: &str, bytes: Vec<u8>) -> (u16, Value) {
    common::upload(server.url("/api/transcribe"), key, name, bytes).await
}

async fn healthy(server: &mut Server) {
    assert!(server.alive(), "the server process is gone");
    let resp = reqwest::get(server.url("/healthz")).await.unwrap();
    assert_eq!(resp.status(), 200);
}

fn team_org(env: &Env) -> (String, String) {
    let org = env.cli_json(&["org", "create", "Hostile", "--plan", "team"]);
    let org_id = org["id"].as_str().unwrap().to_owned();
    let (_, secret) = env.key(&org_id);
    (org_id, secret)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_files_get_clear_answers_and_memory_stays_bounded() {
    // The analyses are not what is attacked here: a scripted provider answers them quickly.
    let fake = FakeUpstream::start().await;
    fake.set_default(Reply::Text(
        vec![
            r#"{"intents": [{"intent": "order_status", "confidence": "high"}], "reasoning": "x"}"#,
        ],
        (10, 10),
    ));
    let env = Env::with(fake.env());
    let mut server = env.serve();
    let (_, key) = team_org(&env);
    let before = server.memory_mib("VmHWM");

    let expect = |status: u16, body: &Value, want: u16, code: &str, what: &str| {
        assert_eq!(status, want, "{what}: {body}");
        assert_eq!(body["error"]["code"], code, "{what}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            !message.contains("panicked") && !message.contains("/root"),
            "{what}: {message}"
        );
    };
    // Sample rates a decoder or a resampler cannot live with, refused before decoding.
    for (rate, frames, what) in [
        (
            4_294_967_291u32,
            1_000usize,
            "a 2 KB WAV at 4,294,967,291 Hz",
        ),
        (1, 200_000, "a 400 KB WAV at 1 Hz"),
        (0, 1_000, "a WAV at 0 Hz"),
    ] {
        let (status, body) = upload(
            &server,
            &key,
            "x.wav",
            wav(1, 1, rate, 16, &vec![0; frames * 2]),
        )
        .await;
        expect(status, &body, 400, "invalid_audio", what);
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("sample rate"),
            "{body}"
        );
    }
    let (status, body) = upload(&server, &key, "x.wav", wav(1, 40, 8_000, 16, &[0; 800])).await;
    expect(status, &body, 400, "invalid_audio", "a WAV of 40 channels");
    // Ten hours declared by the container: refused before a sample is decoded.
    let (status, body) = upload(&server, &key, "long.flac", flac_declaring(36_000)).await;
    expect(status, &body, 413, "audio_too_long", "a FLAC of 10 hours");
    // A WAV header declaring 10 hours of mu-law, with one second of it present.
    let mut long = wav(7, 1, 8_000, 8, &[0xFF; 8_000]);
    let declared = 36_000u32 * 8_000;
    long[4..8].copy_from_slice(&(36 + declared).to_le_bytes());
    long[40..44].copy_from_slice(&declared.to_le_bytes());
    let (status, body) = upload(&server, &key, "long.wav", long).await;
    expect(
        status,
        &body,
        413,
        "audio_too_long",
        "a WAV declaring 10 hours",
    );

    // Damaged and garbage files in every format: a clear 4xx, or the audio that was there.
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut noise = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng as u8
            })
            .collect()
    };
    for entry in std::fs::read_dir(fixture("fixtures/formats")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.ends_with(".sh") {
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        let mut garbled = bytes.clone();
        let middle = garbled.len() / 3;
        let len = (garbled.len() / 3).min(4096);
        garbled[middle..middle + len].copy_from_slice(&noise(len));
        let cases = [
            ("truncated", bytes[..bytes.len() * 2 / 5].to_vec()),
            ("garbled", garbled),
            ("noise", noise(bytes.len().min(50_000))),
        ];
        for (how, data) in cases {
            let (status, body) = upload(&server, &key, &name, data).await;
            assert!(
                status == 200 || status == 400 || status == 415,
                "{how} {name}: {status} {body}"
            );
        }
    }

    // A form of five thousand parts.
    let mut form = reqwest::multipart::Form::new();
    for i in 0..5_000 {
        form = form.text(format!("f{i}"), "x");
    }
    let resp = reqwest::Client::new()
        .post(server.url("/api/transcribe"))
        .header("X-API-Key", &key)
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "invalid_form", "{body}");

    // 3.1 hours of mu-law silence, 90 MB: accepted, streamed through the decoder in bounded
    // memory, and no intent is invented for it.
    let silence = wav(7, 1, 8_000, 8, &vec![0xFF; 90_000_000]);
    let (status, body) = upload(&server, &key, "silence.wav", silence).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["segments"], json!([]));
    assert_eq!(
        body["intent"]["intents"],
        json!([{"intent": "other", "confidence": "low"}])
    );
    assert!(
        (body["duration"].as_f64().unwrap() - 11_250.0).abs() < 0.01,
        "{body}"
    );

    let grown = server.memory_mib("VmHWM") - before;
    println!("peak resident memory grew {grown:.0} MiB (bound {MEMORY_BOUND_MIB} MiB)");
    assert!(grown < MEMORY_BOUND_MIB, "peak memory grew {grown:.0} MiB");
    healthy(&mut server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_headers_and_too_many_connections_are_cut_off() {
    let env = Env::new(&[
        ("CALLSTREAM_SERVER__HEADER_READ_TIMEOUT_MS", "1000"),
        ("CALLSTREAM_SERVER__MAX_CONNECTIONS", "4"),
    ]);
    let mut server = env.serve();
    // A client that sends half a request line and waits is disconnected; /healthz answers
    // meanwhile.
    let mut slow = TcpStream::connect(server.addr).unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    healthy(&mut server).await;
    slow.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 256];
    let n = slow.read(&mut buf).unwrap_or(0);
    assert!(
        n == 0 || String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 408"),
        "{:?}",
        String::from_utf8_lossy(&buf[..n])
    );
    assert!(started.elapsed() < Duration::from_secs(20));
    drop(slow);
    // Four connections held open; the fifth is told 503 and closed.
    let held: Vec<TcpStream> = (0..4)
        .map(|_| TcpStream::connect(server.addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut fifth = TcpStream::connect(server.addr).unwrap();
    fifth
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut answer = String::new();
    let _ = fifth.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer:?}");
    assert!(answer.contains("too_many_connections"), "{answer:?}");
    drop(held);
    // Once they are gone (closed here, or by the header timeout), the server serves again.
    std::thread::sleep(Duration::from_millis(1500));
    healthy(&mut server).await;
}

/// A WebSocket over a socket whose receive buffer is tiny, so a client that does not read
/// stalls the server's writes quickly.
async fn stalled_socket(
    server: &Server,
    request: tokio_tungstenite::tungstenite::handshake::client::Request,
) -> tokio_tungstenite::WebSocketStream<tokio::net::TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(2048).unwrap();
    let stream = socket.connect(server.addr).await.unwrap();
    tokio_tungstenite::client_async(request, stream)
        .await
        .unwrap()
        .0
}

fn realtime_request(
    server: &Server,
    key: &str,
) -> tokio_tungstenite::tungstenite::handshake::client::Request {
    let mut request = format!("ws://{}/api/llm/chat/realtime", server.addr)
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("x-api-key", key.parse().unwrap());
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_realtime_client_that_stops_reading_is_dropped_and_others_are_served() {
    let fake = FakeUpstream::start().await;
    // A long answer in 4 KB pieces, 8 MB in all: far more than a stalled socket's buffers
    // (and the session's queue) hold.
    let piece: &'static str = Box::leak("lorem ipsum ".repeat(340).into_boxed_str());
    fake.set_default(Reply::Text(vec![piece; 2_000], (10, 2_000)));
    let mut vars = fake.env();
    vars.push(("CALLSTREAM_REALTIME__WRITE_TIMEOUT_MS", "1000".into()));
    vars.push(("CALLSTREAM_REALTIME__MAX_SESSIONS_PER_KEY", "1".into()));
    vars.push(("CALLSTREAM_REALTIME__MAX_FRAME_BYTES", "65536".into()));
    let env = Env::with(vars);
    let mut server = env.serve();
    let (_, _, stalled_key) = env.org_with_key("Stalled");
    let (_, _, other_key) = env.org_with_key("Other");

    let mut stalled = stalled_socket(&server, realtime_request(&server, &stalled_key)).await;
    let turn = json!({"type": "message", "return_markdown": false,
        "messages": [{"role": "user", "content": "Tell me everything."}]});
    stalled.send(Message::text(turn.to_string())).await.unwrap();
    // The key may hold one session: a second is refused while the stalled one lives.
    let second = tokio_tungstenite::connect_async(realtime_request(&server, &stalled_key)).await;
    match second {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => assert_eq!(resp.status(), 429),
        other => panic!("a second session was not refused: {other:?}"),
    }
    // Another organisation's chat is answered meanwhile.
    let (status, body) = common::post(
        &reqwest::Client::new(),
        &server.url("/api/llm/chat/completions"),
        &other_key,
        &json!({"messages": [{"role": "user", "content": "hi"}], "return_markdown": true}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // The stalled session is ended (its place is free again) within the write timeout and a
    // little more.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match tokio_tungstenite::connect_async(realtime_request(&server, &stalled_key)).await {
            Ok((mut ws, _)) => {
                // A frame past the limit closes the session with 1009.
                let big = "x".repeat(100_000);
                let _ = ws.send(Message::text(big)).await;
                let next = tokio::time::timeout(Duration::from_secs(10), ws.next()).await;
                match next {
                    Ok(Some(Ok(Message::Close(Some(frame))))) => {
                        assert_eq!(u16::from(frame.code), 1009)
                    }
                    other => panic!("an oversized frame was not refused: {other:?}"),
                }
                break;
            }
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(250)).await
            }
            Err(e) => panic!("the stalled session still holds its place: {e}"),
        }
    }
    drop(stalled);
    healthy(&mut server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_calls_that_stall_probe_or_send_oversized_frames_end_and_are_billed() {
    let env = Env::new(&[
        ("CALLSTREAM_CALLS__WRITE_TIMEOUT_MS", "1000"),
        ("CALLSTREAM_CALLS__OUTBOUND_MESSAGES", "4"),
        ("CALLSTREAM_CALLS__PROBE_TIMEOUT_MS", "1000"),
        ("CALLSTREAM_CALLS__MAX_CALLS_PER_CONNECTOR", "2"),
    ]);
    let mut server = env.serve();
    let org = env.org_on_plan("Calls", "team");
    let (client_id, secret) = env.connector(&org);

    // A client that sends a second of audio, then pings without ever reading the pongs.
    let request = audiohook_request(&server, &client_id, &secret);
    let id = session_id(&request);
    let mut stalled = stalled_socket(&server, request).await;
    stalled
        .send(message(&id, 1, "open", open(false)))
        .await
        .unwrap();
    let opened = tokio::time::timeout(Duration::from_secs(20), stalled.next())
        .await
        .unwrap();
    assert!(matches!(opened, Some(Ok(Message::Text(_)))), "{opened:?}");
    for frame in vec![0xFFu8; 16_000].chunks(3_200) {
        stalled.send(Message::binary(frame.to_vec())).await.unwrap();
    }
    let flood = tokio::spawn(async move {
        for seq in 2.. {
            if stalled
                .send(message(&id, seq, "ping", json!({})))
                .await
                .is_err()
            {
                return;
            }
        }
    });
    // The call is ended and its second of audio billed.
    let deadline = Instant::now() + Duration::from_secs(60);
    while env.audio_used(&org) < 1.0 || metric(&server, "callstream_calls_active").await > 0.0 {
        assert!(
            Instant::now() < deadline,
            "the stalled call is still running"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!((env.audio_used(&org) - 1.0).abs() < 1e-9);
    flood.abort();

    // A probe that is answered and then held open is closed.
    let request = audiohook_request(&server, &client_id, &secret);
    let id = session_id(&request);
    let (mut probe, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    probe
        .send(message(&id, 1, "open", open(true)))
        .await
        .unwrap();
    let mut closed = None;
    while closed.is_none() {
        match tokio::time::timeout(Duration::from_secs(20), probe.next())
            .await
            .unwrap()
        {
            Some(Ok(Message::Close(frame))) => closed = Some(frame),
            Some(Ok(_)) => {}
            other => panic!("the probe was not closed: {other:?}"),
        }
    }
    let frame = closed.unwrap().unwrap();
    assert_eq!(u16::from(frame.code), 1000);

    // A frame past the limit ends the call.
    let request = audiohook_request(&server, &client_id, &secret);
    let id = session_id(&request);
    let (mut big, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    big.send(message(&id, 1, "open", open(false)))
        .await
        .unwrap();
    let _ = big.next().await;
    let _ = big.send(Message::binary(vec![0xFF; 300_000])).await;
    let end = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match big.next().await {
                Some(Ok(Message::Close(frame))) => return frame.map(|f| u16::from(f.code)),
                Some(Err(_)) | None => return None,
                Some(Ok(_)) => {}
            }
        }
    })
    .await;
    assert_eq!(
        end.ok().flatten(),
        Some(1009),
        "an oversized frame did not end the call"
    );
    // Two calls per connector: a third waits for 429. The calls ended above give their places
    // back when they are torn down, which may be just after their clients saw them close: a
    // 429 for the first two is waited out.
    let mut held = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while held.len() < 2 {
        let request = audiohook_request(&server, &client_id, &secret);
        match tokio_tungstenite::connect_async(request).await {
            Ok((socket, _)) => held.push(socket),
            Err(tokio_tungstenite::tungstenite::Error::Http(resp)) if resp.status() == 429 => {
                assert!(
                    Instant::now() < deadline,
                    "an ended call still holds its place"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("a call within the cap was refused: {e:?}"),
        }
    }
    match tokio_tungstenite::connect_async(audiohook_request(&server, &client_id, &secret)).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            assert_eq!(resp.status(), 429);
            assert!(resp.headers().contains_key("retry-after"));
        }
        other => panic!("a third call was not refused: {other:?}"),
    }
    drop(held);
    healthy(&mut server).await;
}

/// A sign-in form: the token in the page, and the cookie that binds it to this browser.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_in_cannot_be_replayed_or_flooded() {
    let env = Env::new(&[]);
    let mut server = env.serve();
    let org = env.cli_json(&["org", "create", "Signin"])["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let client = common::dashboard::user_and_client(
        &env,
        &org,
        "admin@example.com",
        "a long and good password",
    );
    // A form token works once.
    let token = sign_in_form(&client, &server).await;
    let first = sign_in(&client, &server, &token, "admin@example.com", "wrong").await;
    assert_eq!(first.status(), 401);
    let replay = sign_in(
        &client,
        &server,
        &token,
        "admin@example.com",
        "a long and good password",
    )
    .await;
    assert_eq!(replay.status(), 401);
    assert!(replay.text().await.unwrap().contains("expired"));
    // Five attempts a minute per account from this address (one is spent), and after three
    // wrong passwords each attempt waits longer: none of the next four gets a password check
    // past those limits, and the sixth is refused even with the right password.
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let token = sign_in_form(&client, &server).await;
        let r = sign_in(&client, &server, &token, "admin@example.com", "wrong").await;
        statuses.push(r.status().as_u16());
    }
    assert_eq!(statuses[..2], [401, 401], "{statuses:?}");
    assert!(statuses.contains(&429), "{statuses:?}");
    let token = sign_in_form(&client, &server).await;
    let r = sign_in(
        &client,
        &server,
        &token,
        "admin@example.com",
        "a long and good password",
    )
    .await;
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
    // Ten a minute per address, whatever the account: six are spent, so one of the next
    // few (allowing for the time the test takes) is refused.
    let mut statuses = Vec::new();
    for i in 0..8 {
        let token = sign_in_form(&client, &server).await;
        let r = sign_in(
            &client,
            &server,
            &token,
            &format!("user{i}@example.com"),
            "x",
        )
        .await;
        statuses.push(r.status().as_u16());
    }
    assert!(statuses.contains(&401), "{statuses:?}");
    assert!(statuses.contains(&429), "{statuses:?}");
    healthy(&mut server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_stay_out_of_logs_and_the_data_directory_is_private() {
    // The chat's model is a scripted upstream; the MCP server at 127.0.0.1:9 is refused.
    let fake = FakeUpstream::start().await;
    fake.set_default(Reply::Text(vec!["ok"], (5, 1)));
    let mut vars = fake.env();
    vars.push(("CALLSTREAM_LLM__MCP_ALLOW", "[]".into()));
    let env = Env::with(vars);
    let log = env.dir.path().join("server.log");
    let mut server = env.serve_logged(&log);
    let org = env.cli_json(&["org", "create", "Secrets"])["id"]
        .as_str()
        .unwrap()
        .to_owned();
    // Through the admin socket, while the server holds the database.
    env.create_user(&org, "a@example.com", "hunter2-but-much-longer");
    env.cli_json(&[
        "org",
        "set-mcp",
        &org,
        "--url",
        "https://mcp.example.com/mcp",
        "--header",
        "Authorization=Bearer tok-very-secret-4321",
    ]);
    // Credentials in the MCP URL itself.
    env.cli_json(&[
        "org",
        "set-mcp",
        &org,
        "--url",
        "https://bob:pw-in-url-8765@127.0.0.1:9/mcp?token=tok-in-url-5678",
    ]);
    let (_, key) = env.key(&org);
    let (status, _) = common::post(
        &reqwest::Client::new(),
        &server.url("/api/llm/chat/completions"),
        &key,
        &json!({"messages": [{"role": "user", "content": "hi"}], "return_markdown": false, "max_tokens": 4}),
    )
    .await;
    assert_eq!(status, 200);
    // No transcript text at info level. The file's analyses get the least record their
    // schema allows, as a provider that keeps to it and finds nothing.
    fake.set_default(Reply::Least((10, 2)));
    let speech = std::fs::read(fixture("fixtures/formats/pcm16-mono-16k.wav")).unwrap();
    let (status, body) = upload(&server, &key, "speech.wav", speech).await;
    assert_eq!(status, 200, "{body}");
    let said = body["text"].as_str().unwrap().to_lowercase();
    assert!(said.contains("charged"), "{said}");
    healthy(&mut server).await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("admin request"), "{text}");
    assert!(text.contains("token=REDACTED"), "{text}");
    for secret in [
        "hunter2-but-much-longer",
        "tok-very-secret-4321",
        "pw-in-url-8765",
        "tok-in-url-5678",
        // E-mail addresses are logged at debug level only.
        "a@example.com",
        "charged",
    ] {
        assert!(
            !text.to_lowercase().contains(secret),
            "the log shows {secret}"
        );
    }
    use std::os::unix::fs::PermissionsExt;
    let mut dirs = vec![env.data_dir()];
    let mut files = 0;
    while let Some(dir) = dirs.pop() {
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{}", dir.display());
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let meta = entry.metadata().unwrap();
            if meta.is_dir() {
                dirs.push(entry.path());
            } else if meta.is_file() {
                files += 1;
                let mode = meta.permissions().mode() & 0o777;
                assert_eq!(
                    mode & 0o077,
                    0,
                    "{} is mode {mode:o}",
                    entry.path().display()
                );
            }
        }
    }
    assert!(files > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_servers_on_the_services_own_network_are_refused() {
    // Something listening on loopback, counting who connects.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = connections.clone();
    tokio::spawn(async move {
        while let Ok((_s, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
        }
    });
    let fake = FakeUpstream::start().await;
    let mut vars = fake.env();
    // The default: no private address allowed.
    vars.push(("CALLSTREAM_LLM__MCP_ALLOW", "[]".into()));
    let env = Env::with(vars);
    let mut server = env.serve();
    let (org, _, key) = env.org_with_key("Ssrf");
    for url in [
        format!("http://127.0.0.1:{port}/mcp"),
        format!("http://localhost:{port}/mcp"),
        format!("http://[::ffff:127.0.0.1]:{port}/mcp"),
    ] {
        env.cli_json(&["org", "set-mcp", &org, "--url", &url]);
        let (status, body) = common::post(
            &reqwest::Client::new(),
            &server.url("/api/llm/chat/completions"),
            &key,
            &json!({"messages": [{"role": "user", "content": "hi"}], "return_markdown": true}),
        )
        .await;
        // Answered without tools.
        assert_eq!(status, 200, "{url}: {body}");
    }
    assert_eq!(
        connections.load(Ordering::SeqCst),
        0,
        "the service connected to loopback"
    );
    healthy(&mut server).await;
}

/// A raw connection that has sent a form post's headers and the first byte of its body.
async fn slow_body(server: &Server) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut s = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    s.write_all(
        b"POST /dashboard/login HTTP/1.1\r\nHost: x\r\n\
          Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 1000\r\n\r\nc",
    )
    .await
    .unwrap();
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_bodies_and_one_address_cannot_take_every_connection() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let env = Env::new(&[
        ("CALLSTREAM_SERVER__MAX_CONNECTIONS", "60"),
        ("CALLSTREAM_SERVER__MAX_CONNECTIONS_PER_ADDRESS", "40"),
        ("CALLSTREAM_SERVER__BODY_GRACE_MS", "2000"),
        ("CALLSTREAM_SERVER__MIN_BODY_BYTES_PER_S", "200"),
    ]);
    let mut server = env.serve();
    let mut held = Vec::new();
    for _ in 0..50 {
        held.push(slow_body(&server).await);
    }
    // The address's 41st to 50th connections are told 503 and closed at once.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut refused = 0;
    let mut kept = Vec::new();
    for mut s in held {
        let mut buf = [0u8; 512];
        match tokio::time::timeout(Duration::from_millis(1), s.read(&mut buf)).await {
            Ok(Ok(n)) => {
                let answer = String::from_utf8_lossy(&buf[..n]).into_owned();
                assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
                assert!(answer.contains("from this address"), "{answer}");
                refused += 1;
            }
            Ok(Err(e)) => panic!("{e}"),
            Err(_) => kept.push(s),
        }
    }
    assert_eq!((kept.len(), refused), (40, 10));
    // Another address is served meanwhile.
    let other = reqwest::Client::builder()
        .local_address("127.0.0.2".parse::<std::net::IpAddr>().unwrap())
        .build()
        .unwrap();
    let resp = other.get(server.url("/healthz")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    // Trickling a byte every 500 ms, each held connection is answered 408 and closed soon
    // after the grace.
    let started = Instant::now();
    let mut answers = Vec::new();
    while !kept.is_empty() && started.elapsed() < Duration::from_secs(30) {
        let mut open = Vec::new();
        for mut s in kept {
            let mut buf = [0u8; 1024];
            match tokio::time::timeout(Duration::from_millis(5), s.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => answers.push(String::new()),
                Ok(Ok(n)) => {
                    let mut answer = buf[..n].to_vec();
                    let rest =
                        tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut answer));
                    let _ = rest.await;
                    answers.push(String::from_utf8_lossy(&answer).into_owned());
                }
                Err(_) => {
                    let _ = s.write_all(b"c").await;
                    open.push(s);
                }
            }
        }
        kept = open;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(kept.is_empty(), "{} slow bodies still held", kept.len());
    assert!(
        answers
            .iter()
            .all(|a| a.starts_with("HTTP/1.1 408") && a.contains("request_timeout")),
        "{answers:?}"
    );
    // The address has its places back.
    healthy(&mut server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sign_in_page_flood_cannot_evict_live_call_nonces() {
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
    let env = Env::new(&[]);
    let mut server = env.serve();
    let org = env.org_on_plan("Nonces", "team");
    let (client_id, secret) = env.connector(&org);
    let headers =
        common::audiohook::signed_headers(&server, &client_id, &secret, common::audiohook::now());
    let request = || common::audiohook::request(&server, &headers);
    let id = session_id(&request());
    let (mut ws, _) = tokio_tungstenite::connect_async(request()).await.unwrap();
    ws.send(message(&id, 1, "open", open(false))).await.unwrap();
    let opened: Value = match ws.next().await.unwrap().unwrap() {
        Message::Text(t) => serde_json::from_str(&t).unwrap(),
        other => panic!("{other:?}"),
    };
    assert_eq!(opened["type"], "opened");
    drop(ws);
    // More sign-in pages than the in-process tables hold, from many connections.
    let started = Instant::now();
    let statuses = Arc::new(parking_lot::Mutex::new(std::collections::BTreeMap::new()));
    let flood = (0..16).map(|_| {
        let url = server.url("/dashboard/login");
        let statuses = statuses.clone();
        tokio::spawn(async move {
            let client = reqwest::Client::new();
            for _ in 0..6_300 {
                let status = client.get(&url).send().await.unwrap().status().as_u16();
                *statuses.lock().entry(status).or_insert(0) += 1;
            }
        })
    });
    for task in futures_util::future::join_all(flood).await {
        task.unwrap();
    }
    let statuses = statuses.lock().clone();
    // The page is rate-limited per address: a burst of 60, then one a second.
    let allowed = 61 + started.elapsed().as_secs();
    assert!(
        statuses.get(&200).is_some_and(|n| *n <= allowed),
        "{statuses:?} in {:?}",
        started.elapsed()
    );
    assert!(statuses.contains_key(&429), "{statuses:?}");
    // The captured upgrade, replayed, is still refused.
    let (mut ws, _) = tokio_tungstenite::connect_async(request()).await.unwrap();
    match ws.next().await {
        Some(Ok(Message::Close(Some(frame)))) => {
            assert_eq!(frame.code, CloseCode::from(4401))
        }
        other => panic!("the replay was not refused: {other:?}"),
    }
    healthy(&mut server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_need_the_configured_token() {
    let env = Env::new(&[("CALLSTREAM_SERVER__METRICS_TOKEN", "scrape-token-1")]);
    let server = env.serve();
    let client = reqwest::Client::new();
    let url = server.url("/metrics");
    let bare = client.get(&url).send().await.unwrap();
    assert_eq!(bare.status(), 401);
    let body: Value = bare.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unauthorized");
    let wrong = client
        .get(&url)
        .bearer_auth("scrape-token-2")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    let scraped = client
        .get(&url)
        .bearer_auth("scrape-token-1")
        .send()
        .await
        .unwrap();
    assert_eq!(scraped.status(), 200);
    assert!(scraped
        .text()
        .await
        .unwrap()
        .contains("callstream_calls_active"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mcp_allow_list_opens_an_address_to_one_organisation_only() {
    // Something listening on loopback, counting who connects.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "http://127.0.0.1:{}/mcp",
        listener.local_addr().unwrap().port()
    );
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = connections.clone();
    tokio::spawn(async move {
        while let Ok((_s, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
        }
    });
    let fake = FakeUpstream::start().await;
    // The operator's bound opens loopback (the tests' default llm.mcp_allow).
    let env = Env::with(fake.env());
    let server = env.serve();
    let chat = |key: String| {
        let url = server.url("/api/llm/chat/completions");
        async move {
            common::post(
                &reqwest::Client::new(),
                &url,
                &key,
                &json!({"messages": [{"role": "user", "content": "hi"}], "return_markdown": true}),
            )
            .await
        }
    };
    // Without a list of its own, an organisation gets public addresses only; with a list
    // outside the bound, no more.
    for allow in [None, Some("10.0.0.0/8")] {
        let (org, _, key) = env.org_with_key("Other");
        env.cli_json(&["org", "set-mcp", &org, "--url", &url]);
        if let Some(allow) = allow {
            env.cli_json(&["org", "set-mcp-allow", &org, allow]);
        }
        let (status, body) = chat(key).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(connections.load(Ordering::SeqCst), 0, "{allow:?}");
    }
    // The organisation the operator opened it for reaches it.
    let (org, _, key) = env.org_with_key("Opened");
    env.cli_json(&["org", "set-mcp", &org, "--url", &url]);
    let view = env.cli_json(&["org", "set-mcp-allow", &org, "127.0.0.0/8"]);
    assert_eq!(view["mcp_allow"], json!(["127.0.0.0/8"]), "{view}");
    let (status, body) = chat(key).await;
    assert_eq!(status, 200, "{body}");
    assert!(connections.load(Ordering::SeqCst) > 0);
    // A list that does not read is refused.
    let bad = env.cli(&["org", "set-mcp-allow", &org, "10.0.0.0/99"]);
    assert!(!bad.status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_cookies_and_live_feeds_are_bounded_by_configuration() {
    let env = Env::new(&[("CALLSTREAM_DASHBOARD__MAX_FEEDS_PER_SESSION", "2")]);
    let server = env.serve();
    let org = env.cli_json(&["org", "create", "Feeds"])["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let client =
        common::dashboard::user_and_client(&env, &org, "f@example.com", "a long and good password");
    // public_url is https (the default): cookies are Secure whatever a request claims.
    let page = client
        .get(server.url("/dashboard/login"))
        .header("x-forwarded-proto", "http")
        .send()
        .await
        .unwrap();
    let cookie = page.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(cookie.contains("; Secure"), "{cookie}");
    let session = common::dashboard::session_cookie(
        &client,
        &server,
        "f@example.com",
        "a long and good password",
    )
    .await;
    let feed = || {
        client
            .get(server.url("/dashboard/calls/events"))
            .header("cookie", &session)
            .send()
    };
    let first = feed().await.unwrap();
    let second = feed().await.unwrap();
    assert_eq!(
        (first.status().as_u16(), second.status().as_u16()),
        (200, 200)
    );
    let third = feed().await.unwrap();
    assert_eq!(third.status(), 429);
    // A page that goes away gives its place back (at the latest when the next keep-alive
    // finds the connection closed, 15 s on).
    drop(first);
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let again = feed().await.unwrap();
        if again.status() == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the feed's place was never given back"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(second);
}
