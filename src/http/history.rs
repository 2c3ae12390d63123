//! The call history's REST routes, for API keys, always scoped to the key's organisation:
//!
//! - `GET /api/calls` and `GET /api/transcriptions`: a page of records, newest first. Query:
//!   `from`, `to` (RFC 3339, or Unix milliseconds; `from` inclusive, `to` exclusive, on the
//!   start time), `connector`, `intent` (the latest top intent, exactly), `q` (words that must
//!   all appear in the transcript, whole words, any case), `limit` (1 to 100, default 20),
//!   `cursor` (the `next_cursor` of the previous page). The answer is
//!   `{"calls": [...], "next_cursor": ...}` (`"transcriptions"` for files); `next_cursor` is
//!   null on the last page.
//! - `GET /api/calls/{id}`: the record, its transcript lines and intent updates.
//! - `GET /api/calls/{id}/transcript?format=json|txt|srt|vtt`: the transcript as a file.
//! - `DELETE /api/calls/{id}`: erases the record (204).
//!
//! An id of another organisation, of the other kind, or of nothing answers 404 alike.

use std::collections::HashMap;

use serde_json::{json, Value};
use warp::http::StatusCode;
use warp::{Filter, Rejection, Reply};

use crate::app::App;
use crate::auth::Caller;
use crate::history::export::{render, Format};
use crate::history::{file_record_id, top_intent, Line, Query, Record, RecordHead, RecordKind};
use crate::http::errors::ApiError;

fn bad(code: &'static str, message: impl Into<String>) -> ApiError {
    ApiError::BadRequest {
        code,
        message: message.into(),
    }
}

fn store_error(e: crate::store::StoreError) -> ApiError {
    ApiError::Auth(crate::auth::AuthError::Store(e))
}

/// The listing a query string asks for; a bad query is a 400 with its reason.
pub(crate) fn query_of(params: &HashMap<String, String>) -> Result<Query, ApiError> {
    crate::history::query_of(params).map_err(|e| bad(e.code, e.message))
}

/// A head as the API shows it: without its owner, with RFC 3339 times beside the
/// milliseconds.
pub fn head_view(head: &RecordHead) -> Value {
    let mut v = serde_json::to_value(head).expect("a record head serializes");
    if let Some(o) = v.as_object_mut() {
        o.remove("org_id");
        o.insert(
            "started_at".into(),
            json!(crate::clock::rfc3339(head.started_ms)),
        );
        o.insert(
            "ended_at".into(),
            json!(head.ended_ms.map(crate::clock::rfc3339)),
        );
    }
    v
}

fn not_found(kind: RecordKind, id: &str) -> ApiError {
    let what = match kind {
        RecordKind::Call => "call",
        RecordKind::File => "transcription",
    };
    ApiError::NotFound {
        code: "not_found",
        message: format!("no {what} {id:?} in this organisation"),
    }
}

/// The record `id` of the caller's organisation, if it is of `kind`.
async fn owned(
    app: &App,
    caller: &Caller,
    kind: RecordKind,
    id: &str,
) -> Result<crate::history::Record, ApiError> {
    if !crate::history::valid_id(id) || crate::history::kind_of(id) != Some(kind) {
        return Err(not_found(kind, id));
    }
    app.store
        .load_record(&caller.org.id, id)
        .await
        .map_err(store_error)?
        .filter(|r| r.head.kind == kind)
        .ok_or_else(|| not_found(kind, id))
}

async fn list(
    app: App,
    caller: Caller,
    kind: RecordKind,
    params: HashMap<String, String>,
) -> Result<warp::reply::Response, ApiError> {
    let query = query_of(&params)?;
    let page = app
        .store
        .records(&caller.org.id, kind, &query)
        .await
        .map_err(store_error)?;
    let name = match kind {
        RecordKind::Call => "calls",
        RecordKind::File => "transcriptions",
    };
    let items: Vec<Value> = page.heads.iter().map(head_view).collect();
    Ok(warp::reply::json(&json!({
        name: items,
        "next_cursor": page.next.map(|c| c.encode()),
    }))
    .into_response())
}

