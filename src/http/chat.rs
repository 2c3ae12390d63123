//! `POST /api/llm/chat/completions`: one chat turn, answered whole.
//!
//! Request checks (400 with a code naming the field): `messages` a non-empty array (at most
//! 256) of `{role: "user"|"assistant"|"system", content: string}` (non-empty but for the
//! assistant's); `return_markdown`
//! a boolean (required); `max_tokens` an integer 1-4096 (default 1024); `temperature` 0-2
//! (default 0.7); `top_p` over 0 up to 1 (default 1); `stop` a string or up to 4 strings;
//! `frequency_penalty` and `presence_penalty` -2 to 2 (default 0); `seed` a non-negative
//! integer; `system_prompt` a string layered on the organisation's prompt; `user` an opaque
//! end-user id (at most 256 characters) recorded with the usage; `stream` a boolean (true:
//! server-sent events, see [`crate::http::chat_stream`]) and `stream_options.include_usage`;
//! `response_format` `{"type": "text"}`, `{"type": "json_object"}` or `{"type": "json_schema",
//! "json_schema": {"name", "schema", "strict"?, "description"?}}` (the schema an object of at
//! most 16 KiB; on the embedded model also within [`crate::llm::schema`]'s bounds).
//! An assistant message's content may be empty or null; content may also be OpenAI-style
//! text parts. Other fields are ignored.

use serde::Serialize;
use serde_json::Value;
use warp::{Filter, Rejection, Reply};

use callstream_actors::usage::{UsageKind, UsageSource};

use crate::app::App;
use crate::auth::Caller;
use crate::http::errors::ApiError;
use crate::llm::chat::{ChatTurn, ResponseFormat};
use crate::llm::{FinishReason, Message, Role, Sampling, Usage};

/// Largest request body.
pub const MAX_BODY: u64 = 1 << 20;
/// Most messages in a conversation.
pub const MAX_MESSAGES: usize = 256;
/// Token cap of realtime turns, fixed by the contract.
pub const REALTIME_MAX_TOKENS: u32 = 4096;
/// Temperature of realtime turns, fixed by the contract.
pub const REALTIME_TEMPERATURE: f32 = 0.2;
/// Longest schema of a `response_format`, in bytes of compact JSON.
pub const MAX_SCHEMA_BYTES: usize = 16 * 1024;
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

/// A request that failed its checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// Stable code.
    pub code: &'static str,
    /// What is wrong.
    pub message: String,
}

fn invalid(code: &'static str, message: impl Into<String>) -> Invalid {
    Invalid {
        code,
        message: message.into(),
    }
}

impl From<Invalid> for ApiError {
    fn from(i: Invalid) -> Self {
        ApiError::BadRequest {
            code: i.code,
            message: i.message,
        }
    }
}

/// A checked turn.
#[derive(Debug, Clone)]
pub struct ParsedTurn {
    /// The turn for the chat service.
    pub turn: ChatTurn,
    /// End-user id for billing.
    pub user: Option<String>,
    /// `stream: true`: answer with server-sent events; `Some(true)` when the last event is to
    /// carry the usage (`stream_options.include_usage`).
    pub stream: Option<bool>,
}

/// The fields REST and realtime share.
#[derive(Debug, Clone)]
pub struct CommonFields {
    /// The conversation.
    pub messages: Vec<Message>,
    /// Markdown or plain prose.
    pub return_markdown: bool,
    /// The turn's system prompt.
    pub system_prompt: Option<String>,
    /// End-user id.
    pub user: Option<String>,
}

