//! Realtime chat over a real WebSocket: every row of the spec's realtime state table.

mod common;

use std::time::{Duration, Instant};

use callstream_actors::usage::UsageSource;
use common::upstream::{FakeUpstream, Reply};
use common::{usage_events, Env};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// What the server sent next.
#[derive(Debug, PartialEq)]
enum Got {
    Frame(Value),
    Closed(u16, String),
}

async fn connect(addr: std::net::SocketAddr, key: Option<&str>) -> Socket {
    let mut req = format!("ws://{addr}/api/llm/chat/realtime")
        .into_client_request()
        .unwrap();
    if let Some(key) = key {
        req.headers_mut().insert("x-api-key", key.parse().unwrap());
    }
    tokio_tungstenite::connect_async(req)
        .await
        .expect("the upgrade succeeds")
        .0
}

async fn next(ws: &mut Socket) -> Got {
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(120), ws.next())
            .await
            .expect("the server answers")
            .expect("the connection is open")
            .expect("a valid frame");
        match msg {
            Message::Text(t) => return Got::Frame(serde_json::from_str(&t).unwrap()),
            Message::Close(Some(c)) => return Got::Closed(u16::from(c.code), c.reason.to_string()),
            Message::Close(None) => return Got::Closed(0, String::new()),
            _ => continue,
        }
    }
}

async fn send(ws: &mut Socket, v: Value) {
    ws.send(Message::text(v.to_string())).await.unwrap();
}

/// Sends a turn and collects its frames: the text of the deltas and the final frame.
async fn turn(ws: &mut Socket, v: Value) -> (String, Got) {
    send(ws, v).await;
    let mut text = String::new();
    loop {
        match next(ws).await {
            Got::Frame(f) if f["type"] == "delta" => text.push_str(f["text"].as_str().unwrap()),
            other => return (text, other),
        }
    }
}

fn message(content: &str) -> Value {
    json!({"type": "message", "messages": [{"role": "user", "content": content}], "return_markdown": true})
}

#[tokio::test]
async fn missing_or_invalid_key_closes_with_4401() {
    let env = Env::new(&[]);
    let server = env.serve();
    let mut ws = connect(server.addr, None).await;
    assert!(matches!(next(&mut ws).await, Got::Closed(4401, _)));
    let mut ws = connect(server.addr, Some("cs_wrong")).await;
    assert!(matches!(next(&mut ws).await, Got::Closed(4401, _)));
}

#[tokio::test]
async fn embedded_model_streams_many_turns_and_bills_each_even_when_the_client_leaves() {
    let env = Env::new(&[]);
    let server = env.serve();
    let (org, _, secret) = env.org_with_key("Acme");
    let mut ws = connect(server.addr, Some(&secret)).await;
    let mut billed = 0;
    for (i, question) in ["Say hello in five words.", "Now say goodbye in five words."]
        .iter()
        .enumerate()
    {
        let mut frame = message(question);
        frame["user"] = json!(format!("caller-{i}"));
        send(&mut ws, frame).await;
        let mut deltas = Vec::new();
        let done = loop {
            match next(&mut ws).await {
                Got::Frame(f) if f["type"] == "delta" => {
                    deltas.push(f["text"].as_str().unwrap().to_owned())
                }
                Got::Frame(f) => break f,
                closed => panic!("{closed:?}"),
            }
        };
        assert_eq!(done["type"], "done", "{done}");
        assert!(!deltas.is_empty() && !deltas.concat().trim().is_empty());
        let usage = &done["usage"];
        assert!(usage["completion_tokens"].as_u64().unwrap() >= 1);
        assert_eq!(
            usage["total_tokens"],
            usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap()
        );
        billed += usage["total_tokens"].as_u64().unwrap();
    }
    // A third turn asks for a long answer; the client reads one delta and hangs up.
    let earlier = billed;
    send(
        &mut ws,
        message("Count from one to three hundred in words, one number per line."),
    )
    .await;
    match next(&mut ws).await {
        Got::Frame(f) if f["type"] == "delta" => {}
        other => panic!("{other:?}"),
    }
    drop(ws);
    // A graceful stop waits for the abandoned turn to be billed.
    server.stop();
    let events = usage_events(&env.data_dir(), &org);
    assert_eq!(events.len(), 3, "{events:?}");
    assert_eq!(events[..2].iter().map(|e| e.amount).sum::<u64>(), billed);
    assert!(events.iter().all(|e| e.source == UsageSource::Realtime));
    assert_eq!(events[0].end_user.as_deref(), Some("caller-0"));
    assert_eq!(events[1].end_user.as_deref(), Some("caller-1"));
    // Billed: its prompt (about what one earlier turn's cost) and the few tokens generated
    // before the model noticed nobody was reading, far fewer than the 300 numbers asked for.
    let left_early = events[2].amount;
    assert!(
        left_early > earlier / 4 && left_early < earlier + 400,
        "{left_early} tokens billed for the abandoned turn"
    );
}