async fn one(
    app: App,
    caller: Caller,
    kind: RecordKind,
    id: String,
) -> Result<warp::reply::Response, ApiError> {
    let record = owned(&app, &caller, kind, &id).await?;
    let mut v = head_view(&record.head);
    if let Some(o) = v.as_object_mut() {
        o.insert("transcript".into(), json!(record.transcript));
        o.insert("intents".into(), json!(record.intents));
    }
    Ok(warp::reply::json(&v).into_response())
}

async fn transcript(
    app: App,
    caller: Caller,
    kind: RecordKind,
    id: String,
    params: HashMap<String, String>,
) -> Result<warp::reply::Response, ApiError> {
    let format = match params.get("format") {
        None => Format::Json,
        Some(f) => Format::parse(f)
            .ok_or_else(|| bad("invalid_format", "format must be json, txt, srt or vtt"))?,
    };
    let record = owned(&app, &caller, kind, &id).await?;
    let body = render(&record, format);
    let mut response = warp::http::Response::new(body.into());
    let headers = response.headers_mut();
    headers.insert(
        "content-type",
        warp::http::HeaderValue::from_static(format.content_type()),
    );
    if let Ok(v) = warp::http::HeaderValue::from_str(&format!(
        "attachment; filename=\"{id}.{}\"",
        format.extension()
    )) {
        headers.insert("content-disposition", v);
    }
    Ok(response)
}

