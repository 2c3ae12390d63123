//! `GET /api/openapi.json`: the OpenAPI 3.1 document of the REST surface, no authentication.
//!
//! It is generated (utoipa) from the types the routes answer with, so a field added to an answer
//! is in the document. Each operation below names its route; `tests/openapi.rs` checks that
//! every REST route the server answers is documented and that every documented one is answered,
//! and validates the document with an independent validator. The two WebSocket protocols
//! (live calls, realtime chat) are described in docs/api.md; the dashboard's pages are HTML.

use serde::Serialize;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, SecurityScheme};
use utoipa::openapi::ServerBuilder;
use utoipa::{Modify, OpenApi, ToSchema};
use warp::{Filter, Rejection, Reply};

use crate::app::App;
use crate::files::{FileTranscript, Segment};
use crate::http::account::{Account, KeyInfo, OrgInfo, PlanInfo};
use crate::http::chat::{AssistantMessage, Choice, Response as ChatResponse};
use crate::http::chat_request::{
    ChatMessage, ChatRole, Content, ContentPart, JsonSchemaSpec, ResponseFormatRequest, Stop,
    StreamOptions,
};
use crate::http::errors::{ErrorBody, ErrorDetail};
use crate::http::health::Status;
use crate::http::languages::Languages;
use crate::usage::{PoolReport, PoolReportSeconds, UsageReport};

/// The document, without the server's address (added per instance).
#[derive(OpenApi)]
#[openapi(
    info(
        title = "callstream",
        description = "Chat completions, audio-file transcription with intent and sales \
                       qualification, and account usage. Authenticate with an organisation's API \
                       key in `X-API-Key`. Errors are `{\"error\": {\"code\", \"message\"}}`."
    ),
    paths(
        healthz,
        readyz,
        metrics,
        openapi_json,
        languages,
        account,
        usage,
        chat_completions,
        transcribe
    ),
    components(schemas(
        Status,
        ErrorBody,
        ErrorDetail,
        Languages,
        Account,
        OrgInfo,
        PlanInfo,
        KeyInfo,
        UsageReport,
        PoolReport,
        PoolReportSeconds,
        ChatCompletionRequest,
        ChatMessage,
        ChatRole,
        Content,
        ContentPart,
        Stop,
        StreamOptions,
        ResponseFormatRequest,
        JsonSchemaSpec,
        ChatResponse,
        Choice,
        AssistantMessage,
        TranscribeForm,
        FileTranscript,
        Segment
    )),
    modifiers(&KeyHeader),
    tags(
        (name = "service", description = "Health, readiness, metrics and this document; no key"),
        (name = "account", description = "The caller's organisation, plan and usage"),
        (name = "chat", description = "Chat completions (OpenAI-compatible)"),
        (name = "transcription", description = "Audio files to transcripts and analyses")
    )
)]
pub struct ApiDoc;

/// The `X-API-Key` header, the one way to authenticate.
struct KeyHeader;

impl Modify for KeyHeader {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "api_key",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                "X-API-Key",
                "An organisation's API key (`cs_...`), created with the CLI or the dashboard",
            ))),
        );
    }
}

/// The document as JSON, with `public_url` as its server.
pub fn document(public_url: &str) -> String {
    let mut doc = ApiDoc::openapi();
    doc.servers = Some(vec![ServerBuilder::new().url(public_url).build()]);
    doc.to_json()
        .expect("the OpenAPI document always serializes")
}

/// `GET /api/openapi.json`.
pub fn routes(app: App) -> impl Filter<Extract = (impl Reply,), Error = Rejection> + Clone {
    let body = document(&app.config.server.public_url);
    warp::path!("api" / "openapi.json")
        .and(warp::get())
        .map(move || warp::reply::with_header(body.clone(), "content-type", "application/json"))
}