#[tokio::test]
async fn bad_frames_get_error_frames_and_the_connection_stays_open() {
    let fake = FakeUpstream::start().await;
    let env = Env::with(fake.env());
    let server = env.serve();
    let (_, _, secret) = env.org_with_key("Acme");
    let mut ws = connect(server.addr, Some(&secret)).await;
    let m = json!([{"role": "user", "content": "hi"}]);
    for bad in [
        json!({"type": "message", "messages": m}),
        json!({"type": "message", "messages": m, "return_markdown": "yes"}),
        json!({"type": "message", "messages": m, "return_markdown": true, "temperature": 0.5}),
        json!({"type": "message", "messages": m, "return_markdown": true, "max_tokens": 10}),
        json!({"type": "message", "messages": [], "return_markdown": true}),
        json!({"type": "hello"}),
    ] {
        let (text, last) = turn(&mut ws, bad.clone()).await;
        assert!(text.is_empty());
        let Got::Frame(f) = last else {
            panic!("{bad} closed the connection: {last:?}")
        };
        assert_eq!(f["type"], "error", "{bad}");
        assert!(!f["message"].as_str().unwrap().is_empty());
    }
    ws.send(Message::text("{not json")).await.unwrap();
    let Got::Frame(f) = next(&mut ws).await else {
        panic!()
    };
    assert_eq!(f["type"], "error");
    fake.push(Reply::Text(vec!["still ", "here"], (5, 2)));
    let (text, last) = turn(&mut ws, message("hi")).await;
    assert_eq!(text, "still here");
    assert_eq!(
        last,
        Got::Frame(
            json!({"type": "done", "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}})
        )
    );
}

#[tokio::test]
async fn turn_system_prompt_layers_on_the_organisation_prompt_for_that_turn_only() {
    let fake = FakeUpstream::start().await;
    let env = Env::with(fake.env());
    let server = env.serve();
    let (org, _, secret) = env.org_with_key("Acme");
    env.cli_json(&[
        "org",
        "set-prompt",
        &org,
        "You are the Acme support assistant.",
    ]);
    let mut ws = connect(server.addr, Some(&secret)).await;
    let mut first = message("hi");
    first["system_prompt"] = json!("Answer like a pirate.");
    turn(&mut ws, first).await;
    turn(&mut ws, message("hi again")).await;
    let seen = fake.seen();
    let system = |i: usize| {
        seen[i].body["messages"][0]["content"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert!(
        system(0).starts_with("You are the Acme support assistant.\n\nAnswer like a pirate.\n\n"),
        "{}",
        system(0)
    );
    assert!(
        system(1).starts_with("You are the Acme support assistant.\n\n"),
        "{}",
        system(1)
    );
    assert!(!system(1).contains("pirate"));
    // Realtime turns run with the fixed cap and temperature.
    for s in &seen {
        assert_eq!(s.body["max_tokens"], 4096);
        assert!((s.body["temperature"].as_f64().unwrap() - 0.2).abs() < 1e-6);
    }
}

#[tokio::test]
async fn plain_turns_stream_without_markdown() {
    let fake = FakeUpstream::start().await;
    fake.push(Reply::Text(
        vec![
            "## Sta",
            "tus\nYour **order",
            "** ships *today*.\n- Track [he",
            "re](https://x.test).",
        ],
        (5, 9),
    ));
    let env = Env::with(fake.env());
    let server = env.serve();
    let (_, _, secret) = env.org_with_key("Acme");
    let mut ws = connect(server.addr, Some(&secret)).await;
    let mut frame = message("status?");
    frame["return_markdown"] = json!(false);
    let (text, _) = turn(&mut ws, frame).await;
    assert_eq!(text, "Status\nYour order ships today.\nTrack here.");
}

#[tokio::test]
async fn rpm_budget_is_checked_per_turn_and_shared_with_rest() {
    let fake = FakeUpstream::start().await;
    let mut extra = fake.env();
    extra.push(("CALLSTREAM_PLANS__FREE__RPM", "2".into()));
    let env = Env::with(extra);
    let server = env.serve();
    let (_, _, secret) = env.org_with_key("Acme");
    let client = reqwest::Client::new();
    let (status, _, _) = common::get(&client, &server.url("/api/account"), Some(&secret)).await;
    assert_eq!(status, 200);
    let mut ws = connect(server.addr, Some(&secret)).await;
    let (_, last) = turn(&mut ws, message("one")).await;
    assert!(
        matches!(&last, Got::Frame(f) if f["type"] == "done"),
        "{last:?}"
    );
    for _ in 0..2 {
        let (_, last) = turn(&mut ws, message("two")).await;
        let Got::Frame(f) = last else {
            panic!("closed: {last:?}")
        };
        assert_eq!(f["type"], "error");
        assert!(f["message"].as_str().unwrap().contains("rate limit"), "{f}");
    }
    let (status, _, body) = common::get(&client, &server.url("/api/usage"), Some(&secret)).await;
    assert_eq!(status, 429, "REST shares the budget: {body}");
}

#[tokio::test]
async fn exhausted_token_quota_closes_with_4402() {
    let fake = FakeUpstream::start().await;
    // The first turn leaves 100 tokens: less than the next turn's prompt may cost.
    fake.push(Reply::Text(vec!["first"], (300, 200)));
    let mut extra = fake.env();
    extra.push((
        "CALLSTREAM_PLANS__FREE__CHAT_TOKENS_PER_MONTH",
        "600".into(),
    ));
    let env = Env::with(extra);
    let server = env.serve();
    let (_, _, secret) = env.org_with_key("Acme");
    let mut ws = connect(server.addr, Some(&secret)).await;
    let (_, last) = turn(&mut ws, message("one")).await;
    assert!(
        matches!(&last, Got::Frame(f) if f["type"] == "done"),
        "{last:?}"
    );
    let (_, last) = turn(&mut ws, message("two")).await;
    assert!(matches!(last, Got::Closed(4402, _)), "{last:?}");
    assert_eq!(
        fake.seen().len(),
        1,
        "the refused turn never reached the model"
    );
}

#[tokio::test]
async fn deleted_organisation_closes_with_4404_at_the_next_turn() {
    let fake = FakeUpstream::start().await;
    let env = Env::with(fake.env());
    let server = env.serve();
    let (org, _, secret) = env.org_with_key("Acme");
    let mut ws = connect(server.addr, Some(&secret)).await;
    let (_, last) = turn(&mut ws, message("one")).await;
    assert!(matches!(&last, Got::Frame(f) if f["type"] == "done"));
    env.cli_json(&["org", "delete", &org]);
    let (_, last) = turn(&mut ws, message("two")).await;
    assert!(matches!(last, Got::Closed(4404, _)), "{last:?}");
}

#[tokio::test]
async fn revoking_the_key_closes_an_idle_session_with_1011() {
    let fake = FakeUpstream::start().await;
    let env = Env::with(fake.env());
    let server = env.serve();
    let (_, key_id, secret) = env.org_with_key("Acme");
    let mut ws = connect(server.addr, Some(&secret)).await;
    let (_, last) = turn(&mut ws, message("one")).await;
    assert!(matches!(&last, Got::Frame(f) if f["type"] == "done"));
    let revoked_at = Instant::now();
    env.cli_json(&["key", "revoke", &key_id]);
    // Idle: nothing is sent; the server notices by itself.
    let got = next(&mut ws).await;
    println!("closed {:?} after revocation", revoked_at.elapsed());
    assert_eq!(got, Got::Closed(1011, "API key is no longer valid.".into()));
}

#[tokio::test]
async fn tool_loop_cap_ends_the_turn_with_null_usage() {
    let (mcp_url, _) = common::mcp::start().await;
    let fake = FakeUpstream::start().await;
    fake.push_tool_calls(2);
    let mut extra = fake.env();
    extra.push(("CALLSTREAM_LLM__MAX_TOOL_ITERATIONS", "2".into()));
    let env = Env::with(extra);
    let server = env.serve();
    let (org, _, secret) = env.org_with_key("Acme");
    common::mcp::attach(&env, &org, &mcp_url);
    let mut ws = connect(server.addr, Some(&secret)).await;
    let (_, last) = turn(&mut ws, message("order 1?")).await;
    assert_eq!(last, Got::Frame(json!({"type": "done", "usage": null})));
    // The client is told `null`; the ledger has both generations.
    let used = env.cli_json(&["usage", &org])["chat_tokens"]["used"].clone();
    assert_eq!(used, json!(2 * (30 + 8)));
}
