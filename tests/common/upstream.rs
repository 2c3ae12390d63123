//! A scripted stand-in for a third-party OpenAI-compatible provider, on loopback: it records
//! every request and answers with the next scripted reply, streamed as server-sent events in
//! small pieces the way real providers send them.

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use warp::Filter;

/// One scripted answer.
#[derive(Debug, Clone)]
pub enum Reply {
    /// Text in these pieces, then the usage (prompt, completion).
    Text(Vec<&'static str>, (u64, u64)),
    /// A call of `name` with these arguments (streamed in two fragments), then the usage.
    ToolCall(&'static str, Value, (u64, u64)),
    /// An HTTP error status with a body.
    Status(u16, &'static str),
    /// No answer at all (for timeouts).
    Hang,
    /// Text in these pieces, then the connection breaks (no end, no usage).
    Cut(Vec<&'static str>),
    /// The least answer the request's `response_format` schema allows (each enum its last
    /// value, each string empty, each array as short as allowed), as text, then the usage:
    /// a provider that keeps to the schema and finds nothing.
    Least((u64, u64)),
}

/// The least instance of `schema` (see [`Reply::Least`]).
fn least(schema: &Value) -> Value {
    if let Some(last) = schema
        .get("enum")
        .and_then(Value::as_array)
        .and_then(|e| e.last())
    {
        return last.clone();
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("object") => Value::Object(
            schema
                .get("properties")
                .and_then(Value::as_object)
                .map(|p| p.iter().map(|(k, v)| (k.clone(), least(v))).collect())
                .unwrap_or_default(),
        ),
        Some("array") => {
            let n = schema.get("minItems").and_then(Value::as_u64).unwrap_or(0);
            let item = schema.get("items").map(least).unwrap_or(Value::Null);
            Value::Array(vec![item; n as usize])
        }
        Some("string") => json!(""),
        Some("number" | "integer") => json!(0),
        Some("boolean") => json!(false),
        _ => Value::Null,
    }
}

/// A request as received: the authorization header and the JSON body.
#[derive(Debug, Clone)]
pub struct Seen {
    pub authorization: Option<String>,
    pub body: Value,
}

#[derive(Clone)]
pub struct FakeUpstream {
    pub addr: SocketAddr,
    default: Arc<Mutex<Reply>>,
    script: Arc<Mutex<VecDeque<Reply>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
    delay: Arc<Mutex<Duration>>,
    /// Requests received, counted on arrival (before the delay).
    arrived: Arc<AtomicUsize>,
}

fn chunk(v: Value) -> String {
    format!("data: {v}\n\n")
}

/// The events of `reply`. Like a real provider, it never reports more completion tokens than
/// the request's `max_tokens`.
fn events(reply: &Reply, max_tokens: Option<u64>) -> Vec<String> {
    let usage = |(p, c): (u64, u64)| {
        let c = c.min(max_tokens.unwrap_or(u64::MAX));
        chunk(
            json!({"choices": [], "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}}),
        )
    };
    let mut out = Vec::new();
    match reply {
        Reply::Text(pieces, u) => {
            for p in pieces {
                out.push(chunk(json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": null}]})));
            }
            out.push(chunk(
                json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
            ));
            out.push(usage(*u));
        }
        Reply::ToolCall(name, args, u) => {
            let args = args.to_string();
            let (a, b) = args.split_at(args.len() / 2);
            out.push(chunk(json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_abc", "type": "function", "function": {"name": name, "arguments": a}}]}}]})));
            out.push(chunk(json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": b}}]}}]})));
            out.push(chunk(
                json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
            ));
            out.push(usage(*u));
        }
        Reply::Cut(pieces) => {
            for p in pieces {
                out.push(chunk(json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": null}]})));
            }
            return out;
        }
        Reply::Status(..) | Reply::Hang | Reply::Least(_) => {}
    }
    out.push("data: [DONE]\n\n".to_owned());
    out
}

impl FakeUpstream {
    /// Starts on 127.0.0.1:0. When the script runs out it answers "ok".
    pub async fn start() -> Self {
        let script: Arc<Mutex<VecDeque<Reply>>> = Arc::default();
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let default = Arc::new(Mutex::new(Reply::Text(vec!["ok"], (5, 1))));
        let delay: Arc<Mutex<Duration>> = Arc::default();
        let arrived: Arc<AtomicUsize> = Arc::default();
        let (s, r, d, w) = (script.clone(), seen.clone(), default.clone(), delay.clone());
        let a = arrived.clone();
        let route = warp::path!("v1" / "chat" / "completions")
            .and(warp::post())
            .and(warp::header::optional::<String>("authorization"))
            .and(warp::body::json())
            .then(move |authorization: Option<String>, body: Value| {
                let (script, seen, default) = (s.clone(), r.clone(), d.clone());
                let wait = *w.lock();
                a.fetch_add(1, Ordering::SeqCst);
                async move {
                    tokio::time::sleep(wait).await;
                    let max_tokens = body.get("max_tokens").and_then(Value::as_u64);
                    let schema = body
                        .pointer("/response_format/json_schema/schema")
                        .cloned()
                        .unwrap_or(Value::Null);
                    seen.lock().push(Seen {
                        authorization,
                        body,
                    });
                    let reply = script
                        .lock()
                        .pop_front()
                        .unwrap_or_else(|| default.lock().clone());
                    match reply {
                        Reply::Status(code, body) => warp::http::Response::builder()
                            .status(code)
                            .body(warp::hyper::Body::from(body))
                            .unwrap(),
                        Reply::Hang => {
                            tokio::time::sleep(Duration::from_secs(120)).await;
                            warp::http::Response::new(warp::hyper::Body::empty())
                        }
                        reply => {
                            let reply = match reply {
                                Reply::Least(usage) => {
                                    let text = least(&schema).to_string();
                                    Reply::Text(vec![Box::leak(text.into_boxed_str())], usage)
                                }
                                other => other,
                            };
                            let (mut tx, body) = warp::hyper::Body::channel();
                            let cut = matches!(reply, Reply::Cut(_));
                            tokio::spawn(async move {
                                for e in events(&reply, max_tokens) {
                                    // Split each event too: parsers must cope with any chunking.
                                    let (a, b) = e.split_at(e.len() / 2);
                                    for part in [a, b] {
                                        if tx.send_data(part.to_owned().into()).await.is_err() {
                                            return;
                                        }
                                        tokio::time::sleep(Duration::from_millis(2)).await;
                                    }
                                }
                                if cut {
                                    tokio::time::sleep(Duration::from_millis(50)).await;
                                    tx.abort();
                                }
                            });
                            warp::http::Response::builder()
                                .header("content-type", "text/event-stream")
                                .body(body)
                                .unwrap()
                        }
                    }
                }
            });
        let (addr, server) = warp::serve(route).bind_ephemeral(([127, 0, 0, 1], 0));
        tokio::spawn(server);
        Self {
            addr,
            default,
            script,
            seen,
            delay,
            arrived,
        }
    }

    /// How many requests have arrived, including those still waiting out the delay.
    pub fn arrived(&self) -> usize {
        self.arrived.load(Ordering::SeqCst)
    }

    /// Waits (up to 20 s) until `n` requests have arrived.
    pub async fn until_arrived(&self, n: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while self.arrived() < n {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{n} requests within 20 s (arrived: {})",
                self.arrived()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits this long before answering each request (from then on).
    pub fn set_delay(&self, delay: Duration) {
        *self.delay.lock() = delay;
    }

    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The answer once the script has run out.
    pub fn set_default(&self, reply: Reply) {
        *self.default.lock() = reply;
    }

    /// Scripts `n` answers that each call `get_order_status` again.
    pub fn push_tool_calls(&self, n: usize) {
        for _ in 0..n {
            self.push(Reply::ToolCall(
                "get_order_status",
                json!({"order_id": "1"}),
                (30, 8),
            ));
        }
    }

    pub fn push(&self, reply: Reply) {
        self.script.lock().push_back(reply);
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().clone()
    }

    /// Environment that points a server at this provider.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("CALLSTREAM_LLM__PROVIDER", "upstream".into()),
            ("CALLSTREAM_LLM__UPSTREAM__BASE_URL", self.base_url()),
            (
                "CALLSTREAM_LLM__UPSTREAM__API_KEY",
                "sk-test-upstream".into(),
            ),
            ("CALLSTREAM_LLM__UPSTREAM__MODEL", "fake-model".into()),
            ("CALLSTREAM_LLM__UPSTREAM__TIMEOUT_MS", "1500".into()),
        ]
    }
}
