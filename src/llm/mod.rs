//! The LLM layer: one [`Provider`] interface over the embedded llama.cpp model and any
//! OpenAI-compatible upstream, the chat service that applies the organisation's system prompt
//! and MCP tools, Markdown stripping, and the analysis profiles (intent, BANT, NEAT-P).

pub mod chat;
pub mod embedded;
pub mod fair;
pub mod fair_provider;
pub mod markdown;
pub mod mcp;
pub mod pointer;
pub mod profiles;
pub mod schema;
pub mod sse;
pub mod upstream;

use serde::{Deserialize, Serialize};

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions.
    System,
    /// The end user.
    User,
    /// The model.
    Assistant,
    /// A tool's result.
    Tool,
}

/// A tool call the model asked for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Identifier to match the result to the call.
    pub id: String,
    /// Tool name.
    pub name: String,
    /// Arguments object.
    pub arguments: serde_json::Value,
}

/// One message of a conversation as the providers see it.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// Author.
    pub role: Role,
    /// Text.
    pub content: String,
    /// Calls made by an assistant message.
    pub tool_calls: Vec<ToolCall>,
    /// For a tool message: the call it answers.
    pub tool_call_id: Option<String>,
}

impl Message {
    /// A plain message.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }
}

/// A tool offered to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// Name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// JSON schema of its arguments.
    pub parameters: serde_json::Value,
}

/// Sampling settings of one generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    /// Most tokens to generate.
    pub max_tokens: u32,
    /// 0 is greedy.
    pub temperature: f32,
    /// Nucleus sampling mass, (0, 1].
    pub top_p: f32,
    /// Generation stops before any of these.
    pub stop: Vec<String>,
    /// -2 to 2.
    pub frequency_penalty: f32,
    /// -2 to 2.
    pub presence_penalty: f32,
    /// Seed for reproducible sampling.
    pub seed: Option<u64>,
}

impl Default for Sampling {
    fn default() -> Self {
        Self {
            max_tokens: 1024,
            temperature: 0.7,
            top_p: 1.0,
            stop: Vec::new(),
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            seed: None,
        }
    }
}

/// What a provider is asked to do.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// The conversation, system messages first.
    pub messages: Vec<Message>,
    /// Tools the model may call.
    pub tools: Vec<ToolSpec>,
    /// Sampling.
    pub sampling: Sampling,
    /// When set, the output must be JSON valid against this schema (grammar-constrained on
    /// the embedded model, `response_format` upstream).
    pub json_schema: Option<serde_json::Value>,
    /// The `response_format` an upstream server is sent for [`Generation::json_schema`], when
    /// a client gave its own (its name, its `strict`, or `json_object`); `None` sends the
    /// schema as a strict `json_schema` named `result`. The embedded model ignores it.
    pub response_format: Option<serde_json::Value>,
    /// When set, the probabilities of a few words at given points of the answer (the
    /// embedded model under a schema only; others leave [`Completion::odds`] empty).
    pub odds: Option<Odds>,
    /// The organisation the request is for. The embedded model reuses an evaluated prompt
    /// only for the same tenant (how fast a first token comes must not tell one organisation
    /// what another's prompt holds); `None` is the service's own work (benchmarks, the CLI).
    pub tenant: Option<String>,
    /// What the request is for, which decides its turn among other organisations' requests
    /// ([`fair`]).
    pub class: fair::Class,
}

impl Generation {
    /// Reading `messages` and answering nothing (a warm-up): `tenant`'s work of `class`.
    pub fn prompt_only(messages: Vec<Message>, tenant: Option<String>, class: fair::Class) -> Self {
        Self {
            messages,
            tools: Vec::new(),
            sampling: Sampling {
                max_tokens: 0,
                ..Sampling::default()
            },
            json_schema: None,
            response_format: None,
            odds: None,
            tenant,
            class,
        }
    }
}

/// Wherever the answer so far ends with `after` (white space aside: a JSON answer may be
/// spaced out), how likely the model finds each of `words` as what comes next (normalised
/// over what the grammar allows there), before it picks.
#[derive(Debug, Clone, PartialEq)]
pub struct Odds {
    /// The text that marks a point (`"status":"`), without white space.
    pub after: String,
    /// The words weighed there, e.g. the values of an enum.
    pub words: Vec<String>,
    /// A word (its index in `words`) the model may pick there only when it gives it at least
    /// this probability; below, the likeliest of the other words is written instead.
    pub floor: Option<(usize, f32)>,
    /// The answer ends at the first point weighed: for a caller that needs only the odds
    /// there (a model that gives no odds answers in full).
    pub only: bool,
}

/// Token counts of a generation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Usage {
    /// Tokens of the prompt.
    pub prompt_tokens: u64,
    /// Tokens generated.
    pub completion_tokens: u64,
    /// Both.
    pub total_tokens: u64,
}

impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, o: Self) {
        self.prompt_tokens += o.prompt_tokens;
        self.completion_tokens += o.completion_tokens;
        self.total_tokens += o.total_tokens;
    }
}

