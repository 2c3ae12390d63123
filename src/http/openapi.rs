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
use crate::history::{IntentEntry, Line, RecordKind};
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
        transcribe,
        calls_list,
        call_get,
        call_transcript,
        call_delete,
        transcriptions_list,
        transcription_get,
        transcription_transcript,
        transcription_delete
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
        Segment,
        RecordKind,
        HistoryHead,
        HistoryRecord,
        CallList,
        TranscriptionList,
        Line,
        IntentEntry
    )),
    modifiers(&KeyHeader),
    tags(
        (name = "service", description = "Health, readiness, metrics and this document; no key"),
        (name = "account", description = "The caller's organisation, plan and usage"),
        (name = "chat", description = "Chat completions (OpenAI-compatible)"),
        (name = "transcription", description = "Audio files to transcripts and analyses"),
        (name = "history", description = "Every call and file transcription kept: search, exports, erasure")
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

/// A record as the history routes show it (without its owner, with RFC 3339 times).
#[derive(Serialize, ToSchema)]
#[allow(dead_code)] // only its schema is used
struct HistoryHead {
    /// `call_` or `tr_` followed by 24 hex digits.
    id: String,
    /// A live call or a file.
    kind: RecordKind,
    /// Start, Unix milliseconds.
    started_ms: i64,
    /// Start, RFC 3339.
    started_at: String,
    /// End, Unix milliseconds; null while a call is in progress.
    ended_ms: Option<i64>,
    /// End, RFC 3339.
    ended_at: Option<String>,
    /// The connector's client id (calls) or the API key id (files).
    connector: String,
    /// The platform's conversation id (calls).
    conversation_id: Option<String>,
    /// Caller number as sent (calls).
    ani: Option<String>,
    /// Dialled number as sent (calls).
    dnis: Option<String>,
    /// How the call ended (calls).
    close_reason: Option<String>,
    /// Language tag.
    language: Option<String>,
    /// Speaker of each channel in channel order (`Customer`, `Agent`).
    channels: Vec<String>,
    /// Audio billed, milliseconds.
    billed_ms: u64,
    /// The uploaded file's name (files).
    file_name: Option<String>,
    /// Seconds of audio (files).
    duration: Option<f64>,
    /// The latest top intent.
    intent: Option<String>,
    /// A file's analyses: `intent`, and `bant`, `neat_p` when asked for.
    #[schema(value_type = Option<Object>)]
    analyses: Option<serde_json::Value>,
}

/// A record with its transcript and intent updates.
#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
struct HistoryRecord {
    #[serde(flatten)]
    head: HistoryHead,
    /// Final transcript lines in time order.
    transcript: Vec<Line>,
    /// Intent updates of a call, oldest first.
    intents: Vec<IntentEntry>,
}

/// A page of calls, newest first.
#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
struct CallList {
    calls: Vec<HistoryHead>,
    /// The `cursor` of the next page; null on the last.
    next_cursor: Option<String>,
}

/// A page of file transcriptions, newest first.
#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
struct TranscriptionList {
    transcriptions: Vec<HistoryHead>,
    /// The `cursor` of the next page; null on the last.
    next_cursor: Option<String>,
}

/// The organisation's calls, newest first, filtered.
#[utoipa::path(get, path = "/api/calls", tag = "history", security(("api_key" = [])),
    params(
        ("q" = Option<String>, Query, description = "Words that must all be in the transcript (whole words, any case; at most 8 words, 200 characters)"),
        ("from" = Option<String>, Query, description = "Started at or after: RFC 3339 or Unix milliseconds"),
        ("to" = Option<String>, Query, description = "Started before: RFC 3339 or Unix milliseconds"),
        ("connector" = Option<String>, Query, description = "Connector client id"),
        ("intent" = Option<String>, Query, description = "The latest top intent, exactly"),
        ("limit" = Option<u32>, Query, description = "1 to 100, default 20"),
        ("cursor" = Option<String>, Query, description = "`next_cursor` of the previous page")),
    responses(
        (status = 200, description = "A page", body = CallList),
        (status = 400, description = "Invalid query or cursor", body = ErrorBody),
        (status = 401, description = "Missing, unknown or revoked key", body = ErrorBody),
        (status = 429, description = "Over the key's requests per minute", body = ErrorBody)))]
#[allow(dead_code)]
fn calls_list() {}

/// One call: details, transcript, intent updates.
#[utoipa::path(get, path = "/api/calls/{id}", tag = "history", security(("api_key" = [])),
    params(("id" = String, Path, description = "Call id (`call_...`)")),
    responses(
        (status = 200, description = "The call", body = HistoryRecord),
        (status = 401, description = "Missing, unknown or revoked key", body = ErrorBody),
        (status = 404, description = "No such call in this organisation", body = ErrorBody)))]
#[allow(dead_code)]
fn call_get() {}