/// Checks the parts REST and realtime share: messages, return_markdown, system_prompt, user.
pub fn parse_common(body: &Value) -> Result<CommonFields, Invalid> {
    let obj = body
        .as_object()
        .ok_or_else(|| invalid("invalid_json", "the body must be a JSON object"))?;
    let messages = obj
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| {
            invalid(
                "invalid_messages",
                "messages must be an array of {role, content}",
            )
        })?;
    if messages.is_empty() {
        return Err(invalid("invalid_messages", "messages must not be empty"));
    }
    if messages.len() > MAX_MESSAGES {
        return Err(invalid(
            "invalid_messages",
            format!("at most {MAX_MESSAGES} messages"),
        ));
    }
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let role = match m.get("role").and_then(Value::as_str) {
            Some("user") => Role::User,
            Some("assistant") => Role::Assistant,
            Some("system") => Role::System,
            _ => {
                return Err(invalid(
                    "invalid_messages",
                    format!("messages[{i}].role must be \"user\", \"assistant\" or \"system\""),
                ))
            }
        };
        // A string, or OpenAI-style text parts. An assistant message may be empty (or null):
        // a turn that ended at the tool-loop cap answered "", and clients send history back.
        let content = match m.get("content") {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Array(parts)) => text_parts(parts),
            None | Some(Value::Null) if role == Role::Assistant => Some(String::new()),
            _ => None,
        }
        .filter(|c| role == Role::Assistant || !c.trim().is_empty())
        .ok_or_else(|| {
            invalid(
                "invalid_messages",
                format!(
                    "messages[{i}].content must be a non-empty string or text parts (an assistant's may be empty)"
                ),
            )
        })?;
        out.push(Message::new(role, content));
    }
    let return_markdown = match obj.get("return_markdown") {
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(invalid(
                "invalid_return_markdown",
                "return_markdown must be a boolean",
            ))
        }
        None => {
            return Err(invalid(
                "missing_return_markdown",
                "return_markdown is required (true or false)",
            ))
        }
    };
    let system_prompt = match obj.get("system_prompt") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.len() <= 32_000 => Some(s.clone()),
        Some(_) => {
            return Err(invalid(
                "invalid_system_prompt",
                "system_prompt must be a string of at most 32000 bytes",
            ))
        }
    };
    let user = match obj.get("user") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.chars().count() <= 256 => Some(s.clone()),
        Some(_) => {
            return Err(invalid(
                "invalid_user",
                "user must be a string of at most 256 characters",
            ))
        }
    };
    Ok(CommonFields {
        messages: out,
        return_markdown,
        system_prompt,
        user,
    })
}

/// The text of OpenAI-style content parts (`[{"type": "text", "text": "..."}]`), joined; `None`
/// when a part is not text.
fn text_parts(parts: &[Value]) -> Option<String> {
    parts
        .iter()
        .map(|p| {
            (p.get("type").and_then(Value::as_str) == Some("text"))
                .then(|| p.get("text").and_then(Value::as_str))
                .flatten()
        })
        .collect::<Option<Vec<&str>>>()
        .map(|texts| texts.concat())
}

fn number(
    obj: &serde_json::Map<String, Value>,
    field: &'static str,
    lo: f64,
    hi: f64,
    lo_open: bool,
) -> Result<Option<f64>, Invalid> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => {
            let x = v
                .as_f64()
                .ok_or_else(|| invalid("invalid_sampling", format!("{field} must be a number")))?;
            let ok = if lo_open { x > lo } else { x >= lo } && x <= hi;
            if !ok {
                let open = if lo_open { "over" } else { "from" };
                return Err(invalid(
                    "invalid_sampling",
                    format!("{field} must be {open} {lo} up to {hi}"),
                ));
            }
            Ok(Some(x))
        }
    }
}

/// Checks a REST request body.
pub fn parse_rest(body: &Value) -> Result<ParsedTurn, Invalid> {
    let CommonFields {
        messages,
        return_markdown,
        system_prompt,
        user,
    } = parse_common(body)?;
    let obj = body
        .as_object()
        .expect("parse_common checked it is an object");
    let mut sampling = Sampling::default();
    match obj.get("max_tokens") {
        None | Some(Value::Null) => {}
        Some(v) => match v.as_u64() {
            Some(n) if (1..=u64::from(REALTIME_MAX_TOKENS)).contains(&n) => {
                sampling.max_tokens = n as u32
            }
            _ => {
                return Err(invalid(
                    "invalid_sampling",
                    "max_tokens must be an integer from 1 to 4096",
                ))
            }
        },
    }
    if let Some(t) = number(obj, "temperature", 0.0, 2.0, false)? {
        sampling.temperature = t as f32;
    }
    if let Some(p) = number(obj, "top_p", 0.0, 1.0, true)? {
        sampling.top_p = p as f32;
    }
    if let Some(p) = number(obj, "frequency_penalty", -2.0, 2.0, false)? {
        sampling.frequency_penalty = p as f32;
    }
    if let Some(p) = number(obj, "presence_penalty", -2.0, 2.0, false)? {
        sampling.presence_penalty = p as f32;
    }
    sampling.stop = match obj.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) if !s.is_empty() => vec![s.clone()],
        Some(Value::Array(a))
            if a.len() <= 4 && a.iter().all(|s| s.as_str().is_some_and(|s| !s.is_empty())) =>
        {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        }
        Some(_) => {
            return Err(invalid(
                "invalid_sampling",
                "stop must be a non-empty string or an array of up to 4 of them",
            ))
        }
    };
    match obj.get("seed") {
        None | Some(Value::Null) => {}
        Some(v) => {
            sampling.seed = Some(v.as_u64().ok_or_else(|| {
                invalid("invalid_sampling", "seed must be a non-negative integer")
            })?)
        }
    }
    let stream = match obj.get("stream") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => None,
        Some(Value::Bool(true)) => Some(
            match obj
                .get("stream_options")
                .and_then(|o| o.get("include_usage"))
            {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => {
                    return Err(invalid(
                        "invalid_stream",
                        "stream_options.include_usage must be a boolean",
                    ))
                }
            },
        ),
        Some(_) => return Err(invalid("invalid_stream", "stream must be a boolean")),
    };
    let response_format = parse_response_format(obj.get("response_format"))?;
    Ok(ParsedTurn {
        stream,
        turn: ChatTurn {
            messages,
            system_prompt,
            return_markdown,
            sampling,
            budget: None,
            response_format,
        },
        user,
    })
}

