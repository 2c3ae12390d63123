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
//! text parts. Other fields are ignored. The body is read into typed structs
//! ([`crate::http::chat_request`]): a field of the wrong type is refused with its path in the
//! message (`messages[1].role: unknown variant ...`) and its field's code.

use serde::Serialize;
use serde_json::Value;
use warp::{Filter, Rejection, Reply};

use callstream_actors::usage::{UsageKind, UsageSource};

use crate::app::App;
use crate::auth::Caller;
use crate::http::chat_request::{
    read, ChatCommon, ChatOptions, ChatRole, Content, ContentPart, ResponseFormatRequest, Stop,
};
use crate::http::errors::ApiError;
use crate::llm::chat::{ChatOutcome, ChatTurn, ResponseFormat};
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
pub use crate::http::chat_request::SAMPLING_FIELDS;

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
    if !body.is_object() {
        return Err(invalid("invalid_json", "the body must be a JSON object"));
    }
    let wire: ChatCommon = read(body).map_err(|(code, message)| invalid(code, message))?;
    let messages = wire.messages.ok_or_else(|| {
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
    for (i, m) in messages.into_iter().enumerate() {
        let role = match m.role {
            ChatRole::User => Role::User,
            ChatRole::Assistant => Role::Assistant,
            ChatRole::System => Role::System,
        };
        // A string, or OpenAI-style text parts. An assistant message may be empty (or null):
        // a turn that ended at the tool-loop cap answered "", and clients send history back.
        let content = match m.content {
            Some(Content::Text(s)) => Some(s),
            Some(Content::Parts(parts)) => text_parts(parts),
            None if role == Role::Assistant => Some(String::new()),
            None => None,
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
    let return_markdown = match wire.return_markdown {
        Some(Some(b)) => b,
        Some(None) => {
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
    if wire
        .system_prompt
        .as_ref()
        .is_some_and(|s| s.len() > 32_000)
    {
        return Err(invalid(
            "invalid_system_prompt",
            "system_prompt must be a string of at most 32000 bytes",
        ));
    }
    if wire.user.as_ref().is_some_and(|s| s.chars().count() > 256) {
        return Err(invalid(
            "invalid_user",
            "user must be a string of at most 256 characters",
        ));
    }
    Ok(CommonFields {
        messages: out,
        return_markdown,
        system_prompt: wire.system_prompt,
        user: wire.user,
    })
}

/// The text of OpenAI-style content parts (`[{"type": "text", "text": "..."}]`), joined; `None`
/// when a part is not text.
fn text_parts(parts: Vec<ContentPart>) -> Option<String> {
    parts
        .into_iter()
        .map(|p| (p.kind == "text").then_some(p.text).flatten())
        .collect::<Option<Vec<String>>>()
        .map(|texts| texts.concat())
}

/// `value` of `field` when it lies from `lo` (over `lo` when `lo_open`) up to `hi`.
fn within(
    field: &'static str,
    value: Option<f64>,
    lo: f64,
    hi: f64,
    lo_open: bool,
) -> Result<Option<f64>, Invalid> {
    let Some(x) = value else {
        return Ok(None);
    };
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

/// Checks a REST request body.
pub fn parse_rest(body: &Value) -> Result<ParsedTurn, Invalid> {
    let CommonFields {
        messages,
        return_markdown,
        system_prompt,
        user,
    } = parse_common(body)?;
    let wire: ChatOptions = read(body).map_err(|(code, message)| invalid(code, message))?;
    let mut sampling = Sampling::default();
    match wire.max_tokens {
        None => {}
        Some(n) if (1..=REALTIME_MAX_TOKENS).contains(&n) => sampling.max_tokens = n,
        Some(_) => {
            return Err(invalid(
                "invalid_sampling",
                "max_tokens must be an integer from 1 to 4096",
            ))
        }
    }
    if let Some(t) = within("temperature", wire.temperature, 0.0, 2.0, false)? {
        sampling.temperature = t as f32;
    }
    if let Some(p) = within("top_p", wire.top_p, 0.0, 1.0, true)? {
        sampling.top_p = p as f32;
    }
    if let Some(p) = within(
        "frequency_penalty",
        wire.frequency_penalty,
        -2.0,
        2.0,
        false,
    )? {
        sampling.frequency_penalty = p as f32;
    }
    if let Some(p) = within("presence_penalty", wire.presence_penalty, -2.0, 2.0, false)? {
        sampling.presence_penalty = p as f32;
    }
    sampling.stop = match wire.stop {
        None => Vec::new(),
        Some(Stop::One(s)) if !s.is_empty() => vec![s],
        Some(Stop::Many(all)) if all.len() <= 4 && all.iter().all(|s| !s.is_empty()) => all,
        Some(_) => {
            return Err(invalid(
                "invalid_sampling",
                "stop must be a non-empty string or an array of up to 4 of them",
            ))
        }
    };
    sampling.seed = wire.seed;
    let stream = match wire.stream {
        Some(true) => Some(
            wire.stream_options
                .and_then(|o| o.include_usage)
                .unwrap_or(false),
        ),
        None | Some(false) => None,
    };
    let response_format = parse_response_format(wire.response_format)?;
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
fn parse_response_format(
    format: Option<ResponseFormatRequest>,
) -> Result<Option<ResponseFormat>, Invalid> {
    let bad = |message: &str| invalid("invalid_response_format", message);
    match format {
        None | Some(ResponseFormatRequest::Text) => Ok(None),
        Some(ResponseFormatRequest::JsonObject) => Ok(Some(ResponseFormat {
            schema: serde_json::json!({"type": "object"}),
            wire: serde_json::json!({"type": "json_object"}),
        })),
        Some(ResponseFormatRequest::JsonSchema { json_schema: spec }) => {
            let name_ok = (1..=64).contains(&spec.name.len())
                && spec
                    .name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
            if !name_ok {
                return Err(bad(
                    "response_format.json_schema.name must be 1-64 letters, digits, _ or -",
                ));
            }
            if !spec.schema.is_object() {
                return Err(bad(
                    "response_format.json_schema.schema must be a JSON object",
                ));
            }
            if spec.schema.to_string().len() > MAX_SCHEMA_BYTES {
                return Err(bad(&format!(
                    "response_format.json_schema.schema must be at most {MAX_SCHEMA_BYTES} bytes"
                )));
            }
            if spec.description.as_ref().is_some_and(|d| d.len() > 4096) {
                return Err(bad(
                    "response_format.json_schema.description must be a string of at most 4096 bytes",
                ));
            }
            let mut wire = serde_json::Map::new();
            wire.insert("name".into(), Value::from(spec.name));
            wire.insert("schema".into(), spec.schema.clone());
            if let Some(strict) = spec.strict {
                wire.insert("strict".into(), Value::Bool(strict));
            }
            if let Some(description) = spec.description {
                wire.insert("description".into(), Value::from(description));
            }
            Ok(Some(ResponseFormat {
                schema: spec.schema,
                wire: serde_json::json!({"type": "json_schema", "json_schema": wire}),
            }))
        }
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

/// Runs `turn` for `caller` and bills it, on a task of its own: a client that hangs up (this
/// future is dropped) stops the model at its next token, and what was generated until then is
/// billed, as is what a turn that fails spent before it did.
async fn run_billed(
    app: &App,
    caller: Caller,
    turn: ChatTurn,
    user: Option<String>,
    reservation: crate::usage::Reservation,
) -> Result<ChatOutcome, ApiError> {
    // Nobody reads the pieces, but while this future lives their receiver does.
    let (pieces, mut receiver) = tokio::sync::mpsc::channel::<String>(64);
    let (end_tx, end_rx) = tokio::sync::oneshot::channel();
    let runner = app.clone();
    tokio::spawn(async move {
        // The process waits for this turn to be billed before it exits.
        let _work = runner.lifecycle.work();
        let result = runner.chat.run(&caller.org, turn, Some(pieces)).await;
        let billed = match &result {
            Ok(outcome) => outcome.billed.total_tokens,
            Err(failed) => failed.spent.total_tokens,
        };
        let settled = reservation
            .settle(&caller.account(), billed, UsageSource::Chat, user)
            .await;
        let end = match (result, settled) {
            (Ok(outcome), Ok(())) => Ok(outcome),
            (Ok(_), Err(e)) => Err(ApiError::Billing(e.to_string())),
            (Err(failed), _) => Err(ApiError::Llm(failed.error)),
        };
        let _ = end_tx.send(end);
    });
    while receiver.recv().await.is_some() {}
    end_rx
        .await
        .unwrap_or_else(|_| Err(ApiError::Internal("the chat turn ended unanswered".into())))
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
    let outcome = run_billed(&app, caller, turn, parsed.user, reservation).await?;
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
    fn a_field_of_the_wrong_type_is_named_in_the_error() {
        let m = json!([{"role": "user", "content": "hi"}]);
        let message = |body: Value| parse_rest(&body).unwrap_err().message;
        let bad_role = message(json!({"messages": [m[0], {"role": "bot", "content": "x"}],
            "return_markdown": true}));
        assert!(
            bad_role.starts_with("messages[1].role: unknown variant `bot`"),
            "{bad_role}"
        );
        let bad_usage = message(
            json!({"messages": m, "return_markdown": true, "stream": true,
            "stream_options": {"include_usage": "yes"}}),
        );
        assert!(
            bad_usage.starts_with("stream_options.include_usage:"),
            "{bad_usage}"
        );
        assert_eq!(
            parse_rest(&json!({"messages": m, "return_markdown": true,
                "stream_options": {"include_usage": 1}}))
            .unwrap_err()
            .code,
            "invalid_stream"
        );
        let bad_seed = message(json!({"messages": m, "return_markdown": true, "seed": "7"}));
        assert!(bad_seed.starts_with("seed:"), "{bad_seed}");
        // `null` is not a boolean; an absent field is missing.
        assert_eq!(
            err(json!({"messages": m, "return_markdown": null})),
            "invalid_return_markdown"
        );
        // Text parts are joined; a part of another kind is refused.
        let parts = ok(json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}], "return_markdown": true}));
        assert_eq!(parts.turn.messages[0].content, "ab");
        assert_eq!(
            err(
                json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}],
                "return_markdown": true})
            ),
            "invalid_messages"
        );
        // An array is not an object, even one that lists the fields in order.
        assert_eq!(err(json!([m, true])), "invalid_json");
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