/// The body of `POST /api/llm/chat/completions`: the fields of [`ChatCommon`] and
/// [`ChatOptions`], the structs `parse_rest` (src/http/chat.rs) reads, in one object (a test
/// holds the two lists equal). Fields it does not know are ignored.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct ChatCompletionRequest {
    /// 1 to 256 messages; content non-empty but for an assistant's.
    messages: Vec<ChatMessage>,
    /// `true`: the answer as the model wrote it; `false`: Markdown turned into plain prose.
    return_markdown: bool,
    /// Layered after the organisation's system prompt (at most 32,000 bytes).
    system_prompt: Option<String>,
    /// Opaque end-user id (at most 256 characters), recorded with the usage.
    user: Option<String>,
    /// 1 to 4096 (default 1024).
    #[schema(minimum = 1, maximum = 4096)]
    max_tokens: Option<u32>,
    /// 0 to 2 (default 0.7; 0 is greedy).
    #[schema(minimum = 0, maximum = 2)]
    temperature: Option<f64>,
    /// Over 0, up to 1 (default 1).
    #[schema(exclusive_minimum = 0, maximum = 1)]
    top_p: Option<f64>,
    /// A non-empty string, or up to 4 of them.
    stop: Option<Stop>,
    /// -2 to 2 (default 0).
    #[schema(minimum = -2, maximum = 2)]
    frequency_penalty: Option<f64>,
    /// -2 to 2 (default 0).
    #[schema(minimum = -2, maximum = 2)]
    presence_penalty: Option<f64>,
    /// Non-negative; random when absent.
    seed: Option<u64>,
    /// `true`: the answer as server-sent events (`text/event-stream`), OpenAI's chunk format.
    stream: Option<bool>,
    /// With `stream`: `include_usage` adds a last chunk with the token counts.
    stream_options: Option<StreamOptions>,
    /// `{"type": "text"}`, `{"type": "json_object"}` or `{"type": "json_schema",
    /// "json_schema": {"name", "schema", "strict", "description"}}` (docs/api.md, Chat).
    response_format: Option<ResponseFormatRequest>,
}

/// The form of `POST /api/transcribe` (`multipart/form-data`).
#[derive(Serialize, ToSchema)]
pub struct TranscribeForm {
    /// The recording: WAV, FLAC, MP3, Ogg Vorbis or Ogg Opus; any channel count up to 8.
    #[schema(value_type = String, format = Binary)]
    pub file: Vec<u8>,
    /// A code or BCP-47 tag from `GET /api/languages` (default `en`).
    pub language: Option<String>,
    /// `true`/`false` (any case) or `1`/`0`: add the BANT record.
    pub extract_bant: Option<String>,
    /// `true`/`false` (any case) or `1`/`0`: add the NEAT-P record.
    pub extract_neat: Option<String>,
    /// Opaque end-user id recorded with the usage.
    pub user: Option<String>,
}

/// Liveness.
#[utoipa::path(get, path = "/healthz", tag = "service",
    responses((status = 200, description = "The process serves (`ok`, or `draining`)", body = Status)))]
#[allow(dead_code)] // only its generated path item is used
fn healthz() {}

/// Readiness: a draining instance is alive but takes no new calls or sessions; a full one
/// takes no new live call now (admission control).
#[utoipa::path(get, path = "/readyz", tag = "service", responses(
    (status = 200, description = "Ready", body = Status),
    (status = 503, description = "Full (`full`: a new live call would be refused) or draining (`draining`)", body = Status)))]
#[allow(dead_code)]
fn readyz() {}

/// Counters of the speech workers and live calls.
#[utoipa::path(get, path = "/metrics", tag = "service", responses(
    (status = 200, description = "Prometheus text format", content_type = "text/plain", body = String)))]
#[allow(dead_code)]
fn metrics() {}

/// This document.
#[utoipa::path(get, path = "/api/openapi.json", tag = "service", responses(
    (status = 200, description = "OpenAPI 3.1", content_type = "application/json")))]
#[allow(dead_code)]
fn openapi_json() {}

/// The languages the loaded speech model accepts; a request may name one by its code or any
/// of its tags.
#[utoipa::path(get, path = "/api/languages", tag = "transcription",
    responses((status = 200, description = "Every language", body = Languages)))]
#[allow(dead_code)]
fn languages() {}

/// Who this key is: organisation, plan, key.
#[utoipa::path(get, path = "/api/account", tag = "account", security(("api_key" = [])),
    responses(
        (status = 200, description = "The key's account", body = Account),
        (status = 401, description = "Missing, unknown or revoked key", body = ErrorBody),
        (status = 404, description = "The organisation was deleted", body = ErrorBody),
        (status = 429, description = "Over the key's requests per minute", body = ErrorBody)))]
#[allow(dead_code)]
fn account() {}