/// Why generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// The model ended its answer, or a stop string was met.
    Stop,
    /// `max_tokens` was reached.
    Length,
    /// The model asked for tools.
    ToolCalls,
}

/// The result of one generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// Text generated (tool-call markup removed).
    pub text: String,
    /// Tools the model asked for.
    pub tool_calls: Vec<ToolCall>,
    /// Token counts.
    pub usage: Usage,
    /// Why it stopped.
    pub finish: FinishReason,
    /// For each point [`Generation::odds`] marked, in the answer's order: where it is, and
    /// the probability of each of its words.
    pub odds: Vec<PointOdds>,
}

/// The odds taken at one point of an answer.
#[derive(Debug, Clone, PartialEq)]
pub struct PointOdds {
    /// The JSON Pointer of the value written there (`/budget/status`; see
    /// [`pointer::pointer_at_end`]).
    pub at: String,
    /// The probability of each of [`Odds::words`], in its order.
    pub p: Vec<f32>,
}

impl PointOdds {
    /// The odds at `at` among `odds`, when they weigh `words` words.
    pub fn find<'a>(odds: &'a [PointOdds], at: &str, words: usize) -> Option<&'a [f32]> {
        odds.iter()
            .find(|o| o.at == at && o.p.len() == words)
            .map(|o| o.p.as_slice())
    }
}

/// Tokens a chat template adds around each message, at most (role markers, separators).
const MESSAGE_OVERHEAD_TOKENS: u64 = 8;
/// Tokens a chat template adds to a conversation, at most (the assistant's opening, and the
/// tool-use instructions when tools are offered).
const PROMPT_OVERHEAD_TOKENS: u64 = 32;
const TOOLS_OVERHEAD_TOKENS: u64 = 256;

/// An upper bound of the prompt tokens of `messages` with `tools`: no token of a byte-level
/// tokenizer is shorter than one byte, so bytes bound tokens, plus the template's markers.
/// Reservations use it; it overstates, never understates.
pub fn prompt_bound(messages: &[Message], tools: &[ToolSpec]) -> u64 {
    let messages: u64 = messages
        .iter()
        .map(|m| {
            let calls: usize = m
                .tool_calls
                .iter()
                .map(|c| c.name.len() + c.id.len() + c.arguments.to_string().len() + 32)
                .sum();
            (m.content.len() + calls) as u64 + MESSAGE_OVERHEAD_TOKENS
        })
        .sum();
    let tools: u64 = if tools.is_empty() {
        0
    } else {
        TOOLS_OVERHEAD_TOKENS
            + tools
                .iter()
                .map(|t| {
                    (t.name.len() + t.description.len() + t.parameters.to_string().len()) as u64
                        + 16
                })
                .sum::<u64>()
    };
    messages + tools + PROMPT_OVERHEAD_TOKENS
}

/// Where streamed text goes, piece by piece, if anywhere.
pub type Deltas = Option<tokio::sync::mpsc::Sender<String>>;

/// Errors of the LLM layer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LlmError {
    /// The model's waiting room is full.
    #[error("the language model is busy; retry shortly")]
    Busy,
    /// The requesting organisation has as many requests waiting for the model as it may.
    #[error("this organisation has {waiting} requests waiting for the language model; retry after {}s", retry_after.as_secs())]
    OrgBusy {
        /// Its requests waiting.
        waiting: usize,
        /// When one is likely to have been served.
        retry_after: std::time::Duration,
    },
    /// The conversation does not fit the context window.
    #[error("the conversation is {prompt} tokens; the model's window is {limit}")]
    ContextOverflow {
        /// Prompt tokens.
        prompt: usize,
        /// Window.
        limit: usize,
    },
    /// The upstream provider answered with an error or nonsense.
    #[error("upstream model provider failed: {0}")]
    Upstream(String),
    /// The upstream provider did not answer in time.
    #[error("upstream model provider timed out")]
    UpstreamTimeout,
    /// The receiver of streamed text went away; generation was stopped. `usage` is what was
    /// spent until then (the provider's count, or an estimate when it gave none): it is billed.
    #[error("the client went away")]
    Cancelled {
        /// Tokens spent before the stop.
        usage: Usage,
    },
    /// The answer cannot be held to the schema the client gave (`response_format`).
    #[error("response_format: {0}")]
    Schema(String),
    /// The engine failed.
    #[error("language model failed: {0}")]
    Engine(String),
}