/// Checks `response_format`: plain text (`None`), any JSON object, or JSON valid against the
/// client's schema. The schema is passed on as given; what an upstream server is sent is
/// the client's own `response_format`, rebuilt from the fields checked here.
fn parse_response_format(value: Option<&Value>) -> Result<Option<ResponseFormat>, Invalid> {
    let bad = |message: &str| invalid("invalid_response_format", message);
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let kind = value.get("type").and_then(Value::as_str);
    match kind {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(ResponseFormat {
            schema: serde_json::json!({"type": "object"}),
            wire: serde_json::json!({"type": "json_object"}),
        })),
        Some("json_schema") => {
            let spec = value
                .get("json_schema")
                .and_then(Value::as_object)
                .ok_or_else(|| bad("response_format.json_schema must be an object"))?;
            let name = spec
                .get("name")
                .and_then(Value::as_str)
                .filter(|n| {
                    (1..=64).contains(&n.len())
                        && n.bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
                })
                .ok_or_else(|| {
                    bad("response_format.json_schema.name must be 1-64 letters, digits, _ or -")
                })?;
            let schema = spec
                .get("schema")
                .filter(|s| s.is_object())
                .ok_or_else(|| bad("response_format.json_schema.schema must be a JSON object"))?;
            if schema.to_string().len() > MAX_SCHEMA_BYTES {
                return Err(bad(&format!(
                    "response_format.json_schema.schema must be at most {MAX_SCHEMA_BYTES} bytes"
                )));
            }
            let mut wire = serde_json::Map::new();
            wire.insert("name".into(), Value::from(name));
            wire.insert("schema".into(), schema.clone());
            match spec.get("strict") {
                None | Some(Value::Null) => {}
                Some(Value::Bool(b)) => {
                    wire.insert("strict".into(), Value::Bool(*b));
                }
                Some(_) => return Err(bad("response_format.json_schema.strict must be a boolean")),
            }
            match spec.get("description") {
                None | Some(Value::Null) => {}
                Some(Value::String(d)) if d.len() <= 4096 => {
                    wire.insert("description".into(), Value::from(d.as_str()));
                }
                Some(_) => {
                    return Err(bad(
                        "response_format.json_schema.description must be a string of at most 4096 bytes",
                    ))
                }
            }
            Ok(Some(ResponseFormat {
                schema: schema.clone(),
                wire: serde_json::json!({"type": "json_schema", "json_schema": wire}),
            }))
        }
        _ => Err(bad(
            "response_format.type must be \"text\", \"json_object\" or \"json_schema\"",
        )),
    }
}

/// One answer of a chat completion.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Choice {
    /// Always 0: one answer per request.
    pub index: u32,
    /// The answer.
    pub message: AssistantMessage,
    /// Why generation stopped.
    pub finish_reason: FinishReason,
}

/// The assistant's message.
#[derive(Serialize, utoipa::ToSchema)]
pub struct AssistantMessage {
    /// `assistant`.
    pub role: &'static str,
    /// The answer's text (plain prose unless `return_markdown` or a `response_format`).
    pub content: String,
}