async fn delete(
    app: App,
    caller: Caller,
    kind: RecordKind,
    id: String,
) -> Result<warp::reply::Response, ApiError> {
    owned(&app, &caller, kind, &id).await?;
    app.store
        .delete_record(&caller.org.id, &id)
        .await
        .map_err(store_error)?;
    tracing::info!(org = %caller.org.id, record = %id, "call history record erased");
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// The record of a transcribed file, under a new id: what the response held, its analyses
/// included, sent with key `key_id` of `org_id`, received at `started_ms`.
pub fn file_record(
    org_id: &str,
    key_id: &str,
    started_ms: i64,
    file_name: Option<&str>,
    t: &crate::files::FileTranscript,
) -> Record {
    let mut channels: Vec<String> = vec![String::new(); t.channels];
    for s in &t.segments {
        if let Some(c) = channels.get_mut(s.channel) {
            if c.is_empty() {
                c.clone_from(&s.speaker);
            }
        }
    }
    let analyses = [
        ("intent", &t.intent),
        ("bant", &t.bant),
        ("neat_p", &t.neat_p),
    ]
    .into_iter()
    .filter_map(|(k, v)| v.clone().map(|v| (k.to_owned(), v)))
    .collect::<serde_json::Map<_, _>>();
    let intent = t.intent.as_ref().and_then(top_intent);
    Record {
        head: RecordHead {
            id: file_record_id(),
            org_id: org_id.to_owned(),
            kind: RecordKind::File,
            started_ms,
            ended_ms: Some(crate::clock::now_ms().max(started_ms)),
            connector: key_id.to_owned(),
            conversation_id: None,
            ani: None,
            dnis: None,
            close_reason: None,
            language: Some(t.language.clone()),
            channels,
            billed_ms: (t.duration * 1000.0).round() as u64,
            file_name: file_name
                .map(|n| n.rsplit(['/', '\\']).next().unwrap_or(n))
                .map(|n| n.chars().filter(|c| !c.is_control()).take(255).collect())
                .filter(|n: &String| !n.is_empty()),
            duration: Some(t.duration),
            intent,
            analyses: (!analyses.is_empty()).then_some(Value::Object(analyses)),
        },
        transcript: t
            .segments
            .iter()
            .map(|s| Line {
                channel: s.channel,
                offset: s.start,
                duration: ((s.end - s.start) * 1000.0).round().max(0.0) / 1000.0,
                confidence: s.confidence,
                text: s.text.clone(),
            })
            .collect(),
        intents: Vec::new(),
    }
}

/// Answers a handler's result: the response, or the error as a rejection.
fn answer(r: Result<warp::reply::Response, ApiError>) -> Result<warp::reply::Response, Rejection> {
    r.map_err(warp::reject::custom)
}

/// The history routes. Each is written out (`warp::path!` and its method) so that
/// `tests/openapi.rs` finds it in the sources.
pub fn routes(app: App) -> impl Filter<Extract = (impl Reply,), Error = Rejection> + Clone {
    let auth = crate::http::filters::caller(app.clone());
    let with_app = warp::any().map(move || app.clone());
    let params = warp::query::<HashMap<String, String>>();
    let calls = warp::path!("api" / "calls")
        .and(warp::get())
        .and(with_app.clone())
        .and(auth.clone())
        .and(params)
        .and_then(|app, caller, params| async move {
            answer(list(app, caller, RecordKind::Call, params).await)
        });
    let call = warp::path!("api" / "calls" / String)
        .and(warp::get())
        .and(with_app.clone())
        .and(auth.clone())
        .and_then(
            |id, app, caller| async move { answer(one(app, caller, RecordKind::Call, id).await) },
        );
    let call_transcript = warp::path!("api" / "calls" / String / "transcript")
        .and(warp::get())
        .and(with_app.clone())
        .and(auth.clone())
        .and(params)
        .and_then(|id, app, caller, params| async move {
            answer(transcript(app, caller, RecordKind::Call, id, params).await)
        });
    let call_delete = warp::path!("api" / "calls" / String)
        .and(warp::delete())
        .and(with_app.clone())
        .and(auth.clone())
        .and_then(|id, app, caller| async move {
            answer(delete(app, caller, RecordKind::Call, id).await)
        });
    let files = warp::path!("api" / "transcriptions")
        .and(warp::get())
        .and(with_app.clone())
        .and(auth.clone())
        .and(params)
        .and_then(|app, caller, params| async move {
            answer(list(app, caller, RecordKind::File, params).await)
        });
    let file = warp::path!("api" / "transcriptions" / String)
        .and(warp::get())
        .and(with_app.clone())
        .and(auth.clone())
        .and_then(
            |id, app, caller| async move { answer(one(app, caller, RecordKind::File, id).await) },
        );
    let file_transcript = warp::path!("api" / "transcriptions" / String / "transcript")
        .and(warp::get())
        .and(with_app.clone())
        .and(auth.clone())
        .and(params)
        .and_then(|id, app, caller, params| async move {
            answer(transcript(app, caller, RecordKind::File, id, params).await)
        });
    let file_delete = warp::path!("api" / "transcriptions" / String)
        .and(warp::delete())
        .and(with_app)
        .and(auth)
        .and_then(|id, app, caller| async move {
            answer(delete(app, caller, RecordKind::File, id).await)
        });
    calls
        .or(call)
        .unify()
        .or(call_transcript)
        .unify()
        .or(call_delete)
        .unify()
        .or(files)
        .unify()
        .or(file)
        .unify()
        .or(file_transcript)
        .unify()
        .or(file_delete)
        .unify()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::DEFAULT_PAGE;

    fn params(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn listing_queries_are_read_and_checked() {
        let q = query_of(&params(&[
            ("from", "2026-12-01T00:00:00Z"),
            ("to", "1796083200000"),
            ("q", "Refund  refund card"),
            ("limit", "5"),
        ]))
        .unwrap();
        assert_eq!(q.from_ms, Some(1_796_083_200_000));
        assert_eq!(q.to_ms, Some(1_796_083_200_000));
        assert_eq!(q.words, vec!["refund", "card"]);
        assert_eq!(q.limit, 5);
        for bad in [
            params(&[("limit", "0")]),
            params(&[("limit", "101")]),
            params(&[("from", "yesterday")]),
            params(&[("cursor", "nope")]),
            params(&[("q", &"x".repeat(201))]),
        ] {
            assert_eq!(query_of(&bad).unwrap_err().status().0.as_u16(), 400);
        }
        assert_eq!(query_of(&params(&[])).unwrap().limit, DEFAULT_PAGE);
    }
}
