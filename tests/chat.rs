//! REST chat against a real server: the embedded model (Qwen2.5 0.5B), and the upstream
//! provider against a scripted stand-in for the third-party API; MCP tools against a real
//! MCP server.

mod common;

use callstream_actors::usage::{UsageKind, UsageSource};
use common::upstream::{FakeUpstream, Reply};
use common::{post, usage_events, Env};
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
    let events = usage_events(&env.data_dir(), &org);
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

/// `response_format` on the embedded model: the answer is JSON valid against the client's
/// schema (its references written out), or any JSON object; it is left as written whatever
/// `return_markdown` says; schemas the grammar cannot hold, or that would hold the shared
/// model too long, are 400s that bill nothing.
#[tokio::test]
async fn structured_answers_keep_to_the_clients_schema() {
    let env = Env::new(&[]);
    let server = env.serve();
    let (org, _, secret) = env.org_with_key("Acme");
    let client = reqwest::Client::new();
    let ask = "A caller says: my order 4471 arrived broken, I want a refund. Classify the call.";
    // The shape a Pydantic model with a nested enum gives.
    let schema = json!({
        "$defs": {"Kind": {"type": "string", "enum": ["refund", "delivery", "billing"]}},
        "type": "object",
        "properties": {
            "kind": {"$ref": "#/$defs/Kind"},
            "order_number": {"type": "integer"},
            "summary": {"type": "string", "maxLength": 120}
        },
        "required": ["kind", "order_number", "summary"],
        "additionalProperties": false
    });
    let (status, body) = post(
        &client,
        &server.url(URL),
        &secret,
        &json!({"messages": [{"role": "user", "content": ask}], "return_markdown": false,
                "max_tokens": 120, "temperature": 0,
                "response_format": {"type": "json_schema",
                    "json_schema": {"name": "call", "schema": schema, "strict": true}}}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["finish_reason"], "stop", "{body}");
    let content = body["choices"][0]["message"]["content"].as_str().unwrap();
    let answer: serde_json::Value = serde_json::from_str(content).expect("the answer is JSON");
    let fields = answer.as_object().unwrap();
    assert_eq!(
        fields.keys().collect::<Vec<_>>(),
        ["kind", "order_number", "summary"],
        "{content}"
    );
    assert!(
        ["refund", "delivery", "billing"].contains(&answer["kind"].as_str().unwrap()),
        "{content}"
    );
    assert!(answer["order_number"].is_i64(), "{content}");
    assert!(answer["summary"].as_str().unwrap().chars().count() <= 120);
    let billed = body["usage"]["total_tokens"].as_u64().unwrap();

    // Any JSON object, streamed: the pieces join into one.
    let resp = client
        .post(server.url(URL))
        .header("X-API-Key", &secret)
        .json(&json!({"messages": [{"role": "user", "content": "Give the caller's name and city: I'm Ana from Porto."}],
                      "return_markdown": false, "max_tokens": 60, "temperature": 0, "stream": true,
                      "response_format": {"type": "json_object"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let events = resp.text().await.unwrap();
    let mut streamed = String::new();
    for data in events.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if data == "[DONE]" {
            break;
        }
        let chunk: serde_json::Value = serde_json::from_str(data).unwrap();
        if let Some(piece) = chunk["choices"][0]["delta"]["content"].as_str() {
            streamed.push_str(piece);
        }
    }
    let object: serde_json::Value =
        serde_json::from_str(&streamed).unwrap_or_else(|e| panic!("{e}: {streamed:?}"));
    assert!(object.is_object(), "{streamed}");

    // Refused before the model is asked, or by the grammar converter.
    let m = json!([{"role": "user", "content": "hi"}]);
    let format = |schema: serde_json::Value| {
        json!({"messages": m, "return_markdown": true, "max_tokens": 20,
               "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}})
    };
    let mut nested = json!({"type": "string"});
    for _ in 0..8 {
        nested = json!({"anyOf": [nested, {"type": "integer"}]});
    }
    let refused = [
        json!({"messages": m, "return_markdown": true, "response_format": {"type": "xml"}}),
        json!({"messages": m, "return_markdown": true, "response_format": {"type": "json_schema"}}),
        format(
            json!({"$defs": {"N": {"type": "object", "properties": {"next": {"$ref": "#/$defs/N"}}}}, "$ref": "#/$defs/N"}),
        ),
        format(nested),
        format(
            json!({"type": "object", "properties": {"code": {"type": "string", "pattern": "^(a+)*$"}}}),
        ),
        // A pattern the grammar converter finds invalid: refused by the model's thread.
        format(
            json!({"type": "object", "properties": {"code": {"type": "string", "pattern": "^(ab$"}}}),
        ),
    ];
    for body in refused {
        let (status, answer) = post(&client, &server.url(URL), &secret, &body).await;
        assert_eq!(
            (status, answer["error"]["code"].as_str()),
            (400, Some("invalid_response_format")),
            "{body}: {answer}"
        );
    }
    // Only the two answers were billed: the stream's reached the ledger too.
    let used = tokens_used(&env, &org);
    assert!(used > billed, "{used} after {billed}");
}

/// The analyses through the upstream provider, against a real OpenAI-compatible server:
/// another instance of this service on the embedded model, which takes the structured
/// requests (`response_format: json_schema`, streamed) and bills them to its own client. The
/// records parse, their labels come from the documented sets, and their quotes are the
/// transcript's words.
#[tokio::test]
async fn analyses_run_through_the_upstream_provider_on_another_instance() {
    use callstream::llm::profiles::{analyse, intent_labels, ProfileKind, FILE_LAYOUT};
    use callstream::llm::upstream::{UpstreamConfig, UpstreamLlm};
    const TRANSCRIPT: &str = "Agent: Thanks for calling Acme Software, how can I help?
Customer: Hi, I'm the operations director at Northwind. We want to replace our call center software.
Customer: Our contract ends in March, so we need something in place before then.
Agent: Do you have a budget in mind?
Customer: We have about fifty thousand dollars set aside for this.";
    let env = Env::new(&[]);
    let server = env.serve();
    let (org, _, secret) = env.org_with_key("Model host");
    let mut extra_body = serde_json::Map::new();
    extra_body.insert("return_markdown".into(), json!(false));
    let upstream = UpstreamLlm::new(UpstreamConfig {
        base_url: server.url("/api/llm"),
        api_key: secret,
        model: "callstream".into(),
        timeout: std::time::Duration::from_secs(600),
        connect_timeout: std::time::Duration::from_secs(5),
        extra_body,
    })
    .unwrap();

    let (intent, intent_usage) = analyse(
        &upstream,
        ProfileKind::Intent,
        FILE_LAYOUT,
        TRANSCRIPT,
        Some("Agent"),
    )
    .await
    .unwrap();
    let labels = intent_labels();
    let intents = intent["intents"].as_array().unwrap();
    assert!(!intents.is_empty(), "{intent}");
    for i in intents {
        assert!(
            labels.contains(&i["intent"].as_str().unwrap().to_owned()),
            "{i}"
        );
    }
    let (bant, bant_usage) = analyse(
        &upstream,
        ProfileKind::Bant,
        FILE_LAYOUT,
        TRANSCRIPT,
        Some("Agent"),
    )
    .await
    .unwrap();
    println!("intent {intent}\nbant {bant}");
    assert_eq!(
        bant.as_object().unwrap().keys().collect::<Vec<_>>(),
        ["budget", "authority", "need", "timeline"]
    );
    for (name, field) in bant.as_object().unwrap() {
        assert!(
            ["identified", "partial", "not_found"].contains(&field["status"].as_str().unwrap()),
            "{name}: {field}"
        );
        for quote in field["evidence"].as_array().unwrap() {
            let quote = quote.as_str().unwrap();
            assert!(TRANSCRIPT.contains(quote), "{name}: {quote:?}");
        }
    }
    // What the upstream client counted is what the serving instance billed.
    let spent = intent_usage.total_tokens + bant_usage.total_tokens;
    assert!(spent > 0);
    assert_eq!(tokens_used(&env, &org), spent);
}

/// A structured turn on the upstream provider: the client's own `response_format` (its name
/// and `strict`) is what the provider is sent, the configured extra fields ride along, the
/// organisation's MCP tools are not offered (a JSON answer has no room for a call), and the
/// answer comes back as written, Markdown characters and all.
#[tokio::test]
async fn a_structured_turn_is_forwarded_with_the_clients_format() {
    let fake = FakeUpstream::start().await;
    fake.push(Reply::Text(
        vec!["{\"title\": \"**Q3**", " plan\"}"],
        (20, 6),
    ));
    let mut vars = fake.env();
    vars.push((
        "CALLSTREAM_LLM__UPSTREAM__EXTRA_BODY",
        "{\"top_k\": 20}".into(),
    ));
    let env = Env::with(vars);
    let server = env.serve();
    let (org, _, secret) = env.org_with_key("Acme");
    env.cli_json(&["org", "set-mcp", &org, "--url", "http://127.0.0.1:9/mcp"]);
    let client = reqwest::Client::new();
    let schema = json!({"type": "object", "properties": {"title": {"type": "string"}},
                        "required": ["title"], "additionalProperties": false});
    let (status, body) = post(
        &client,
        &server.url(URL),
        &secret,
        &json!({"messages": [{"role": "user", "content": "Title for the plan?"}], "return_markdown": false,
                "response_format": {"type": "json_schema",
                    "json_schema": {"name": "plan_title", "schema": schema, "strict": false}}}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "{\"title\": \"**Q3** plan\"}"
    );
    let sent = &fake.seen()[0].body;
    assert_eq!(
        sent["response_format"],
        json!({"type": "json_schema", "json_schema": {"name": "plan_title", "schema": schema, "strict": false}})
    );
    assert_eq!(sent["top_k"], 20);
    assert!(sent.get("tools").is_none());
    let system = sent["messages"][0]["content"].as_str().unwrap();
    assert!(system.contains("JSON"), "{system}");
    assert_eq!(tokens_used(&env, &org), 26);
}

/// The model is shared by rule: an organisation that floods it gets 429 with a wait for
/// itself, and another organisation's request is served beside the flood, not behind it.
#[tokio::test]
async fn a_flooding_organisation_is_told_to_wait_and_another_is_served_beside_it() {
    let fake = FakeUpstream::start().await;
    fake.set_default(Reply::Text(vec!["Fine."], (5, 1)));
    fake.set_delay(std::time::Duration::from_millis(1200));
    let mut vars = fake.env();
    vars.retain(|(k, _)| *k != "CALLSTREAM_LLM__UPSTREAM__TIMEOUT_MS");
    vars.push(("CALLSTREAM_LLM__UPSTREAM__TIMEOUT_MS", "20000".into()));
    vars.push(("CALLSTREAM_LLM__PARALLEL", "2".into()));
    vars.push(("CALLSTREAM_LLM__QUEUE_PER_ORG", "2".into()));
    let env = Env::with(vars);
    let server = env.serve();
    let (_, _, flood_key) = env.org_with_key("Flood");
    let (_, _, other_key) = env.org_with_key("Other");
    let client = reqwest::Client::new();
    let ask = |key: String| {
        let client = client.clone();
        let url = server.url(URL);
        async move {
            let response = client
                .post(url)
                .header("X-API-Key", key)
                .json(&json!({"messages": [{"role": "user", "content": "hi"}],
                              "return_markdown": false, "max_tokens": 5}))
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            let retry = response
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap().parse::<u64>().unwrap());
            let body: serde_json::Value = response.json().await.unwrap();
            (status, retry, body, std::time::Instant::now())
        }
    };
    // Six at once from one organisation: one runs (its share of two places), two wait, three
    // are refused.
    let flood: Vec<_> = (0..6)
        .map(|_| tokio::spawn(ask(flood_key.clone())))
        .collect();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let (status, _, body, other_done) = ask(other_key.clone()).await;
    assert_eq!(status, 200, "{body}");
    let mut answered = Vec::new();
    let mut refused = 0;
    for task in flood {
        let (status, retry, body, done) = task.await.unwrap();
        match status {
            200 => answered.push(done),
            429 => {
                refused += 1;
                assert_eq!(body["error"]["code"], "model_busy", "{body}");
                assert!(retry.is_some_and(|s| s >= 1), "429 without Retry-After");
            }
            other => panic!("{other}: {body}"),
        }
    }
    assert_eq!((answered.len(), refused), (3, 3));
    // The other organisation did not wait for the flood: it was answered before the flood's
    // last request, which waited for two others of its own.
    assert!(answered.iter().filter(|&&t| t > other_done).count() >= 2);
}
