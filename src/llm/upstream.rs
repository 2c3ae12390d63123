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

/// One streamed event of an OpenAI-compatible server: `chat.completion.chunk`, or an error.
#[derive(Debug, serde::Deserialize)]
struct StreamChunk {
    #[serde(default)]
    choices: Option<Vec<ChunkChoice>>,
    #[serde(default)]
    usage: Option<ChunkUsage>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Debug, serde::Deserialize)]
struct ChunkChoice {
    #[serde(default)]
    delta: Option<ChunkDelta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Debug, Default, serde::Deserialize)]
struct ChunkDelta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<ChunkToolCall>>,
}

/// A piece of a tool call: its name and arguments arrive split over several chunks.
#[derive(Debug, serde::Deserialize)]
struct ChunkToolCall {
    #[serde(default)]
    index: u64,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: ChunkFunction,
}

#[derive(Debug, Default, serde::Deserialize)]
struct ChunkFunction {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

#[derive(Debug, serde::Deserialize)]
struct ChunkUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
    #[serde(default)]
    total_tokens: u64,
}

/// Reads a streamed event; an error names the field that did not fit.
fn read_chunk(data: &str) -> Result<StreamChunk, LlmError> {
    let mut reader = serde_json::Deserializer::from_str(data);
    serde_path_to_error::deserialize(&mut reader).map_err(|e| {
        LlmError::Upstream(format!(
            "malformed stream event at {}: {}",
            e.path(),
            e.inner()
        ))
    })
}

/// The arguments of tool call `name` as the server sent them: a JSON object (none sent: no
/// arguments). Anything else is the server's error, not an empty call.
fn tool_arguments(name: &str, text: &str) -> Result<Value, LlmError> {
    if text.trim().is_empty() {
        return Ok(json!({}));
    }
    match serde_json::from_str::<Value>(text) {
        Ok(args @ Value::Object(_)) => Ok(args),
        Ok(other) => Err(LlmError::Upstream(format!(
            "tool call {name}: arguments must be a JSON object, not {other}"
        ))),
        Err(e) => Err(LlmError::Upstream(format!(
            "tool call {name}: arguments are not JSON ({e})"
        ))),
    }
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
                let chunk = read_chunk(&event.data)?;
                if let Some(err) = chunk.error {
                    return Err(LlmError::Upstream(err.to_string()));
                }
                if let Some(u) = chunk.usage {
                    usage = Some(Usage {
                        prompt_tokens: u.prompt_tokens,
                        completion_tokens: u.completion_tokens,
                        total_tokens: u.total_tokens,
                    });
                }
                let Some(choice) = chunk.choices.into_iter().flatten().next() else {
                    continue;
                };
                let delta = choice.delta.unwrap_or_default();
                if let Some(piece) = delta.content.filter(|p| !p.is_empty()) {
                    text.push_str(&piece);
                    pieces += 1;
                    if let Some(tx) = &deltas {
                        if tx.send(piece).await.is_err() {
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
                for call in delta.tool_calls.into_iter().flatten() {
                    let entry = calls.entry(call.index).or_default();
                    if let Some(id) = call.id {
                        entry.id = id;
                    }
                    if let Some(name) = call.function.name {
                        entry.name.push_str(&name);
                    }
                    if let Some(args) = call.function.arguments {
                        entry.arguments.push_str(&args);
                    }
                }
                if let Some(reason) = choice.finish_reason {
                    finish = Some(match reason.as_str() {
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
        let tool_calls = calls
            .into_values()
            .filter(|c| !c.name.is_empty())
            .enumerate()
            .map(|(i, c)| {
                Ok(ToolCall {
                    id: if c.id.is_empty() {
                        format!("call_{i}")
                    } else {
                        c.id
                    },
                    arguments: tool_arguments(&c.name, &c.arguments)?,
                    name: c.name,
                })
            })
            .collect::<Result<Vec<ToolCall>, LlmError>>()?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_events_are_read_into_their_fields() {
        let chunk = read_chunk(
            r#"{"choices":[{"index":0,"delta":{"content":"Hi","tool_calls":[{"index":1,"id":"c1","function":{"name":"lookup","arguments":"{\"q\""}}]},"finish_reason":null}],"usage":null}"#,
        )
        .unwrap();
        let choice = chunk.choices.unwrap().into_iter().next().unwrap();
        let delta = choice.delta.unwrap();
        assert_eq!(delta.content.as_deref(), Some("Hi"));
        let call = &delta.tool_calls.unwrap()[0];
        assert_eq!((call.index, call.id.as_deref()), (1, Some("c1")));
        assert_eq!(call.function.arguments.as_deref(), Some("{\"q\""));
        // A server's own shape of nothing: null lists, no delta.
        assert!(read_chunk(r#"{"choices":null,"usage":{"prompt_tokens":3}}"#).is_ok());
    }

    #[test]
    fn a_malformed_event_names_the_field() {
        let Err(LlmError::Upstream(message)) =
            read_chunk(r#"{"choices":[{"delta":{"content":7}}]}"#)
        else {
            panic!("a number is no content")
        };
        assert!(message.contains("choices[0].delta.content"), "{message}");
    }

    #[test]
    fn tool_arguments_are_an_object_or_an_error() {
        assert_eq!(tool_arguments("f", "").unwrap(), json!({}));
        assert_eq!(
            tool_arguments("f", r#"{"city":"Oslo"}"#).unwrap(),
            json!({"city": "Oslo"})
        );
        for bad in [r#"{"city":"Os"#, "[1, 2]", "\"text\""] {
            let Err(LlmError::Upstream(message)) = tool_arguments("f", bad) else {
                panic!("{bad} was taken")
            };
            assert!(message.starts_with("tool call f: "), "{message}");
        }
    }
}
