//! Any OpenAI-compatible chat-completions API as the model: requests are streamed (SSE), text
//! deltas are passed on as they arrive, tool calls are assembled from their fragments, and the
//! provider's own token usage is what gets billed.
//!
//! Failures map to [`LlmError::Upstream`] (the edge answers 502) and silence to
//! [`LlmError::UpstreamTimeout`] (504): no response headers within the timeout, or no bytes
//! for that long in the middle of a stream.

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{json, Value};

use super::sse::SseParser;
use super::{
    Completion, Deltas, FinishReason, Generation, LlmError, Message, Provider, Role, ToolCall,
    Usage,
};

/// Settings of an upstream provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamConfig {
    /// Base URL, up to and including the version (`https://api.openai.com/v1`).
    pub base_url: String,
    /// Bearer token.
    pub api_key: String,
    /// Model name sent with every request.
    pub model: String,
    /// Longest wait for the response headers, and for each piece of the stream.
    pub timeout: Duration,
    /// Longest wait for the TCP/TLS connection.
    pub connect_timeout: Duration,
    /// Fields added to every request body, replacing any of the same name: what a server
    /// needs beyond the OpenAI fields (`top_k`, say, or this service's own `return_markdown`).
    pub extra_body: serde_json::Map<String, Value>,
}

/// The upstream provider.
#[derive(Debug)]
pub struct UpstreamLlm {
    client: reqwest::Client,
    config: UpstreamConfig,
    name: String,
}

impl UpstreamLlm {
    /// A provider for `config`.
    pub fn new(config: UpstreamConfig) -> Result<Self, LlmError> {
        let client = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .build()
            .map_err(|e| LlmError::Engine(format!("cannot build the HTTP client: {e}")))?;
        Ok(Self {
            name: format!("upstream:{}", config.model),
            client,
            config,
        })
    }

