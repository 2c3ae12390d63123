//! Real client software against the real server: the OpenAI Python SDK streaming a chat,
//! Python `requests` uploading with Python-style flags and chunked bodies, an AudioHook client
//! that sends only what the contract requires plus message types we do not act on, history the
//! service itself produced sent back, and a handshake signed behind a proxy that rewrote `Host`.

mod common;

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use common::audiohook::{now, request, signed_headers, signed_headers_at};
use common::upstream::{FakeUpstream, Reply};
use common::{python_json, usage_events, Env};

fn fixture(rel: &str) -> String {
    callstream_actors::package_dir(env!("CARGO_MANIFEST_DIR"))
        .join(rel)
        .display()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_streams_chat_and_every_streamed_turn_is_billed() {
    let env = Env::new(&[]);
    let server = env.serve();
    let org = env.org_on_plan("Sdk", "team");
    let (_, key) = env.key(&org);
    let base = server.url("/api/llm");

    let got = tokio::task::spawn_blocking({
        let (base, key) = (base.clone(), key.clone());
        move || {
            python_json(
                "openai_stream.py",
                &[
                    &base,
                    &key,
                    "Give a Markdown list of three fruits, each in bold.",
                    "false",
                    "60",
                ],
            )
        }
    })
    .await
    .unwrap();
    println!("{got}");
    let text: String = got["pieces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    assert!(
        got["pieces"].as_array().unwrap().len() > 1,
        "streamed in pieces"
    );
    assert!(!text.trim().is_empty());
    assert!(
        !text.contains("**"),
        "return_markdown false applies to the stream: {text}"
    );
    assert_eq!(got["roles"], json!(["assistant"]));
    assert_eq!(got["ids"], 1, "one completion id");
    assert!(["stop", "length"].contains(&got["finish_reason"].as_str().unwrap()));
    let usage = &got["usage"];
    let total = usage["total_tokens"].as_u64().unwrap();
    assert_eq!(
        total,
        usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap()
    );
    assert!(usage["completion_tokens"].as_u64().unwrap() <= 60);

    // History the service produced (an empty assistant answer, as after a tool-loop cap) and
    // OpenAI-style text parts are taken back.
    let client = reqwest::Client::new();
    let (status, body) = common::post(
        &client,
        &server.url("/api/llm/chat/completions"),
        &key,
        &json!({"return_markdown": true, "max_tokens": 8, "messages": [
            {"role": "user", "content": "Status of order 1?"},
            {"role": "assistant", "content": ""},
            {"role": "assistant", "content": null},
            {"role": "user", "content": [{"type": "text", "text": "Say "}, {"type": "text", "text": "hi."}]}]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let replayed = body["usage"]["total_tokens"].as_u64().unwrap();

    // A streamed turn refused before it starts is an ordinary error, not a stream.
    let (_, _, poor_key) = env.org_with_key("Poor");
    let resp = client
        .post(server.url("/api/llm/chat/completions"))
        .header("Authorization", format!("Bearer {poor_key}"))
        .json(
            &json!({"stream": true, "return_markdown": true, "max_tokens": 4096,
            "messages": [{"role": "user", "content": "x".repeat(200_000)}]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 402);
    assert_eq!(
        resp.json::<Value>().await.unwrap()["error"]["code"],
        "quota_exhausted"
    );

    // A client that reads one piece of a long answer and hangs up is billed for what was made.
    let mut resp = client
        .post(server.url("/api/llm/chat/completions"))
        .header("X-API-Key", &key)
        .json(&json!({"stream": true, "return_markdown": true, "max_tokens": 1000,
            "messages": [{"role": "user", "content": "Count from one to three hundred in words."}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let first = resp.chunk().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).starts_with("data: {"));
    drop(resp);

    server.stop();
    let events = usage_events(&env.data_dir(), &org);
    let amounts: Vec<u64> = events.iter().map(|e| e.amount).collect();
    println!("billed {amounts:?}");
    assert_eq!(amounts.len(), 3, "{amounts:?}");
    assert_eq!(amounts[0], total, "the streamed turn is billed as reported");
    assert_eq!(amounts[1], replayed);
    assert!(
        amounts[2] > 0 && amounts[2] < 1000,
        "the abandoned stream is billed for what was generated: {}",
        amounts[2]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_requests_uploads_with_python_flags_and_chunked_bodies() {
    // The analyses come from a scripted provider: this test is about the form, not the model.
    let fake = FakeUpstream::start().await;
    fake.set_default(Reply::Least((10, 2)));
    let mut vars = fake.env();
    vars.push(("CALLSTREAM_TRANSCRIBE__MAX_UPLOAD_MB", "1".into()));
    let env = Env::with(vars);
    let server = env.serve();
    let org = env.org_on_plan("Py", "team");
    let (_, key) = env.key(&org);
    let url = server.url("/api/transcribe");
    let file = fixture("fixtures/formats/pcm16-mono-16k.wav");
    let run = |mode: &'static str| {
        let (url, key, file) = (url.clone(), key.clone(), file.clone());
        tokio::task::spawn_blocking(move || {
            python_json("upload_requests.py", &[&url, &key, &file, mode])
        })
    };

    // `data={"extract_bant": True, "extract_neat": False}` arrives as "True" / "False".
    let form = run("form").await.unwrap();
    assert_eq!(form["status"], 200, "{form}");
    assert!(form["body"]["bant"].is_object(), "{form}");
    assert!(form["body"].get("neat_p").is_none(), "{form}");
    assert!(!form["body"]["text"].as_str().unwrap().trim().is_empty());

    // A body streamed from a generator goes chunked, with no Content-Length.
    let chunked = run("chunked").await.unwrap();
    assert_eq!(chunked["transfer_encoding"], "chunked", "{chunked}");
    assert!(chunked["content_length"].is_null());
    assert_eq!(chunked["status"], 200, "{chunked}");
    assert!(chunked["body"]["neat_p"].is_object(), "{chunked}");
    assert!(chunked["body"].get("bant").is_none(), "{chunked}");

    // A chunked body past the limit is refused as a declared one is.
    let big: Vec<Result<bytes::Bytes, std::io::Error>> = (0..40)
        .map(|_| Ok(bytes::Bytes::from(vec![0u8; 64 * 1024])))
        .collect();
    let mut body =
        b"--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\n"
            .to_vec();
    body.extend_from_slice(&[0u8; 1024]);
    let head = futures_util::stream::once(async move { Ok(bytes::Bytes::from(body)) });
    let stream = head.chain(futures_util::stream::iter(big));
    let resp = reqwest::Client::new()
        .post(&url)
        .header("X-API-Key", &key)
        .header("content-type", "multipart/form-data; boundary=b")
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await;
    match resp {
        Ok(resp) => {
            assert_eq!(resp.status(), 413);
            let body: Value = resp.json().await.unwrap();
            assert_eq!(body["error"]["code"], "payload_too_large");
        }
        // The server answered and closed while the client was still sending.
        Err(e) => assert!(e.is_request() || e.is_body(), "{e}"),
    }
    let resp = reqwest::get(server.url("/healthz")).await.unwrap();
    assert_eq!(resp.status(), 200);
    let used = env.audio_used(&org);
    assert!(used > 0.0, "the two accepted uploads are billed");
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The next text message, or the close code.
async fn next(ws: &mut Socket) -> Result<Value, Option<u16>> {
    loop {
        match tokio::time::timeout(Duration::from_secs(20), ws.next())
            .await
            .expect("the server answers")
        {
            Some(Ok(Message::Text(t))) => return Ok(serde_json::from_str(&t).unwrap()),
            Some(Ok(Message::Close(f))) => return Err(f.map(|f| u16::from(f.code))),
            Some(Ok(_)) => {}
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minimal_audiohook_client_with_dtmf_and_playback_messages_is_served() {
    let fake = FakeUpstream::start().await;
    let env = Env::with(fake.env());
    let server = env.serve();
    let org = env.org_on_plan("Bot", "team");
    let (client_id, secret) = env.connector(&org);

    let headers = signed_headers(&server, &client_id, &secret, now());
    let id = headers
        .iter()
        .find(|(k, _)| k == "audiohook-session-id")
        .unwrap()
        .1
        .clone();
    let (mut ws, _) = tokio_tungstenite::connect_async(request(&server, &headers))
        .await
        .unwrap();
    // Only what the contract's `open` has, and channel names of the client's own.
    let send = |seq: u64, kind: &str, parameters: Value| {
        Message::text(
            json!({"version": "2", "id": id, "seq": seq, "type": kind, "parameters": parameters})
                .to_string(),
        )
    };
    ws.send(send(
        1,
        "open",
        json!({"language": "en-US", "media": [{"type": "audio", "format": "PCMU",
            "channels": ["caller", "bot"], "rate": 8000}]}),
    ))
    .await
    .unwrap();
    let opened = next(&mut ws).await.unwrap();
    assert_eq!(opened["type"], "opened", "{opened}");
    assert_eq!(
        opened["parameters"]["media"][0]["channels"],
        json!(["caller", "bot"])
    );
    for _ in 0..10 {
        ws.send(Message::binary(vec![0xFFu8; 1600])).await.unwrap();
    }
    // A keypress and a bot's prompt playback: logged and ignored, the call goes on.
    ws.send(send(2, "dtmf", json!({"digit": "5"})))
        .await
        .unwrap();
    ws.send(send(3, "playback_started", json!({})))
        .await
        .unwrap();
    ws.send(send(4, "playback_completed", json!({})))
        .await
        .unwrap();
    ws.send(send(5, "ping", json!({}))).await.unwrap();
    let pong = next(&mut ws).await.unwrap();
    assert_eq!(pong["type"], "pong", "{pong}");
    assert_eq!(pong["clientseq"], 5);
    // A close without a reason is answered `closed`.
    ws.send(send(6, "close", json!({}))).await.unwrap();
    let closed = next(&mut ws).await.unwrap();
    assert_eq!(closed["type"], "closed", "{closed}");
    assert_eq!(next(&mut ws).await, Err(Some(1000)));
    assert!((env.audio_used(&org) - 1.0).abs() < 1e-9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_signed_for_the_public_authority_passes_a_proxy_that_rewrote_host() {
    let env = Env::new(&[("CALLSTREAM_SERVER__PUBLIC_URL", "https://calls.example.com")]);
    let server = env.serve();
    let org = env.cli_json(&["org", "create", "Proxy"])["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (client_id, secret) = env.connector(&org);
    let outcome = |authority: &'static str| {
        let headers = signed_headers_at(authority, &client_id, &secret, now());
        let request = request(&server, &headers);
        async move {
            let (mut ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
            let probe = json!({"version": "2", "id": headers.iter().find(|(k, _)| k == "audiohook-session-id").unwrap().1,
                "seq": 1, "type": "open", "parameters": {"conversationId": "00000000-0000-0000-0000-000000000000",
                "participant": {"id": "00000000-0000-0000-0000-000000000000"},
                "media": [{"type": "audio", "format": "PCMU", "channels": ["external"], "rate": 8000}]}});
            let _ = ws.send(Message::text(probe.to_string())).await;
            match tokio::time::timeout(Duration::from_secs(20), ws.next())
                .await
                .unwrap()
            {
                Some(Ok(Message::Text(t))) => {
                    serde_json::from_str::<Value>(&t).unwrap()["type"].clone()
                }
                Some(Ok(Message::Close(f))) => json!(f.map(|f| u16::from(f.code))),
                other => panic!("{other:?}"),
            }
        }
    };
    // The proxy sent Host: 127.0.0.1:port; the client signed what it connected to.
    assert_eq!(outcome("calls.example.com").await, "opened");
    assert_eq!(outcome("elsewhere.example.com").await, json!(4401));
}
