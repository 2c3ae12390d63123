//! The chat service shared by the REST and realtime surfaces: it puts the organisation's system
//! prompt first, layers a per-turn prompt and the output-format instruction on top, offers the
//! organisation's MCP tools and runs the tool loop, and returns the answer with its usage.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::mcp::McpSession;
use super::{Deltas, FinishReason, Generation, LlmError, Message, Provider, Role, Sampling, Usage};
use crate::store::Org;

/// Used when neither the organisation nor the turn gives a system prompt.
const DEFAULT_SYSTEM_PROMPT: &str = "You are a helpful assistant for a contact center.";
const PLAIN_INSTRUCTION: &str = "Answer in plain prose. Do not use Markdown: no headings, lists, bold or italic text, tables, code blocks or links.";
const MARKDOWN_INSTRUCTION: &str = "Format the answer in Markdown where it helps readability.";
const JSON_INSTRUCTION: &str =
    "Answer with JSON only, following the response format the request gives: no prose around it.";

/// Settings of the chat service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatSettings {
    /// Most model calls in one turn when tools are used.
    pub max_tool_iterations: usize,
    /// Timeout for each MCP step (connect, list, call).
    pub mcp_timeout: Duration,
    /// Where MCP servers may be.
    pub mcp_policy: crate::llm::mcp::McpPolicy,
}

/// One turn as a surface hands it over.
#[derive(Debug, Clone)]
pub struct ChatTurn {
    /// The conversation so far (user, assistant and system messages from the client).
    pub messages: Vec<Message>,
    /// A system prompt for this turn only, layered on the organisation's.
    pub system_prompt: Option<String>,
    /// Markdown (`true`) or plain prose (`false`).
    pub return_markdown: bool,
    /// Sampling.
    pub sampling: Sampling,
    /// Most tokens the whole turn may spend (every model call, prompts included), when its
    /// organisation's quota is limited: what was reserved for it. Each model call's
    /// `max_tokens` is cut to fit; a tool loop that would need more stops as at its cap.
    pub budget: Option<u64>,
    /// A structured answer (`response_format`): JSON valid against a schema. Such a turn is
    /// answered without the organisation's MCP tools, and its text is left as written.
    pub response_format: Option<ResponseFormat>,
}

/// The structured answer a turn asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponseFormat {
    /// What the answer must be valid against: the client's schema, or `{"type": "object"}`
    /// for any JSON object.
    pub schema: serde_json::Value,
    /// The client's `response_format`, as an upstream server is sent it.
    pub wire: serde_json::Value,
}

/// The answer of a turn.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatOutcome {
    /// The answer as the model wrote it (plain-text conversion is the surface's job).
    pub text: String,
    /// Tokens of every model call of the turn, as the client is told; `None` when the tool
    /// loop hit its cap without a final answer.
    pub usage: Option<Usage>,
    /// Tokens of every model call of the turn, as billed: the same as `usage`, and also set
    /// when `usage` is `None`.
    pub billed: Usage,
    /// Why the last model call stopped.
    pub finish: FinishReason,
    /// Tool calls made during the turn.
    pub tool_calls: usize,
}

/// Runs chat turns against a provider.
#[derive(Clone)]
pub struct ChatService {
    provider: Arc<dyn Provider>,
    settings: ChatSettings,
}

impl std::fmt::Debug for ChatService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatService")
            .field("provider", &self.provider.name())
            .finish()
    }
}

/// The system message of `turn`: organisation prompt, then the turn's, then the format rule
/// (JSON for a structured answer, else Markdown or plain prose).
fn turn_system_message(org: &Org, turn: &ChatTurn) -> String {
    let format = if turn.response_format.is_some() {
        JSON_INSTRUCTION
    } else if turn.return_markdown {
        MARKDOWN_INSTRUCTION
    } else {
        PLAIN_INSTRUCTION
    };
    let mut parts: Vec<&str> = Vec::new();
    if let Some(p) = org
        .system_prompt
        .as_deref()
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        parts.push(p);
    }
    if let Some(p) = turn
        .system_prompt
        .as_deref()
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        parts.push(p);
    }
    if parts.is_empty() {
        parts.push(DEFAULT_SYSTEM_PROMPT);
    }
    parts.push(format);
    parts.join("\n\n")
}