/// The body of a chat completion that is not streamed.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = ChatCompletion)]
pub struct Response {
    /// `chatcmpl-...`.
    pub id: String,
    /// `chat.completion`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: i64,
    /// The model that answered.
    pub model: String,
    /// One choice.
    pub choices: Vec<Choice>,
    /// Tokens billed.
    pub usage: Option<Usage>,
}

/// Reserves the worst case of `turn` (its prompt and `max_tokens`) against the caller's token
/// quota. When less is left, the turn runs with what is left, its answer cut to fit; when not
/// even its prompt fits, it is refused (402). A limited quota also bounds the tool loop.
pub async fn reserve_turn(
    app: &App,
    caller: &Caller,
    turn: &mut ChatTurn,
) -> Result<crate::usage::Reservation, crate::auth::AuthError> {
    let (prompt, worst) = app.chat.worst_case(&caller.org, turn);
    let reservation = app
        .auth
        .reserve(
            caller,
            UsageKind::Tokens,
            worst,
            prompt + 1,
            crate::clock::now_ms(),
        )
        .await?;
    if caller.plan.chat_tokens_per_month.is_some() {
        turn.budget = Some(reservation.amount());
    }
    Ok(reservation)
}

/// `POST /api/llm/chat/completions`.
pub fn routes(app: App) -> impl Filter<Extract = (impl Reply,), Error = Rejection> + Clone {
    warp::path!("api" / "llm" / "chat" / "completions")
        .and(warp::post())
        .and(crate::http::filters::billed(app.clone(), UsageKind::Tokens))
        .and(warp::body::content_length_limit(MAX_BODY))
        .and(warp::body::bytes())
        .and_then(move |caller: Caller, body: bytes::Bytes| {
            let app = app.clone();
            async move {
                complete(app, caller, &body)
                    .await
                    .map_err(warp::reject::custom)
            }
        })
}

