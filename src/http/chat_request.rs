//! A chat request as typed structs: the fields REST and realtime share ([`ChatCommon`]) and
//! those only REST takes ([`ChatOptions`]). They are read with `serde_path_to_error`, so a
//! field of the wrong type is refused with the field's path (`messages[2].role: unknown
//! variant ...`) and the code of the field it is in ([`code_of`]); the ranges serde cannot
//! say are checked after, in `chat.rs`. Fields neither struct knows are ignored.

use serde::{Deserialize, Deserializer};
use serde_json::Value;
use utoipa::ToSchema;

/// Sampling fields only the REST endpoint takes.
pub const SAMPLING_FIELDS: [&str; 7] = [
    "max_tokens",
    "temperature",
    "top_p",
    "stop",
    "frequency_penalty",
    "presence_penalty",
    "seed",
];

/// The fields REST and realtime share.
#[derive(Debug, Deserialize, ToSchema)]
pub struct ChatCommon {
    /// 1 to 256 messages; content non-empty but for an assistant's.
    #[serde(default)]
    #[schema(required = true)]
    pub messages: Option<Vec<ChatMessage>>,
    /// `true`: the answer as the model wrote it; `false`: Markdown turned into plain prose.
    /// Required: absent is `missing_return_markdown`, anything but a boolean (`null` too)
    /// `invalid_return_markdown`.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = bool, required = true)]
    pub return_markdown: Option<Option<bool>>,
    /// Layered after the organisation's system prompt (at most 32,000 bytes).
    pub system_prompt: Option<String>,
    /// Opaque end-user id (at most 256 characters), recorded with the usage.
    pub user: Option<String>,
}

/// One message of the conversation.
#[derive(Debug, Deserialize, ToSchema)]
pub struct ChatMessage {
    /// Who wrote it.
    pub role: ChatRole,
    /// Its text, or OpenAI-style text parts; an assistant's may be empty or `null`.
    #[serde(default)]
    pub content: Option<Content>,
}

/// The roles a client may send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ChatRole {
    /// Instructions.
    System,
    /// The end user.
    User,
    /// An earlier answer.
    Assistant,
}

/// A message's content: text, or parts of text.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Content {
    /// The text.
    Text(String),
    /// `[{"type": "text", "text": "..."}]`, joined; a part of another type is refused.
    Parts(Vec<ContentPart>),
}

/// One part of a message's content.
#[derive(Debug, Deserialize, ToSchema)]
pub struct ContentPart {
    /// `text` (the only kind taken).
    #[serde(rename = "type")]
    pub kind: String,
    /// The part's text.
    pub text: Option<String>,
}

/// The fields only `POST /api/llm/chat/completions` takes.
#[derive(Debug, Deserialize, ToSchema)]
pub struct ChatOptions {
    /// 1 to 4096 (default 1024).
    #[schema(minimum = 1, maximum = 4096)]
    pub max_tokens: Option<u32>,
    /// 0 to 2 (default 0.7; 0 is greedy).
    #[schema(minimum = 0, maximum = 2)]
    pub temperature: Option<f64>,
    /// Over 0, up to 1 (default 1).
    #[schema(exclusive_minimum = 0, maximum = 1)]
    pub top_p: Option<f64>,
    /// A non-empty string, or up to 4 of them.
    pub stop: Option<Stop>,
    /// -2 to 2 (default 0).
    #[schema(minimum = -2, maximum = 2)]
    pub frequency_penalty: Option<f64>,
    /// -2 to 2 (default 0).
    #[schema(minimum = -2, maximum = 2)]
    pub presence_penalty: Option<f64>,
    /// Non-negative; random when absent.
    pub seed: Option<u64>,
    /// `true`: the answer as server-sent events (`text/event-stream`), OpenAI's chunk format.
    pub stream: Option<bool>,
    /// With `stream`: `include_usage` adds a last chunk with the token counts.
    pub stream_options: Option<StreamOptions>,
    /// Plain text, any JSON object, or JSON valid against the client's schema.
    pub response_format: Option<ResponseFormatRequest>,
}

/// `stop`: one string or several.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Stop {
    /// One stop string.
    One(String),
    /// Up to 4.
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Deserialize, ToSchema)]
pub struct StreamOptions {
    /// Add a last chunk with the usage.
    pub include_usage: Option<bool>,
}

/// `response_format`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseFormatRequest {
    /// Plain text (as without a `response_format`).
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON valid against `json_schema.schema`.
    JsonSchema {
        /// The schema and its name.
        json_schema: JsonSchemaSpec,
    },
}

/// `response_format.json_schema`.
#[derive(Debug, Deserialize, ToSchema)]
pub struct JsonSchemaSpec {
    /// 1 to 64 letters, digits, `_` or `-`.
    pub name: String,
    /// A JSON schema (an object of at most 16 KiB).
    #[schema(value_type = Object)]
    pub schema: Value,
    /// Passed on to an upstream model.
    pub strict: Option<bool>,
    /// Passed on to an upstream model (at most 4096 bytes).
    pub description: Option<String>,
}

/// A field present (even `null`) is `Some`; `#[serde(default)]` makes an absent one `None`.
fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// Reads `T` from `body`; the error names the field's path and gives the code of the field
/// it is in (see [`code_of`]).
pub fn read<'a, T: Deserialize<'a>>(body: &'a Value) -> Result<T, (&'static str, String)> {
    serde_path_to_error::deserialize(body).map_err(|e| {
        let field = e.path().iter().find_map(|segment| match segment {
            serde_path_to_error::Segment::Map { key } => Some(key.clone()),
            _ => None,
        });
        let code = field.as_deref().map_or("invalid_json", code_of);
        (code, format!("{}: {}", e.path(), e.inner()))
    })
}

/// The error code of a request field (spec: Chat): the field's own where it has one, the
/// group's for sampling and streaming.
pub fn code_of(field: &str) -> &'static str {
    match field {
        "messages" => "invalid_messages",
        "return_markdown" => "invalid_return_markdown",
        "system_prompt" => "invalid_system_prompt",
        "user" => "invalid_user",
        "stream" | "stream_options" => "invalid_stream",
        "response_format" => "invalid_response_format",
        f if SAMPLING_FIELDS.contains(&f) => "invalid_sampling",
        _ => "invalid_json",
    }
}
