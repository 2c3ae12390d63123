//! REST chat against a real server: the embedded model (Qwen2.5 0.5B), and the upstream
//! provider against a scripted stand-in for the third-party API; MCP tools against a real
//! MCP server.

mod common;

use callstream::store::Store;
use callstream_actors::usage::{UsageKind, UsageSource};
use common::upstream::{FakeUpstream, Reply};
use common::{open_store, post, Env};
use serde_json::json;

const URL: &str = "/api/llm/chat/completions";

fn tokens_used(env: &Env, org: &str) -> u64 {
    env.cli_json(&["usage", org])["chat_tokens"]["used"]
        .as_u64()
        .unwrap()
}

#[tokio::test]
async fn embedded_model_answers_in_the_spec_shape_and_bills_the_caller() {
    let env = Env::new(&[]);
    let server = env.serve();
    let (org, key_id, secret) = env.org_with_key("Acme");
    let client = reqwest::Client::new();
    let (status, body) = post(
        &client,
        &server.url(URL),
        &secret,
        &json!({"messages": [{"role": "user", "content": "Say hello to a caller in one short sentence."}],
                "return_markdown": true, "max_tokens": 40, "temperature": 0, "user": "end-user-42"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(body["object"], "chat.completion");
    let created = body["created"].as_i64().unwrap();
    assert!((created - callstream::clock::now_ms() / 1000).abs() < 600);
    let choice = &body["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["message"]["role"], "assistant");
    assert!(!choice["message"]["content"]
        .as_str()
        .unwrap()
        .trim()
        .is_empty());
    assert!(["stop", "length"].contains(&choice["finish_reason"].as_str().unwrap()));
    let u = &body["usage"];
    let total = u["total_tokens"].as_u64().unwrap();
    assert!(u["prompt_tokens"].as_u64().unwrap() > 10);
    assert!(
        u["completion_tokens"].as_u64().unwrap() >= 1
            && u["completion_tokens"].as_u64().unwrap() <= 40
    );
    assert_eq!(
        total,
        u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap()
    );
    assert_eq!(tokens_used(&env, &org), total);

    server.stop();
    let events = open_store(&env.data_dir())
        .usage_events(&org, 0, i64::MAX)
        .unwrap();
    assert_eq!(events.len(), 1);
    let e = &events[0];
    assert_eq!(
        (e.kind, e.amount, e.source),
        (UsageKind::Tokens, total, UsageSource::Chat)
    );
    assert_eq!(
        (e.key_id.as_str(), e.end_user.as_deref()),
        (key_id.as_str(), Some("end-user-42"))
    );
}

#[tokio::test]
async fn bad_requests_are_400s_and_bill_nothing() {
    let env = Env::new(&[]);
    let server = env.serve();
    let (org, _, secret) = env.org_with_key("Acme");
    let client = reqwest::Client::new();
    let m = json!([{"role": "user", "content": "hi"}]);
    let cases = [
        (json!({"messages": m}), "missing_return_markdown"),
        (
            json!({"messages": m, "return_markdown": "false"}),
            "invalid_return_markdown",
        ),
        (
            json!({"messages": m, "return_markdown": true, "temperature": 3}),
            "invalid_sampling",
        ),
        (
            json!({"messages": m, "return_markdown": true, "max_tokens": 0}),
            "invalid_sampling",
        ),
        (
            json!({"messages": [], "return_markdown": true}),
            "invalid_messages",
        ),
        (
            json!({"messages": [{"role": "user"}], "return_markdown": true}),
            "invalid_messages",
        ),
    ];
    for (body, code) in cases {
        let (status, answer) = post(&client, &server.url(URL), &secret, &body).await;
        assert_eq!(
            (status, answer["error"]["code"].as_str()),
            (400, Some(code)),
            "{body}"
        );
    }
    let resp = client
        .post(server.url(URL))
        .header("X-API-Key", &secret)
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let resp = client
        .post(server.url(URL))
        .json(&json!({"messages": m, "return_markdown": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    // Refused on the declared length, before the body is read: send only the headers.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut raw = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let head = format!(
        "POST {URL} HTTP/1.1\r\nHost: {}\r\nX-API-Key: {secret}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        server.addr,
        2 << 20
    );
    raw.write_all(head.as_bytes()).await.unwrap();
    let mut answer = vec![0u8; 512];
    let n = tokio::time::timeout(std::time::Duration::from_secs(30), raw.read(&mut answer))
        .await
        .unwrap()
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert_eq!(tokens_used(&env, &org), 0);
}

#[tokio::test]
async fn return_markdown_false_gives_plain_prose() {
    let env = Env::new(&[]);
    let server = env.serve();
    let (_, _, secret) = env.org_with_key("Acme");
    let client = reqwest::Client::new();
    let ask = "Write a Markdown document: a level-2 heading 'Fruits', then a bulleted list of three fruits with their names in bold.";
    let (status, body) = post(
        &client,
        &server.url(URL),
        &secret,
        &json!({"messages": [{"role": "user", "content": ask}], "return_markdown": false, "max_tokens": 80, "temperature": 0}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let text = body["choices"][0]["message"]["content"].as_str().unwrap();
    println!("{text}");
    assert!(!text.trim().is_empty());
    assert!(!text.contains("**") && !text.contains("```"), "{text}");
    for line in text.lines() {
        let l = line.trim_start();
        assert!(
            !l.starts_with('#') && !l.starts_with("- ") && !l.starts_with("* "),
            "{line:?}"
        );
    }
}

#[tokio::test]
async fn upstream_stream_is_assembled_forwarded_and_its_usage_billed() {
    let fake = FakeUpstream::start().await;
    fake.push(Reply::Text(vec!["Hello", " from", " upstream."], (11, 3)));
    let env = Env::with(fake.env());
    let server = env.serve();
    let (org, _, secret) = env.org_with_key("Acme");
    env.cli_json(&[
        "org",
        "set-prompt",
        &org,
        "You are the Acme support assistant.",
    ]);
    let client = reqwest::Client::new();
    let (status, body) = post(
        &client,
        &server.url(URL),
        &secret,
        &json!({"messages": [{"role": "user", "content": "hi"}], "return_markdown": true,
                "max_tokens": 50, "temperature": 0.3, "stop": ["END"], "seed": 9, "system_prompt": "Be brief."}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "Hello from upstream."
    );
    assert_eq!(
        body["usage"],
        json!({"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14})
    );
    assert_eq!(body["model"], "upstream:fake-model");
    assert_eq!(tokens_used(&env, &org), 14);

    let seen = fake.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].authorization.as_deref(),
        Some("Bearer sk-test-upstream")
    );
    let sent = &seen[0].body;
    assert_eq!(
        (sent["model"].as_str(), sent["stream"].as_bool()),
        (Some("fake-model"), Some(true))
    );
    assert_eq!(
        (sent["max_tokens"].as_u64(), sent["seed"].as_u64()),
        (Some(50), Some(9))
    );
    assert_eq!(sent["stop"], json!(["END"]));
    assert!((sent["temperature"].as_f64().unwrap() - 0.3).abs() < 1e-6);
    let system = sent["messages"][0]["content"].as_str().unwrap();
    assert_eq!(sent["messages"][0]["role"], "system");
    assert!(
        system.starts_with("You are the Acme support assistant.\n\nBe brief.\n\n"),
        "{system}"
    );
    assert_eq!(
        sent["messages"][1],
        json!({"role": "user", "content": "hi"})
    );
}

#[tokio::test]
async fn upstream_failures_are_502_and_504_and_bill_nothing() {
    let fake = FakeUpstream::start().await;
    fake.push(Reply::Status(500, "{\"error\": \"boom\"}"));
    fake.push(Reply::Hang);
    let env = Env::with(fake.env());
    let server = env.serve();
    let (org, _, secret) = env.org_with_key("Acme");
    let client = reqwest::Client::new();
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "return_markdown": true});
    let (status, answer) = post(&client, &server.url(URL), &secret, &body).await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (502, Some("upstream_error")),
        "{answer}"
    );
    // What the provider said stays in the log; the client reads the kind and a request id.
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("the language model provider failed (request id req_"),
        "{message}"
    );
    assert!(!message.contains("boom"), "{message}");
    let (status, answer) = post(&client, &server.url(URL), &secret, &body).await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (504, Some("upstream_timeout")),
        "{answer}"
    );
    assert_eq!(tokens_used(&env, &org), 0);
}

#[tokio::test]
async fn mcp_tools_are_offered_called_and_answered() {
    let (mcp_url, orders) = common::mcp::start().await;
    let fake = FakeUpstream::start().await;
    fake.push(Reply::ToolCall(
        "get_order_status",
        json!({"order_id": "7731"}),
        (30, 8),
    ));
    fake.push(Reply::Text(vec!["Your order ", "has shipped."], (50, 5)));
    let env = Env::with(fake.env());
    let server = env.serve();
    let (org, _, secret) = env.org_with_key("Acme");
    common::mcp::attach(&env, &org, &mcp_url);
    let client = reqwest::Client::new();
    let (status, body) = post(
        &client,
        &server.url(URL),
        &secret,
        &json!({"messages": [{"role": "user", "content": "Where is order 7731?"}], "return_markdown": true}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "Your order has shipped."
    );
    assert_eq!(
        body["usage"]["total_tokens"], 93,
        "both model calls are billed"
    );
    assert_eq!(orders.calls.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(tokens_used(&env, &org), 93);

    let seen = fake.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(
        seen[0].body["tools"][0]["function"]["name"],
        "get_order_status"
    );
    let messages = seen[1].body["messages"].as_array().unwrap();
    let call = messages.iter().find(|m| m["role"] == "assistant").unwrap();
    assert_eq!(
        call["tool_calls"][0]["function"]["name"],
        "get_order_status"
    );
    let result = messages.iter().find(|m| m["role"] == "tool").unwrap();
    assert_eq!(result["tool_call_id"], "call_abc");
    assert_eq!(result["content"], common::mcp::status_of("7731"));
}

#[tokio::test]
async fn tool_loop_cap_shows_no_usage_but_bills_the_generations() {
    let (mcp_url, orders) = common::mcp::start().await;
    let fake = FakeUpstream::start().await;
    fake.push_tool_calls(2);
    let mut extra = fake.env();
    extra.push(("CALLSTREAM_LLM__MAX_TOOL_ITERATIONS", "2".into()));
    let env = Env::with(extra);
    let server = env.serve();
    let (org, _, secret) = env.org_with_key("Acme");
    common::mcp::attach(&env, &org, &mcp_url);
    let client = reqwest::Client::new();
    let (status, body) = post(
        &client,
        &server.url(URL),
        &secret,
        &json!({"messages": [{"role": "user", "content": "Status of order 1?"}], "return_markdown": true}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(body["choices"][0]["message"]["content"], "");
    assert!(body["usage"].is_null());
    assert_eq!(orders.calls.load(std::sync::atomic::Ordering::SeqCst), 2);
    assert_eq!(
        tokens_used(&env, &org),
        2 * (30 + 8),
        "the client sees no usage, the ledger has both generations"
    );
}

#[tokio::test]
async fn unreachable_mcp_server_does_not_break_chat() {
    let fake = FakeUpstream::start().await;
    fake.push(Reply::Text(vec!["Answer without tools."], (9, 4)));
    let env = Env::with(fake.env());
    let server = env.serve();
    let (org, _, secret) = env.org_with_key("Acme");
    env.cli_json(&["org", "set-mcp", &org, "--url", "http://127.0.0.1:9/mcp"]);
    let client = reqwest::Client::new();
    let (status, body) = post(
        &client,
        &server.url(URL),
        &secret,
        &json!({"messages": [{"role": "user", "content": "hi"}], "return_markdown": true}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "Answer without tools."
    );
    assert!(fake.seen()[0].body.get("tools").is_none());
}