async fn complete(
    app: App,
    caller: Caller,
    body: &[u8],
) -> Result<warp::reply::Response, ApiError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| ApiError::BadRequest {
        code: "invalid_json",
        message: format!("the body is not valid JSON: {e}"),
    })?;
    let parsed = parse_rest(&value)?;
    // A structured answer is given as the model wrote it: Markdown rules would break its JSON.
    let return_markdown = parsed.turn.return_markdown || parsed.turn.response_format.is_some();
    let mut turn = parsed.turn;
    if let Some(format) = turn.response_format.as_mut() {
        if app.llm.keeps_to_any_schema() {
            format.schema =
                crate::llm::schema::prepare(&format.schema).map_err(|e| ApiError::BadRequest {
                    code: "invalid_response_format",
                    message: format!("response_format.json_schema.schema: {e}"),
                })?;
        }
    }
    let reservation = reserve_turn(&app, &caller, &mut turn).await?;
    if let Some(include_usage) = parsed.stream {
        return crate::http::chat_stream::stream(
            app,
            caller,
            turn,
            parsed.user,
            reservation,
            include_usage,
        )
        .await;
    }
    let outcome = app.chat.run(&caller.org, turn, None).await?;
    reservation
        .settle(
            &caller.account(),
            outcome.billed.total_tokens,
            UsageSource::Chat,
            parsed.user,
        )
        .await
        .map_err(|e| ApiError::Billing(e.to_string()))?;
    let content = if return_markdown {
        outcome.text
    } else {
        crate::llm::markdown::to_plain(&outcome.text)
    };
    let response = Response {
        id: crate::store::new_id("chatcmpl-", 12),
        object: "chat.completion",
        created: crate::clock::now_ms() / 1000,
        model: app.llm.name().to_owned(),
        choices: vec![Choice {
            index: 0,
            message: AssistantMessage {
                role: "assistant",
                content,
            },
            finish_reason: outcome.finish,
        }],
        usage: outcome.usage,
    };
    Ok(warp::reply::json(&response).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ok(body: Value) -> ParsedTurn {
        parse_rest(&body).unwrap()
    }

    fn err(body: Value) -> &'static str {
        parse_rest(&body).unwrap_err().code
    }

    #[test]
    fn accepts_a_full_request() {
        let t = ok(
            json!({"messages": [{"role": "user", "content": "hi"}], "return_markdown": false,
            "max_tokens": 10, "temperature": 0, "top_p": 0.5, "stop": ["\n\n"], "frequency_penalty": -1,
            "presence_penalty": 2, "seed": 7, "system_prompt": "Be brief.", "user": "u-1", "model": "ignored"}),
        );
        assert_eq!(t.turn.sampling.max_tokens, 10);
        assert_eq!(t.turn.sampling.stop, ["\n\n"]);
        assert_eq!(t.turn.sampling.seed, Some(7));
        assert_eq!(t.user.as_deref(), Some("u-1"));
        assert!(!t.turn.return_markdown);
    }

    #[test]
    fn rejects_bad_fields_with_their_code() {
        let m = json!([{"role": "user", "content": "hi"}]);
        assert_eq!(err(json!({"messages": m})), "missing_return_markdown");
        assert_eq!(
            err(json!({"messages": m, "return_markdown": "yes"})),
            "invalid_return_markdown"
        );
        assert_eq!(
            err(json!({"messages": [], "return_markdown": true})),
            "invalid_messages"
        );
        assert_eq!(
            err(json!({"messages": [{"role": "bot", "content": "x"}], "return_markdown": true})),
            "invalid_messages"
        );
        assert_eq!(
            err(json!({"messages": [{"role": "user", "content": " "}], "return_markdown": true})),
            "invalid_messages"
        );
        assert_eq!(err(json!([1, 2])), "invalid_json");
        for (field, value) in [
            ("max_tokens", json!(0)),
            ("max_tokens", json!(4097)),
            ("max_tokens", json!(1.5)),
            ("temperature", json!(2.5)),
            ("temperature", json!(-0.1)),
            ("top_p", json!(0)),
            ("top_p", json!(1.1)),
            ("frequency_penalty", json!(3)),
            ("presence_penalty", json!(-2.5)),
            ("stop", json!(["a", "b", "c", "d", "e"])),
            ("stop", json!("")),
            ("seed", json!(-1)),
            ("temperature", json!("hot")),
        ] {
            let mut body = json!({"messages": m, "return_markdown": true});
            body[field] = value.clone();
            assert_eq!(err(body), "invalid_sampling", "{field} = {value}");
        }
        assert_eq!(
            err(json!({"messages": m, "return_markdown": true, "user": 5})),
            "invalid_user"
        );
    }

    #[test]
    fn response_formats_are_checked_and_rebuilt_for_the_upstream() {
        let m = json!([{"role": "user", "content": "hi"}]);
        let with = |format: Value| json!({"messages": m, "return_markdown": true, "response_format": format});
        assert!(ok(with(json!({"type": "text"})))
            .turn
            .response_format
            .is_none());
        assert!(ok(with(Value::Null)).turn.response_format.is_none());
        let object = ok(with(json!({"type": "json_object"})))
            .turn
            .response_format
            .unwrap();
        assert_eq!(object.schema, json!({"type": "object"}));
        assert_eq!(object.wire, json!({"type": "json_object"}));
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let named = ok(with(json!({"type": "json_schema", "json_schema": {
            "name": "reply_v2", "schema": schema, "strict": true, "description": "d", "other": 1}})))
        .turn
        .response_format
        .unwrap();
        assert_eq!(named.schema, schema);
        // Only the fields checked go on, as they came.
        assert_eq!(
            named.wire,
            json!({"type": "json_schema", "json_schema": {"name": "reply_v2", "schema": schema, "strict": true, "description": "d"}})
        );
        let big = json!({"type": "object", "description": "x".repeat(MAX_SCHEMA_BYTES)});
        for bad in [
            json!("json_object"),
            json!({"type": "yaml"}),
            json!({}),
            json!({"type": "json_schema"}),
            json!({"type": "json_schema", "json_schema": {"schema": schema}}),
            json!({"type": "json_schema", "json_schema": {"name": "has space", "schema": schema}}),
            json!({"type": "json_schema", "json_schema": {"name": "x".repeat(65), "schema": schema}}),
            json!({"type": "json_schema", "json_schema": {"name": "r"}}),
            json!({"type": "json_schema", "json_schema": {"name": "r", "schema": [1]}}),
            json!({"type": "json_schema", "json_schema": {"name": "r", "schema": schema, "strict": "yes"}}),
            json!({"type": "json_schema", "json_schema": {"name": "r", "schema": schema, "description": 3}}),
            json!({"type": "json_schema", "json_schema": {"name": "r", "schema": big}}),
        ] {
            assert_eq!(err(with(bad.clone())), "invalid_response_format", "{bad}");
        }
    }
}
