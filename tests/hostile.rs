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
    // Five attempts a minute per account (one is spent): the sixth is refused without a
    // password check, even with the right password.
    for _ in 0..4 {
        let token = sign_in_form(&client, &server).await;
        let r = sign_in(&client, &server, &token, "admin@example.com", "wrong").await;
        assert_eq!(r.status(), 401);
    }
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
    let env = Env::new(&[]);
    let log = env.dir.path().join("server.log");
    let mut server = env.serve_logged(&log);
    let org = env.cli_json(&["org", "create", "Secrets"])["id"]
        .as_str()
        .unwrap()
        .to_owned();
    // Through the admin socket, while the server holds the database.
    env.cli_json(&[
        "user",
        "create",
        &org,
        "a@example.com",
        "--password",
        "hunter2-but-much-longer",
    ]);
    env.cli_json(&[
        "org",
        "set-mcp",
        &org,
        "--url",
        "https://mcp.example.com/mcp",
        "--header",
        "Authorization=Bearer tok-very-secret-4321",
    ]);
    healthy(&mut server).await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("admin request"), "{text}");
    for secret in ["hunter2-but-much-longer", "tok-very-secret-4321"] {
        assert!(!text.contains(secret), "the log shows {secret}");
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
