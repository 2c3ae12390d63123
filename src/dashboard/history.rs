//! The dashboard's call history: the list of calls and files with search and filters, one
//! record's page (the conversation, the intent timeline, the analyses, exports, erasure), and
//! the transcript downloads. Every lookup is of the signed-in user's organisation: another
//! organisation's id is "not found", as on the API.

use std::collections::HashMap;

use serde_json::Value;
use warp::http::{Response, StatusCode};
use warp::hyper::Body;

use super::pages::{csrf, date, esc, layout, notice_html};
use super::{html, Notice, Session};
use crate::app::App;
use crate::history::export::{render, Format};
use crate::history::{Record, RecordHead, RecordKind};
use crate::store::Org;

const DAY_MS: i64 = 86_400_000;

fn not_found() -> Response<Body> {
    html(
        StatusCode::NOT_FOUND,
        super::pages::message(
            "Not found",
            "There is no such call or transcription in this organisation.",
        ),
    )
}

/// A `YYYY-MM-DD` date (what a date field sends) as the Unix milliseconds of its midnight UTC.
fn day_ms(value: &str) -> Option<i64> {
    let format = time::macros::format_description!("[year]-[month]-[day]");
    let day = time::Date::parse(value.trim(), &format).ok()?;
    Some(day.midnight().assume_utc().unix_timestamp() * 1000)
}

/// The API's query from the form's: dates become times (the `to` day is included).
fn api_params(params: &HashMap<String, String>) -> HashMap<String, String> {
    let mut out = params.clone();
    if let Some(ms) = params.get("from").and_then(|v| day_ms(v)) {
        out.insert("from".into(), ms.to_string());
    }
    if let Some(ms) = params.get("to").and_then(|v| day_ms(v)) {
        out.insert("to".into(), (ms + DAY_MS).to_string());
    }
    out
}

fn kind_of(params: &HashMap<String, String>) -> RecordKind {
    match params.get("kind").map(String::as_str) {
        Some("files") => RecordKind::File,
        _ => RecordKind::Call,
    }
}

fn clock(secs: f64) -> String {
    let s = secs.max(0.0) as u64;
    if s >= 3600 {
        format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
    } else {
        format!("{:02}:{:02}", s / 60, s % 60)
    }
}

fn utc(ms: i64) -> String {
    date(&crate::clock::rfc3339(ms))
}

fn query_string(params: &HashMap<String, String>) -> String {
    let mut pairs: Vec<(&String, &String)> = params.iter().filter(|(_, v)| !v.is_empty()).collect();
    pairs.sort();
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", url_escape(k), url_escape(v)))
        .collect::<Vec<_>>()
        .join("&")
}