/// A call's transcript as a file: the record as JSON, speaker-labelled text, SRT or WebVTT.
#[utoipa::path(get, path = "/api/calls/{id}/transcript", tag = "history", security(("api_key" = [])),
    params(
        ("id" = String, Path, description = "Call id"),
        ("format" = Option<String>, Query, description = "`json` (default), `txt`, `srt` or `vtt`")),
    responses(
        (status = 200, description = "The transcript (as an attachment)", content(
            (HistoryRecord = "application/json"),
            (String = "text/plain"),
            (String = "application/x-subrip"),
            (String = "text/vtt"))),
        (status = 400, description = "Unknown format", body = ErrorBody),
        (status = 401, description = "Missing, unknown or revoked key", body = ErrorBody),
        (status = 404, description = "No such call in this organisation", body = ErrorBody)))]
#[allow(dead_code)]
fn call_transcript() {}

/// Erases a call: record, transcript, intents and search entries.
#[utoipa::path(delete, path = "/api/calls/{id}", tag = "history", security(("api_key" = [])),
    params(("id" = String, Path, description = "Call id")),
    responses(
        (status = 204, description = "Erased"),
        (status = 401, description = "Missing, unknown or revoked key", body = ErrorBody),
        (status = 404, description = "No such call in this organisation", body = ErrorBody)))]
#[allow(dead_code)]
fn call_delete() {}

/// The organisation's file transcriptions, newest first, filtered.
#[utoipa::path(get, path = "/api/transcriptions", tag = "history", security(("api_key" = [])),
    params(
        ("q" = Option<String>, Query, description = "Words that must all be in the transcript"),
        ("from" = Option<String>, Query, description = "Transcribed at or after: RFC 3339 or Unix milliseconds"),
        ("to" = Option<String>, Query, description = "Transcribed before: RFC 3339 or Unix milliseconds"),
        ("connector" = Option<String>, Query, description = "The API key id it was sent with"),
        ("intent" = Option<String>, Query, description = "The top intent, exactly"),
        ("limit" = Option<u32>, Query, description = "1 to 100, default 20"),
        ("cursor" = Option<String>, Query, description = "`next_cursor` of the previous page")),
    responses(
        (status = 200, description = "A page", body = TranscriptionList),
        (status = 400, description = "Invalid query or cursor", body = ErrorBody),
        (status = 401, description = "Missing, unknown or revoked key", body = ErrorBody),
        (status = 429, description = "Over the key's requests per minute", body = ErrorBody)))]
#[allow(dead_code)]
fn transcriptions_list() {}

/// One file transcription: details, segments as lines, analyses.
#[utoipa::path(get, path = "/api/transcriptions/{id}", tag = "history", security(("api_key" = [])),
    params(("id" = String, Path, description = "Transcription id (`tr_...`), as `POST /api/transcribe` answered it")),
    responses(
        (status = 200, description = "The transcription", body = HistoryRecord),
        (status = 401, description = "Missing, unknown or revoked key", body = ErrorBody),
        (status = 404, description = "No such transcription in this organisation", body = ErrorBody)))]
#[allow(dead_code)]
fn transcription_get() {}

/// A file transcription's transcript as a file.
#[utoipa::path(get, path = "/api/transcriptions/{id}/transcript", tag = "history", security(("api_key" = [])),
    params(
        ("id" = String, Path, description = "Transcription id"),
        ("format" = Option<String>, Query, description = "`json` (default), `txt`, `srt` or `vtt`")),
    responses(
        (status = 200, description = "The transcript (as an attachment)", content(
            (HistoryRecord = "application/json"),
            (String = "text/plain"),
            (String = "application/x-subrip"),
            (String = "text/vtt"))),
        (status = 400, description = "Unknown format", body = ErrorBody),
        (status = 401, description = "Missing, unknown or revoked key", body = ErrorBody),
        (status = 404, description = "No such transcription in this organisation", body = ErrorBody)))]
#[allow(dead_code)]
fn transcription_transcript() {}

/// Erases a file transcription.
#[utoipa::path(delete, path = "/api/transcriptions/{id}", tag = "history", security(("api_key" = [])),
    params(("id" = String, Path, description = "Transcription id")),
    responses(
        (status = 204, description = "Erased"),
        (status = 401, description = "Missing, unknown or revoked key", body = ErrorBody),
        (status = 404, description = "No such transcription in this organisation", body = ErrorBody)))]
#[allow(dead_code)]
fn transcription_delete() {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_history_head_is_documented_as_the_routes_show_it() {
        let doc: serde_json::Value = serde_json::from_str(&document("http://x")).unwrap();
        let props = doc["components"]["schemas"]["HistoryHead"]["properties"]
            .as_object()
            .unwrap();
        let mut documented: Vec<&str> = props.keys().map(String::as_str).collect();
        let head = crate::history::RecordHead {
            id: "call_0".into(),
            org_id: "org_a".into(),
            kind: RecordKind::File,
            started_ms: 1,
            ended_ms: Some(2),
            connector: "key_1".into(),
            conversation_id: Some("c".into()),
            ani: Some("a".into()),
            dnis: Some("d".into()),
            close_reason: Some("closed".into()),
            language: Some("en".into()),
            channels: vec!["Customer".into()],
            billed_ms: 1,
            file_name: Some("f.wav".into()),
            duration: Some(1.0),
            intent: Some("other".into()),
            analyses: Some(serde_json::json!({})),
        };
        let shown = crate::http::history::head_view(&head);
        let mut shown: Vec<&str> = shown
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        documented.sort_unstable();
        shown.sort_unstable();
        assert_eq!(documented, shown);
    }

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