impl ChatService {
    /// A service over `provider`.
    pub fn new(provider: Arc<dyn Provider>, settings: ChatSettings) -> Self {
        Self { provider, settings }
    }

    /// The provider.
    pub fn provider(&self) -> &Arc<dyn Provider> {
        &self.provider
    }

    /// The settings it runs with.
    pub fn settings(&self) -> &ChatSettings {
        &self.settings
    }

    /// The most tokens `turn` may cost for `org`: its first prompt at most (tools aside), plus
    /// its `max_tokens`. What a turn reserves before it runs.
    pub fn worst_case(&self, org: &Org, turn: &ChatTurn) -> (u64, u64) {
        let system = Message::new(Role::System, turn_system_message(org, turn));
        let prompt = super::prompt_bound(std::slice::from_ref(&system), &[])
            + super::prompt_bound(&turn.messages, &[]);
        (prompt, prompt + u64::from(turn.sampling.max_tokens))
    }

    /// Runs one turn for `org`, streaming the answer's text to `deltas`. A turn that fails
    /// says what it spent before it failed: the model calls of its tool loop that were
    /// answered, the one stopped when the client went away, and one whose text was partly
    /// streamed before it failed (a token per 4 bytes of its prompt and one per piece, as the
    /// provider's own count never came). All of it is billed.
    pub async fn run(
        &self,
        org: &Org,
        turn: ChatTurn,
        deltas: Deltas,
    ) -> Result<ChatOutcome, TurnError> {
        let mut messages = vec![Message::new(Role::System, turn_system_message(org, &turn))];
        messages.extend(turn.messages);
        let (json_schema, response_format) = match turn.response_format {
            Some(f) => (Some(f.schema), Some(f.wire)),
            None => (None, None),
        };

        // A structured answer is JSON from its first token: there is no room for a tool call.
        let mcp = org.mcp.as_ref().filter(|_| json_schema.is_none());
        let session = match mcp {
            Some(integration) => {
                match McpSession::connect(
                    integration,
                    self.settings.mcp_timeout,
                    &self.settings.mcp_policy.for_org(&org.mcp_allow),
                )
                .await
                {
                    Ok(s) => Some(s),
                    Err(e) => {
                        tracing::warn!(org = %org.id, url = %integration.url_for_logs(), error = %e, "MCP server unavailable; answering without tools");
                        None
                    }
                }
            }
            None => None,
        };
        let tools = session
            .as_ref()
            .map(|s| s.tools().to_vec())
            .unwrap_or_default();

        let mut usage = Usage::default();
        let mut calls_made = 0;
        let result = async {
            for _ in 0..self.settings.max_tool_iterations.max(1) {
                let mut sampling = turn.sampling.clone();
                if let Some(budget) = turn.budget {
                    // What the prompt may cost, at most, and what is left for the answer.
                    let prompt = super::prompt_bound(&messages, &tools);
                    let left = budget.saturating_sub(usage.total_tokens + prompt);
                    if left == 0 {
                        tracing::info!(org = %org.id, budget, "turn stopped: its token reservation is spent");
                        break;
                    }
                    sampling.max_tokens = sampling.max_tokens.min(left.min(u64::from(u32::MAX)) as u32);
                }
                let streamed = Arc::new(AtomicU64::new(0));
                let generated = self
                    .provider
                    .generate(
                        Generation {
                            messages: messages.clone(),
                            tools: tools.clone(),
                            sampling,
                            json_schema: json_schema.clone(),
                            response_format: response_format.clone(),
                            odds: None,
                            tenant: Some(org.id.clone()),
                            class: super::fair::Class::Interactive,
                        },
                        deltas.as_ref().map(|tx| counted(tx.clone(), streamed.clone())),
                    )
                    .await;
                let completion = match generated {
                    Ok(c) => c,
                    // What the turn spent before the stop is billed with it.
                    Err(LlmError::Cancelled { usage: spent }) => {
                        usage += spent;
                        return Err(TurnError {
                            error: LlmError::Cancelled { usage },
                            spent: usage,
                        });
                    }
                    Err(error) => {
                        let pieces = streamed.load(Ordering::Relaxed);
                        if pieces > 0 {
                            let prompt = super::prompt_bound(&messages, &tools) / 4;
                            usage += Usage {
                                prompt_tokens: prompt,
                                completion_tokens: pieces,
                                total_tokens: prompt + pieces,
                            };
                        }
                        return Err(TurnError {
                            error,
                            spent: usage,
                        });
                    }
                };
                usage += completion.usage;
                let Some(session) = session
                    .as_ref()
                    .filter(|_| !completion.tool_calls.is_empty())
                else {
                    return Ok(ChatOutcome {
                        text: completion.text,
                        usage: Some(usage),
                        billed: usage,
                        finish: if completion.finish == FinishReason::ToolCalls {
                            FinishReason::Stop
                        } else {
                            completion.finish
                        },
                        tool_calls: calls_made,
                    });
                };
                let mut assistant = Message::new(Role::Assistant, completion.text.clone());
                assistant.tool_calls = completion.tool_calls.clone();
                messages.push(assistant);
                for call in &completion.tool_calls {
                    calls_made += 1;
                    let output = session.call(call).await;
                    tracing::debug!(tool = %call.name, "tool called");
                    let mut result = Message::new(Role::Tool, output);
                    result.tool_call_id = Some(call.id.clone());
                    messages.push(result);
                }
            }
            Ok(ChatOutcome {
                text: String::new(),
                usage: None,
                billed: usage,
                finish: FinishReason::ToolCalls,
                tool_calls: calls_made,
            })
        }
        .await;
        if let Some(session) = session {
            session.close().await;
        }
        result
    }
}