/// This month's usage and quotas of the key's organisation, with per-day totals.
#[utoipa::path(get, path = "/api/usage", tag = "account", security(("api_key" = [])),
    responses(
        (status = 200, description = "The month so far", body = UsageReport),
        (status = 401, description = "Missing, unknown or revoked key", body = ErrorBody),
        (status = 404, description = "The organisation was deleted", body = ErrorBody),
        (status = 429, description = "Over the key's requests per minute", body = ErrorBody)))]
#[allow(dead_code)]
fn usage() {}

/// A chat completion with the organisation's system prompt and MCP tools; tokens are billed.
#[utoipa::path(post, path = "/api/llm/chat/completions", tag = "chat", security(("api_key" = [])),
    request_body(content = ChatCompletionRequest, description = "At most 1 MiB of JSON"),
    responses(
        (status = 200, description = "The answer; with `stream`, server-sent events", content(
            (ChatResponse = "application/json"),
            (String = "text/event-stream"))),
        (status = 400, description = "Invalid JSON or field", body = ErrorBody),
        (status = 401, description = "Missing, unknown or revoked key", body = ErrorBody),
        (status = 402, description = "The token quota is used up", body = ErrorBody),
        (status = 404, description = "The organisation was deleted", body = ErrorBody),
        (status = 413, description = "The body is over 1 MiB", body = ErrorBody),
        (status = 429, description = "Over the key's requests per minute", body = ErrorBody),
        (status = 503, description = "The model is busy", body = ErrorBody)))]
#[allow(dead_code)]
fn chat_completions() {}

/// Transcribes a recording: transcript, timed segments per channel, intent, and BANT and
/// NEAT-P on request; the audio's length is billed.
#[utoipa::path(post, path = "/api/transcribe", tag = "transcription", security(("api_key" = [])),
    request_body(content = TranscribeForm, content_type = "multipart/form-data"),
    responses(
        (status = 200, description = "The transcript and analyses", body = FileTranscript),
        (status = 400, description = "Invalid form, language, flag or audio", body = ErrorBody),
        (status = 401, description = "Missing, unknown or revoked key", body = ErrorBody),
        (status = 402, description = "The recording is longer than the audio quota left", body = ErrorBody),
        (status = 404, description = "The organisation was deleted", body = ErrorBody),
        (status = 413, description = "The upload or the recording is too long", body = ErrorBody),
        (status = 429, description = "Over the key's requests per minute", body = ErrorBody),
        (status = 503, description = "The speech workers or the model are busy", body = ErrorBody)))]
#[allow(dead_code)]
fn transcribe() {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chat_request_documents_every_field_the_parser_reads() {
        let doc: serde_json::Value = serde_json::from_str(&document("http://x")).unwrap();
        let props = doc["components"]["schemas"]["ChatCompletionRequest"]["properties"]
            .as_object()
            .unwrap();
        let mut documented: Vec<&str> = props.keys().map(String::as_str).collect();
        // What the parser reads: the properties of the structs it reads the body into.
        let fields = |schema: utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>| {
            let schema = serde_json::to_value(schema).unwrap();
            schema["properties"]
                .as_object()
                .unwrap()
                .keys()
                .cloned()
                .collect::<Vec<String>>()
        };
        use crate::http::chat_request::{ChatCommon, ChatOptions};
        let mut read = fields(<ChatCommon as utoipa::PartialSchema>::schema());
        read.extend(fields(<ChatOptions as utoipa::PartialSchema>::schema()));
        let mut read: Vec<&str> = read.iter().map(String::as_str).collect();
        let mut sampling: Vec<&str> = crate::http::chat::SAMPLING_FIELDS.to_vec();
        sampling.sort_unstable();
        let mut in_options = fields(<ChatOptions as utoipa::PartialSchema>::schema());
        in_options.retain(|f| crate::http::chat::SAMPLING_FIELDS.contains(&f.as_str()));
        in_options.sort_unstable();
        assert_eq!(in_options, sampling, "every sampling field is read");
        documented.sort_unstable();
        read.sort_unstable();
        assert_eq!(documented, read);
    }

    #[test]
    fn the_document_is_openapi_3_1_with_the_key_header() {
        let doc: serde_json::Value =
            serde_json::from_str(&document("https://calls.example.com")).unwrap();
        assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"));
        assert_eq!(doc["servers"][0]["url"], "https://calls.example.com");
        assert_eq!(
            doc["components"]["securitySchemes"]["api_key"]["name"],
            "X-API-Key"
        );
    }
}