    fn body(&self, generation: &Generation) -> Value {
        let s = &generation.sampling;
        let mut body = json!({
            "model": self.config.model,
            "messages": generation.messages.iter().map(wire_message).collect::<Vec<_>>(),
            "stream": true,
            "stream_options": {"include_usage": true},
            "max_tokens": s.max_tokens,
            "temperature": s.temperature,
            "top_p": s.top_p,
        });
        let obj = body.as_object_mut().expect("built as an object");
        if !s.stop.is_empty() {
            obj.insert("stop".into(), json!(s.stop));
        }
        if s.frequency_penalty != 0.0 {
            obj.insert("frequency_penalty".into(), json!(s.frequency_penalty));
        }
        if s.presence_penalty != 0.0 {
            obj.insert("presence_penalty".into(), json!(s.presence_penalty));
        }
        if let Some(seed) = s.seed {
            obj.insert("seed".into(), json!(seed));
        }
        if !generation.tools.is_empty() {
            let tools: Vec<Value> = generation
                .tools
                .iter()
                .map(|t| json!({"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}))
                .collect();
            obj.insert("tools".into(), json!(tools));
        }
        if let Some(format) = &generation.response_format {
            obj.insert("response_format".into(), format.clone());
        } else if let Some(schema) = &generation.json_schema {
            obj.insert(
                "response_format".into(),
                json!({"type": "json_schema", "json_schema": {"name": "result", "schema": schema, "strict": true}}),
            );
        }
        for (key, value) in &self.config.extra_body {
            obj.insert(key.clone(), value.clone());
        }
        body
    }
}

fn wire_message(m: &Message) -> Value {
    match m.role {
        Role::Tool => json!({"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content}),
        Role::Assistant if !m.tool_calls.is_empty() => json!({
            "role": "assistant",
            "content": m.content,
            "tool_calls": m.tool_calls.iter().map(|c| json!({
                "id": c.id, "type": "function",
                "function": {"name": c.name, "arguments": c.arguments.to_string()}
            })).collect::<Vec<_>>(),
        }),
        role => json!({"role": role, "content": m.content}),
    }
}

#[derive(Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

#[async_trait::async_trait]
impl Provider for UpstreamLlm {
    async fn generate(
        &self,
        generation: Generation,
        deltas: Deltas,
    ) -> Result<Completion, LlmError> {
        let url = format!(
            "{}/chat/completions",
            self.config.base_url.trim_end_matches('/')
        );
        let request = self
            .client
            .post(&url)
            .bearer_auth(&self.config.api_key)
            .json(&self.body(&generation))
            .send();
        let response = tokio::time::timeout(self.config.timeout, request)
            .await
            .map_err(|_| LlmError::UpstreamTimeout)?
            .map_err(|e| LlmError::Upstream(e.to_string()))?;
        let status = response.status();
        if !status.is_success() {
            let body = tokio::time::timeout(self.config.timeout, response.text())
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or_default();
            let detail: String = body.chars().take(300).collect();
            return Err(LlmError::Upstream(format!("HTTP {status}: {detail}")));
        }
        let mut stream = response.bytes_stream();
        let mut parser = SseParser::default();
        let mut text = String::new();
        let mut calls: BTreeMap<u64, PartialCall> = BTreeMap::new();
        let mut usage = None;
        let mut pieces = 0u64;
        let mut finish = None;
        let mut done = false;
        while !done {
            let chunk = match tokio::time::timeout(self.config.timeout, stream.next()).await {
                Err(_) => return Err(LlmError::UpstreamTimeout),
                Ok(None) => break,
                Ok(Some(Err(e))) => return Err(LlmError::Upstream(e.to_string())),
                Ok(Some(Ok(bytes))) => bytes,
            };
            for event in parser.push(&chunk).map_err(LlmError::Upstream)? {
                if event.data == "[DONE]" {
                    done = true;
                    break;
                }
                let v: Value = serde_json::from_str(&event.data)
                    .map_err(|e| LlmError::Upstream(format!("malformed stream event: {e}")))?;
                if let Some(err) = v.get("error") {
                    return Err(LlmError::Upstream(err.to_string()));
                }
                if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
                    usage = Some(Usage {
                        prompt_tokens: u["prompt_tokens"].as_u64().unwrap_or(0),
                        completion_tokens: u["completion_tokens"].as_u64().unwrap_or(0),
                        total_tokens: u["total_tokens"].as_u64().unwrap_or(0),
                    });
                }
                let Some(choice) = v["choices"].get(0) else {
                    continue;
                };
                if let Some(piece) = choice["delta"]["content"]
                    .as_str()
                    .filter(|p| !p.is_empty())
                {
                    text.push_str(piece);
                    pieces += 1;
                    if let Some(tx) = &deltas {
                        if tx.send(piece.to_owned()).await.is_err() {
                            // The provider's count comes only at the end; until then the
                            // estimate is a token per 4 bytes of prompt and one per piece.
                            let prompt =
                                super::prompt_bound(&generation.messages, &generation.tools) / 4;
                            return Err(LlmError::Cancelled {
                                usage: Usage {
                                    prompt_tokens: prompt,
                                    completion_tokens: pieces,
                                    total_tokens: prompt + pieces,
                                },
                            });
                        }
                    }
                }
                for call in choice["delta"]["tool_calls"]
                    .as_array()
                    .into_iter()
                    .flatten()
                {
                    let entry = calls
                        .entry(call["index"].as_u64().unwrap_or(0))
                        .or_default();
                    if let Some(id) = call["id"].as_str() {
                        entry.id = id.to_owned();
                    }
                    if let Some(name) = call["function"]["name"].as_str() {
                        entry.name.push_str(name);
                    }
                    if let Some(args) = call["function"]["arguments"].as_str() {
                        entry.arguments.push_str(args);
                    }
                }
                if let Some(reason) = choice["finish_reason"].as_str() {
                    finish = Some(match reason {
                        "length" => FinishReason::Length,
                        "tool_calls" => FinishReason::ToolCalls,
                        _ => FinishReason::Stop,
                    });
                }
            }
        }
        if !done && finish.is_none() {
            return Err(LlmError::Upstream(
                "the stream ended before the answer did".into(),
            ));
        }
        let tool_calls: Vec<ToolCall> = calls
            .into_values()
            .filter(|c| !c.name.is_empty())
            .enumerate()
            .map(|(i, c)| ToolCall {
                id: if c.id.is_empty() {
                    format!("call_{i}")
                } else {
                    c.id
                },
                name: c.name,
                arguments: serde_json::from_str(&c.arguments).unwrap_or_else(|_| json!({})),
            })
            .collect();
        let usage = usage
            .ok_or_else(|| LlmError::Upstream("the provider reported no token usage".into()))?;
        Ok(Completion {
            text,
            odds: Vec::new(),
            finish: if tool_calls.is_empty() {
                finish.unwrap_or(FinishReason::Stop)
            } else {
                FinishReason::ToolCalls
            },
            tool_calls,
            usage,
        })
    }

    fn name(&self) -> &str {
        &self.name
    }
}