/// A chat turn that failed, and what it spent before it did (billed all the same).
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct TurnError {
    /// Why it failed.
    pub error: LlmError,
    /// Tokens spent until then.
    pub spent: Usage,
}

/// A sender of text pieces to `to` that counts them in `pieces`; when `to` is gone, the
/// sender's receiver goes too, so the model stops at its next piece.
fn counted(
    to: tokio::sync::mpsc::Sender<String>,
    pieces: Arc<AtomicU64>,
) -> tokio::sync::mpsc::Sender<String> {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(64);
    tokio::spawn(async move {
        while let Some(piece) = rx.recv().await {
            pieces.fetch_add(1, Ordering::Relaxed);
            if to.send(piece).await.is_err() {
                return;
            }
        }
    });
    tx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn org(prompt: Option<&str>) -> Org {
        Org {
            id: "org_1".into(),
            name: "Acme".into(),
            system_prompt: prompt.map(str::to_owned),
            mcp: None,
            mcp_allow: Vec::new(),
            history: Default::default(),
            plan: "free".into(),
            deleted: false,
            created_at_ms: 0,
        }
    }

    fn system_message(org: &Org, turn_prompt: Option<&str>, return_markdown: bool) -> String {
        turn_system_message(
            org,
            &ChatTurn {
                messages: Vec::new(),
                system_prompt: turn_prompt.map(str::to_owned),
                return_markdown,
                sampling: Sampling::default(),
                budget: None,
                response_format: None,
            },
        )
    }

    #[test]
    fn organisation_prompt_comes_first_then_the_turn_then_the_format() {
        let s = system_message(&org(Some("You work for Acme.")), Some("Be brief."), false);
        assert_eq!(
            s,
            format!("You work for Acme.\n\nBe brief.\n\n{PLAIN_INSTRUCTION}")
        );
        let s = system_message(&org(None), None, true);
        assert_eq!(
            s,
            format!("{DEFAULT_SYSTEM_PROMPT}\n\n{MARKDOWN_INSTRUCTION}")
        );
        let s = system_message(&org(Some("  ")), Some("Turn only."), true);
        assert!(s.starts_with("Turn only."));
    }
}