fn url_escape(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// The list of calls (or files, `kind=files`), newest first, filtered as the form asks.
pub async fn list_page(
    app: &App,
    s: &Session,
    org: &Org,
    params: &HashMap<String, String>,
    notice: Option<Notice>,
) -> Response<Body> {
    let kind = kind_of(params);
    let (page, error) = match crate::history::query_of(&api_params(params)) {
        Ok(query) => match app.store.records(&org.id, kind, &query).await {
            Ok(page) => (Some(page), None),
            Err(e) => return super::failure(e),
        },
        Err(e) => (None, Some(e.to_string())),
    };
    let value = |name: &str| esc(params.get(name).map_or("", String::as_str));
    let mut sources: Vec<(String, String)> = Vec::new();
    match kind {
        RecordKind::Call => {
            if let Ok(list) = app.store.connectors(&org.id).await {
                sources.extend(list.into_iter().map(|c| {
                    let label = c.name.clone().unwrap_or_else(|| c.client_id.clone());
                    (c.client_id, label)
                }));
            }
        }
        RecordKind::File => {
            if let Ok(list) = app.store.api_keys(&org.id).await {
                sources.extend(list.into_iter().map(|k| {
                    let label = format!("{} …{}", k.name.as_deref().unwrap_or("key"), k.last4);
                    (k.id, label)
                }));
            }
        }
    }
    let chosen = params.get("connector").map_or("", String::as_str);
    let options: String = sources
        .iter()
        .map(|(id, label)| {
            let selected = if id == chosen { " selected" } else { "" };
            format!(
                r#"<option value="{}"{selected}>{}</option>"#,
                esc(id),
                esc(label)
            )
        })
        .collect();
    let (calls_here, files_here) = match kind {
        RecordKind::Call => (r#" aria-current="page""#, ""),
        RecordKind::File => ("", r#" aria-current="page""#),
    };
    let kind_value = match kind {
        RecordKind::Call => "calls",
        RecordKind::File => "files",
    };
    let source_label = match kind {
        RecordKind::Call => "Connector",
        RecordKind::File => "API key",
    };
    let form = format!(
        r#"<form method="get" action="/dashboard/history" class="filters" role="search">
<input type="hidden" name="kind" value="{kind_value}">
<label for="q">Words said</label> <input id="q" name="q" type="search" maxlength="200" value="{q}" placeholder="refund invoice">
<label for="from">From</label> <input id="from" name="from" type="date" value="{from}">
<label for="to">To</label> <input id="to" name="to" type="date" value="{to}">
<label for="connector">{source_label}</label> <select id="connector" name="connector"><option value="">Any</option>{options}</select>
<label for="intent">Intent</label> <input id="intent" name="intent" maxlength="64" value="{intent}">
<button type="submit">Search</button> <a href="/dashboard/history?kind={kind_value}">Clear</a>
</form>"#,
        q = value("q"),
        from = value("from"),
        to = value("to"),
        intent = value("intent"),
    );
    let table = match (&page, &error) {
        (_, Some(e)) => format!(r#"<p class="notice error" role="alert">{}</p>"#, esc(e)),
        (Some(page), None) if page.heads.is_empty() => {
            r#"<p id="no-records">No records match.</p>"#.to_owned()
        }
        (Some(page), None) => {
            let rows: String = page.heads.iter().map(|h| row(h, kind)).collect();
            let head = match kind {
                RecordKind::Call => {
                    r#"<th scope="col">Started (UTC)</th><th scope="col">Conversation</th><th scope="col">Caller</th><th scope="col">Length</th><th scope="col">Intent</th><th scope="col">State</th>"#
                }
                RecordKind::File => {
                    r#"<th scope="col">Transcribed (UTC)</th><th scope="col">File</th><th scope="col">Language</th><th scope="col">Length</th><th scope="col">Intent</th><th scope="col">State</th>"#
                }
            };
            let more = match &page.next {
                Some(c) => {
                    let mut next = params.clone();
                    next.insert("cursor".into(), c.encode());
                    format!(
                        r#"<p class="pages"><a href="/dashboard/history?{}" rel="next">Older records</a></p>"#,
                        esc(&query_string(&next))
                    )
                }
                None => String::new(),
            };
            format!(
                r#"<table id="records"><caption>Newest first</caption><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>{more}"#
            )
        }
        (None, None) => String::new(),
    };
    let content = format!(
        r#"{notice}
<nav aria-label="Record kind" class="tabs"><a href="/dashboard/history?kind=calls"{calls_here}>Live calls</a> <a href="/dashboard/history?kind=files"{files_here}>File transcriptions</a></nav>
{form}
{table}"#,
        notice = notice_html(notice),
    );
    let title = match kind {
        RecordKind::Call => "Call history",
        RecordKind::File => "Transcription history",
    };
    html(StatusCode::OK, layout(s, org, "history", title, &content))
}

fn length(head: &RecordHead) -> String {
    let secs = match (head.duration, head.ended_ms) {
        (Some(d), _) => d,
        (None, Some(end)) => (end - head.started_ms).max(0) as f64 / 1000.0,
        (None, None) => (crate::clock::now_ms() - head.started_ms).max(0) as f64 / 1000.0,
    };
    clock(secs)
}

fn state(head: &RecordHead) -> String {
    match (head.kind, head.ended_ms, &head.close_reason) {
        (RecordKind::Call, None, _) => r#"<span class="live">in progress</span>"#.to_owned(),
        (_, _, Some(reason)) => esc(reason),
        _ => "done".to_owned(),
    }
}

fn row(head: &RecordHead, kind: RecordKind) -> String {
    let link = |text: &str| {
        format!(
            r#"<a href="/dashboard/history/{}">{}</a>"#,
            esc(&head.id),
            esc(text)
        )
    };
    let intent = esc(head.intent.as_deref().unwrap_or(""));
    match kind {
        RecordKind::Call => format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{intent}</td><td>{}</td></tr>",
            utc(head.started_ms),
            link(head.conversation_id.as_deref().unwrap_or(&head.id)),
            esc(head.ani.as_deref().unwrap_or("")),
            length(head),
            state(head),
        ),
        RecordKind::File => format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{intent}</td><td>{}</td></tr>",
            utc(head.started_ms),
            link(head.file_name.as_deref().unwrap_or(&head.id)),
            esc(head.language.as_deref().unwrap_or("")),
            length(head),
            state(head),
        ),
    }
}

/// The record `id` of the signed-in organisation.
async fn owned(app: &App, org: &Org, id: &str) -> Result<Option<Record>, Response<Body>> {
    if !crate::history::valid_id(id) {
        return Ok(None);
    }
    app.store
        .load_record(&org.id, id)
        .await
        .map_err(super::failure)
}

/// A JSON value as nested HTML: objects as description lists, arrays as lists.
fn value_html(v: &Value) -> String {
    match v {
        Value::Object(map) => {
            let items: String = map
                .iter()
                .map(|(k, v)| {
                    format!(
                        "<dt>{}</dt><dd>{}</dd>",
                        esc(&k.replace('_', " ")),
                        value_html(v)
                    )
                })
                .collect();
            format!("<dl>{items}</dl>")
        }
        Value::Array(items) if items.is_empty() => "none".to_owned(),
        Value::Array(items) => {
            let items: String = items
                .iter()
                .map(|v| format!("<li>{}</li>", value_html(v)))
                .collect();
            format!("<ul>{items}</ul>")
        }
        Value::String(s) => esc(s),
        Value::Null => "—".to_owned(),
        other => esc(&other.to_string()),
    }
}

fn intent_summary(result: &Value) -> String {
    let labels: Vec<String> = result
        .get("intents")
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .filter_map(|i| {
                    let label = i.get("intent")?.as_str()?;
                    Some(match i.get("confidence").and_then(Value::as_str) {
                        Some(c) => format!("<strong>{}</strong> ({})", esc(label), esc(c)),
                        None => format!("<strong>{}</strong>", esc(label)),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    let labels = if labels.is_empty() {
        "no intent".to_owned()
    } else {
        labels.join(", ")
    };
    match result.get("reasoning").and_then(Value::as_str) {
        Some(r) if !r.is_empty() => format!(r#"{labels}<p class="reasoning">{}</p>"#, esc(r)),
        _ => labels,
    }
}

/// One record: what it was, the two sides as a conversation, the intents, the analyses,
/// exports and erasure. A call in progress is marked live; the script fills it in.
pub async fn record_page(app: &App, s: &Session, org: &Org, id: &str) -> Response<Body> {
    let record = match owned(app, org, id).await {
        Ok(Some(r)) => r,
        Ok(None) => return not_found(),
        Err(r) => return r,
    };
    let head = &record.head;
    let live = head.kind == RecordKind::Call && head.ended_ms.is_none();
    let speaker = |channel: usize| {
        head.channels
            .get(channel)
            .cloned()
            .unwrap_or_else(|| format!("Channel {channel}"))
    };
    let mut meta: Vec<(&str, String)> = vec![("Started (UTC)", utc(head.started_ms))];
    match head.ended_ms {
        Some(end) => meta.push(("Ended (UTC)", utc(end))),
        None if live => meta.push(("Ended", r#"<span class="live">in progress</span>"#.into())),
        None => {}
    }
    meta.push(("Length", length(head)));
    let optional = [
        ("Conversation", &head.conversation_id),
        ("File", &head.file_name),
        ("Caller (ANI)", &head.ani),
        ("Dialled (DNIS)", &head.dnis),
        ("Language", &head.language),
        ("Close reason", &head.close_reason),
    ];
    for (label, value) in optional {
        if let Some(v) = value {
            meta.push((label, esc(v)));
        }
    }
    meta.push((
        match head.kind {
            RecordKind::Call => "Connector",
            RecordKind::File => "API key",
        },
        format!("<code>{}</code>", esc(&head.connector)),
    ));
    meta.push((
        "Audio billed",
        format!("{:.2} minutes", head.billed_ms as f64 / 60_000.0),
    ));
    let meta: String = meta
        .iter()
        .map(|(k, v)| format!("<dt>{k}</dt><dd>{v}</dd>"))
        .collect();
    let lines: String = record
        .transcript
        .iter()
        .map(|l| {
            let who = speaker(l.channel);
            let side = match who.as_str() {
                "Agent" => "agent",
                "Customer" => "customer",
                _ => "other",
            };
            format!(
                r#"<li class="{side}"><span class="t">{t}</span> <span class="who">{who}</span> <span class="text">{text}</span></li>"#,
                t = clock(l.offset),
                who = esc(&who),
                text = esc(&l.text),
            )
        })
        .collect();
    let conversation = if lines.is_empty() {
        r#"<p>Nothing has been said yet.</p>"#.to_owned()
    } else {
        format!(r#"<ol class="conversation" aria-label="Transcript">{lines}</ol>"#)
    };
    let timeline: String = record
        .intents
        .iter()
        .map(|e| {
            let at = (e.at_ms - head.started_ms).max(0) as f64 / 1000.0;
            format!(
                r#"<li><span class="t">{}</span> {}</li>"#,
                clock(at),
                intent_summary(&e.result)
            )
        })
        .collect();
    let intents = match head.kind {
        RecordKind::Call if timeline.is_empty() => {
            r#"<section aria-labelledby="intents-h" id="intents"><h2 id="intents-h">Intent timeline</h2><p>No intent was asked for on this call.</p></section>"#.to_owned()
        }
        RecordKind::Call => format!(
            r#"<section aria-labelledby="intents-h" id="intents"><h2 id="intents-h">Intent timeline</h2><ol class="timeline">{timeline}</ol></section>"#
        ),
        RecordKind::File => String::new(),
    };
    let analyses = match &head.analyses {
        Some(Value::Object(map)) if !map.is_empty() => {
            let parts: String = map
                .iter()
                .map(|(name, v)| {
                    let title = match name.as_str() {
                        "intent" => "Intent".to_owned(),
                        "bant" => "BANT".to_owned(),
                        "neat_p" => "NEAT-P".to_owned(),
                        other => other.replace('_', " "),
                    };
                    let body = if name == "intent" {
                        intent_summary(v)
                    } else {
                        value_html(v)
                    };
                    format!(
                        r#"<section class="analysis"><h3>{}</h3>{body}</section>"#,
                        esc(&title)
                    )
                })
                .collect();
            format!(
                r#"<section aria-labelledby="analyses-h" id="analyses"><h2 id="analyses-h">Analyses</h2>{parts}</section>"#
            )
        }
        _ => String::new(),
    };
    let exports: String = [
        ("json", "JSON"),
        ("txt", "Text"),
        ("srt", "SubRip (SRT)"),
        ("vtt", "WebVTT"),
    ]
    .iter()
    .map(|(f, label)| {
        format!(
            r#"<a class="button" href="/dashboard/history/{id}/transcript?format={f}" download>{label}</a> "#,
            id = esc(&head.id)
        )
    })
    .collect();
    let what = match head.kind {
        RecordKind::Call => "call",
        RecordKind::File => "transcription",
    };
    let content = format!(
        r#"<div id="record" data-live="{live}">
<p><a href="/dashboard/history?kind={kind}">Back to the history</a></p>
<dl class="meta" id="record-meta">{meta}</dl>
<section aria-labelledby="conversation-h" id="conversation"><h2 id="conversation-h">Conversation</h2>{conversation}</section>
{intents}
{analyses}
<section aria-labelledby="export-h"><h2 id="export-h">Export the transcript</h2><p class="row">{exports}</p></section>
<section aria-labelledby="delete-h"><h2 id="delete-h">Erase</h2>
<form method="post" action="/dashboard/history/delete" class="stack">{csrf}<input type="hidden" name="id" value="{id}">
<label class="check"><input type="checkbox" name="confirm" value="yes" required> Erase this {what} and its transcript for good. It cannot be undone.</label>
<button type="submit" class="danger">Delete {what}</button></form></section>
</div>"#,
        live = u8::from(live),
        kind = match head.kind {
            RecordKind::Call => "calls",
            RecordKind::File => "files",
        },
        csrf = csrf(s),
        id = esc(&head.id),
    );
    let title = match head.kind {
        RecordKind::Call => format!(
            "Call {}",
            head.conversation_id.as_deref().unwrap_or(&head.id)
        ),
        RecordKind::File => format!(
            "Transcription of {}",
            head.file_name.as_deref().unwrap_or(&head.id)
        ),
    };
    html(StatusCode::OK, layout(s, org, "history", &title, &content))
}

/// A record's transcript as a download.
pub async fn export(
    app: &App,
    org: &Org,
    id: &str,
    params: &HashMap<String, String>,
) -> Response<Body> {
    let Some(format) = Format::parse(params.get("format").map_or("json", String::as_str)) else {
        return html(
            StatusCode::BAD_REQUEST,
            super::pages::message("Unknown format", "Choose json, txt, srt or vtt."),
        );
    };
    let record = match owned(app, org, id).await {
        Ok(Some(r)) => r,
        Ok(None) => return not_found(),
        Err(r) => return r,
    };
    Response::builder()
        .header("content-type", format.content_type())
        .header(
            "content-disposition",
            format!(
                "attachment; filename=\"{}.{}\"",
                record.head.id,
                format.extension()
            ),
        )
        .header("cache-control", "no-store")
        .header("x-content-type-options", "nosniff")
        .body(Body::from(render(&record, format)))
        .unwrap_or_else(|_| not_found())
}

/// Erases a record of the signed-in organisation, once the form's box is ticked.
pub async fn delete(app: &App, org: &Org, id: &str, confirmed: bool) -> Notice {
    if !confirmed {
        return Notice::Error("Tick the box to confirm the erasure.".into());
    }
    if !crate::history::valid_id(id) {
        return Notice::Error("There is no such record in this organisation.".into());
    }
    match app.store.delete_record(&org.id, id).await {
        Ok(true) => {
            tracing::info!(org = %org.id, record = %id, "call history record erased from the dashboard");
            Notice::Info(format!("Record {id} erased."))
        }
        Ok(false) => Notice::Error("There is no such record in this organisation.".into()),
        Err(e) => {
            tracing::warn!(error = %e, "call history erasure failed");
            Notice::Error("The record could not be erased; try again.".into())
        }
    }
}

/// The history's pages: the list, a record, a record's transcript download.
pub fn routes(
    app: App,
) -> impl warp::Filter<Extract = (Response<Body>,), Error = warp::Rejection> + Clone {
    use super::{ctx, signed_in_org, Ctx};
    use warp::Filter;
    let base = warp::path("dashboard");
    let with_app = {
        let app = app.clone();
        warp::any().map(move || app.clone())
    };
    let history_list = base
        .and(warp::path("history"))
        .and(warp::path::end())
        .and(warp::get())
        .and(with_app.clone())
        .and(ctx(app.clone()))
        .and(warp::query::<HashMap<String, String>>())
        .then(
            |app: App, ctx: Ctx, params: HashMap<String, String>| async move {
                match signed_in_org(&app, &ctx).await {
                    Ok((s, org)) => list_page(&app, &s, &org, &params, None).await,
                    Err(r) => *r,
                }
            },
        );
    let history_record = base
        .and(warp::path("history"))
        .and(warp::path::param::<String>())
        .and(warp::path::end())
        .and(warp::get())
        .and(with_app.clone())
        .and(ctx(app.clone()))
        .then(|id: String, app: App, ctx: Ctx| async move {
            match signed_in_org(&app, &ctx).await {
                Ok((s, org)) => record_page(&app, &s, &org, &id).await,
                Err(r) => *r,
            }
        });
    let history_export = base
        .and(warp::path("history"))
        .and(warp::path::param::<String>())
        .and(warp::path("transcript"))
        .and(warp::path::end())
        .and(warp::get())
        .and(with_app.clone())
        .and(ctx(app.clone()))
        .and(warp::query::<HashMap<String, String>>())
        .then(
            |id: String, app: App, ctx: Ctx, params: HashMap<String, String>| async move {
                match signed_in_org(&app, &ctx).await {
                    Ok((_, org)) => export(&app, &org, &id, &params).await,
                    Err(r) => *r,
                }
            },
        );
    history_list
        .or(history_record)
        .unify()
        .or(history_export)
        .unify()
}

/// What the settings page's call-history form offers: the plan's retention, and the active
/// connectors and keys an override may name.
pub async fn choices(app: &App, org: &Org) -> super::pages::HistoryChoices {
    let plan_days = app
        .config
        .plans
        .get(&org.plan)
        .and_then(|p| p.retention_days);
    let mut sources = Vec::new();
    if let Ok(list) = app.store.connectors(&org.id).await {
        sources.extend(
            list.into_iter()
                .filter(|c| c.revoked_at_ms.is_none())
                .map(|c| {
                    let label = format!("Connector {}", c.name.as_deref().unwrap_or(&c.client_id));
                    (c.client_id, label)
                }),
        );
    }
    if let Ok(list) = app.store.api_keys(&org.id).await {
        sources.extend(
            list.into_iter()
                .filter(|k| k.revoked_at_ms.is_none())
                .map(|k| {
                    let label = format!("API key {} …{}", k.name.as_deref().unwrap_or(""), k.last4);
                    (k.id, label)
                }),
        );
    }
    super::pages::HistoryChoices { plan_days, sources }
}

/// Saves the settings form's call-history part (replacing the settings in force).
pub async fn save_settings(
    app: &App,
    org: String,
    form: &super::Form,
) -> Result<Notice, crate::admin::AdminError> {
    use crate::admin::{AdminError, AdminRequest};
    let retention_days = match super::field(form, "retention_days").trim() {
        "" => None,
        d => Some(
            d.parse::<u32>()
                .map_err(|_| AdminError::Invalid(format!("{d:?} is not a number of days")))?,
        ),
    };
    let redact_connectors = form
        .iter()
        .filter_map(|(k, v)| {
            let id = k.strip_prefix("redact_")?;
            match v.as_str() {
                "on" => Some((id.to_owned(), true)),
                "off" => Some((id.to_owned(), false)),
                _ => None,
            }
        })
        .collect();
    let history = crate::store::HistorySettings {
        retention_days,
        redact: super::field(form, "redact") == "1",
        redact_connectors,
    };
    super::admin(app, AdminRequest::OrgSetHistory { org, history })
        .await
        .map(|_| Notice::Info("Call history settings saved.".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_date_field_becomes_a_whole_day() {
        let params = HashMap::from([
            ("from".to_owned(), "2026-12-01".to_owned()),
            ("to".to_owned(), "2026-12-01".to_owned()),
            ("q".to_owned(), "refund".to_owned()),
        ]);
        let api = api_params(&params);
        assert_eq!(api["from"], "1796083200000");
        assert_eq!(api["to"], (1796083200000i64 + DAY_MS).to_string());
        assert_eq!(api["q"], "refund");
        // Anything else is left for the API's own parsing (and its error).
        let odd = api_params(&HashMap::from([(
            "from".to_owned(),
            "yesterday".to_owned(),
        )]));
        assert_eq!(odd["from"], "yesterday");
    }

    #[test]
    fn analyses_render_as_escaped_nested_lists() {
        let v =
            serde_json::json!({"budget": {"status": "identified", "evidence": ["<b>50,000</b>"]}});
        let h = value_html(&v);
        assert!(h.contains("<dt>budget</dt>"));
        assert!(h.contains("&lt;b&gt;50,000&lt;/b&gt;"));
        assert!(!h.contains("<b>"));
    }

    #[test]
    fn a_cursor_link_keeps_the_filters() {
        let q = query_string(&HashMap::from([
            ("q".to_owned(), "card & pin".to_owned()),
            ("kind".to_owned(), "files".to_owned()),
            ("intent".to_owned(), String::new()),
        ]));
        assert_eq!(q, "kind=files&q=card%20%26%20pin");
    }
}