/// The provider the configuration names, ready to serve.
pub fn build_provider(
    config: &crate::config::Config,
) -> Result<std::sync::Arc<dyn Provider>, LlmError> {
    use crate::config::LlmProviderKind;
    let llm = &config.llm;
    let provider: std::sync::Arc<dyn Provider> = match llm.provider {
        LlmProviderKind::Embedded => {
            let model = embedded::EmbeddedLlm::load(
                &config.models.llm,
                embedded::EmbeddedConfig {
                    threads: llm.threads,
                    context_tokens: llm.context_tokens,
                    // The fair queue's places, and the one kept for live analyses.
                    sequences: llm.parallel + 1,
                    kv_cache_bytes: llm.kv_cache_mb.saturating_mul(1 << 20),
                    queue: llm.queue,
                    prefix_cache_entries: llm.prefix_cache_entries,
                    prefix_cache_bytes: llm.prefix_cache_mb.saturating_mul(1 << 20),
                    flash_attention: llm.flash_attention,
                    micro_batch: llm.micro_batch,
                    key_cache: llm.key_cache,
                    repack_weights: llm.repack_weights,
                    draft_tokens: llm.draft_tokens,
                    force_schema_text: llm.force_schema_text,
                },
            )?;
            // Analyses start with the same instructions (one prompt for a live call's intent,
            // one for a file's analyses): evaluate them now.
            for messages in profiles::warm_ups(profiles::Confidence::of(&model)) {
                model.warm(messages, None, fair::Class::Batch);
            }
            std::sync::Arc::new(model)
        }
        LlmProviderKind::Upstream => {
            std::sync::Arc::new(upstream::UpstreamLlm::new(upstream::UpstreamConfig {
                base_url: llm.upstream.base_url.clone(),
                api_key: llm.upstream.api_key.clone(),
                model: llm.upstream.model.clone(),
                timeout: std::time::Duration::from_millis(llm.upstream.timeout_ms),
                connect_timeout: std::time::Duration::from_millis(llm.upstream.connect_timeout_ms),
                extra_body: llm.upstream.extra_body().map_err(LlmError::Engine)?,
            })?)
        }
    };
    Ok(std::sync::Arc::new(fair_provider::FairProvider::new(
        provider,
        fair::FairSettings {
            parallel: llm.parallel,
            queue: llm.queue,
            queue_per_org: llm.queue_per_org,
        },
    )))
}

/// A language model that streams its answer.
#[async_trait::async_trait]
pub trait Provider: Send + Sync {
    /// Generates a completion for `generation`, sending text pieces to `deltas` as they come.
    async fn generate(
        &self,
        generation: Generation,
        deltas: Deltas,
    ) -> Result<Completion, LlmError>;

    /// Short name for logs (`embedded:qwen2.5...`, `upstream:gpt-4o-mini`).
    fn name(&self) -> &str;

    /// The answer keeps to [`Generation::json_schema`] token by token, whatever the schema's
    /// size (a grammar on the embedded model), so a schema may list every quote the answer
    /// may give. An upstream server may refuse or cut large schemas.
    fn keeps_to_any_schema(&self) -> bool {
        false
    }

    /// The model tells how likely it found the words at the points [`Generation::odds`]
    /// marks ([`Completion::odds`]), so an analysis weighs its record's confidence from them
    /// instead of asking the model to write it (the embedded model).
    fn gives_odds(&self) -> bool {
        false
    }

    /// Evaluates the prompt of `messages` ahead of a request of `tenant` and `class` expected
    /// to start the same way (a live call's transcript so far: [`fair::Class::Live`]), when the
    /// model keeps evaluated prompts. Nothing for models that do not (an upstream server).
    fn prefill(&self, messages: Vec<Message>, tenant: Option<String>, class: fair::Class) {
        let _ = (messages, tenant, class);
    }

    /// Stops the model for good: work in progress is given up and the engine is freed, on
    /// its own thread, within `within`. True once nothing of the model runs any more (at
    /// once for a model that runs nothing here, an upstream server). The process must not
    /// exit while an engine thread still runs: its exit tears down the engine's static
    /// state under it.
    fn stop(&self, within: std::time::Duration) -> bool {
        let _ = within;
        true
    }
}

/// `inner` serving `tenant`: every request it is given is marked as that organisation's, of
/// one class.
pub struct ForTenant {
    inner: std::sync::Arc<dyn Provider>,
    tenant: String,
    class: fair::Class,
}

/// `provider`, marking every request as `tenant`'s (see [`Generation::tenant`]) and of
/// `class` ([`Generation::class`]).
pub fn for_tenant(
    provider: std::sync::Arc<dyn Provider>,
    tenant: &str,
    class: fair::Class,
) -> std::sync::Arc<dyn Provider> {
    std::sync::Arc::new(ForTenant {
        inner: provider,
        tenant: tenant.to_owned(),
        class,
    })
}

#[async_trait::async_trait]
impl Provider for ForTenant {
    async fn generate(
        &self,
        mut generation: Generation,
        deltas: Deltas,
    ) -> Result<Completion, LlmError> {
        generation.tenant = Some(self.tenant.clone());
        generation.class = self.class;
        self.inner.generate(generation, deltas).await
    }

    fn name(&self) -> &str {
        self.inner.name()
    }

    fn keeps_to_any_schema(&self) -> bool {
        self.inner.keeps_to_any_schema()
    }

    fn gives_odds(&self) -> bool {
        self.inner.gives_odds()
    }

    fn prefill(&self, messages: Vec<Message>, _tenant: Option<String>, _class: fair::Class) {
        self.inner
            .prefill(messages, Some(self.tenant.clone()), self.class);
    }

    fn stop(&self, within: std::time::Duration) -> bool {
        self.inner.stop(within)
    }
}
