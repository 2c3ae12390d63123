//! The dashboard's pages, rendered on the server as plain HTML: semantic elements, labelled
//! fields, tables with headers, charts as SVG with a table of the same numbers beside them.

use warp::http::Response;
use warp::hyper::Body;

use super::{Notice, Session};
use crate::admin::{ConnectorView, KeyView};
use crate::live::{LiveCall, Refusals};
use crate::store::Org;
use crate::usage::UsageReport;
use callstream_actors::usage::UsageKind;

const CSS: &str = include_str!("assets/dashboard.css");
const JS: &str = include_str!("assets/dashboard.js");

/// A static asset, or 404.
pub fn asset(name: &str) -> Response<Body> {
    let (body, kind) = match name {
        "dashboard.css" => (CSS, "text/css; charset=utf-8"),
        "dashboard.js" => (JS, "text/javascript; charset=utf-8"),
        _ => {
            return Response::builder()
                .status(404)
                .body(Body::empty())
                .expect("static response")
        }
    };
    Response::builder()
        .header("content-type", kind)
        .header("cache-control", "public, max-age=3600")
        .header("x-content-type-options", "nosniff")
        .body(Body::from(body))
        .expect("static response")
}

/// HTML-escapes text for element content and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn document(title: &str, body: &str) -> String {
    format!(
        r#"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} · callstream</title>
<link rel="stylesheet" href="/dashboard/assets/dashboard.css">
<script src="/dashboard/assets/dashboard.js" defer></script>
</head>
<body>
{body}
</body>
</html>
"#,
        title = esc(title)
    )
}

const NAV: [(&str, &str); 6] = [
    ("keys", "API keys"),
    ("connectors", "Connectors"),
    ("settings", "Settings"),
    ("usage", "Usage"),
    ("calls", "Live calls"),
    ("history", "Call history"),
];

pub(super) fn layout(s: &Session, org: &Org, current: &str, title: &str, content: &str) -> String {
    let nav: String = NAV
        .iter()
        .map(|(page, label)| {
            let here = if *page == current {
                r#" aria-current="page""#
            } else {
                ""
            };
            format!(r#"<li><a href="/dashboard/{page}"{here}>{label}</a></li>"#)
        })
        .collect();
    let body = format!(
        r#"<header class="top">
<p class="brand">callstream <span class="org">{org}</span></p>
<nav aria-label="Dashboard"><ul>{nav}</ul></nav>
<form method="post" action="/dashboard/logout" class="signout">{csrf}<span class="who">{email}</span> <button type="submit">Sign out</button></form>
</header>
<main id="main">
<h1>{title}</h1>
{content}
</main>"#,
        org = esc(&org.name),
        csrf = csrf(s),
        email = esc(&s.email),
        title = esc(title),
    );
    document(title, &body)
}

pub(super) fn csrf(s: &Session) -> String {
    format!(
        r#"<input type="hidden" name="csrf" value="{}">"#,
        esc(&s.csrf)
    )
}

/// A page with a title and a message (errors, refusals).
pub fn message(title: &str, text: &str) -> String {
    document(
        title,
        &format!(
            r#"<main id="main" class="narrow"><h1>{}</h1><p>{}</p><p><a href="/dashboard">Back to the dashboard</a></p></main>"#,
            esc(title),
            esc(text)
        ),
    )
}

/// The sign-in page.
pub fn login(token: &str, error: Option<&str>) -> String {
    let error = error
        .map(|e| format!(r#"<p class="notice error" role="alert">{}</p>"#, esc(e)))
        .unwrap_or_default();
    document(
        "Sign in",
        &format!(
            r#"<main id="main" class="narrow">
<h1>Sign in to callstream</h1>
{error}
<form method="post" action="/dashboard/login" class="stack">
<input type="hidden" name="csrf" value="{token}">
<label for="email">Email</label>
<input id="email" name="email" type="email" autocomplete="username" required autofocus>
<label for="password">Password</label>
<input id="password" name="password" type="password" autocomplete="current-password" required>
<button type="submit">Sign in</button>
</form>
</main>"#,
            token = esc(token)
        ),
    )
}

fn secret_row(label: &str, id: &str, value: &str) -> String {
    format!(
        r#"<div class="secret"><span class="label" id="{id}-label">{label}</span> <code id="{id}">{value}</code> <button type="button" class="copy" data-copy="{id}" aria-describedby="{id}-label">Copy</button></div>"#,
        label = esc(label),
        value = esc(value)
    )
}

pub(super) fn notice_html(notice: Option<Notice>) -> String {
    match notice {
        None => String::new(),
        Some(Notice::KeySecret(secret)) => format!(
            r#"<section class="notice once" role="status"><h2>New API key</h2><p>Copy it now: it is shown this once. Afterwards only its last four characters are shown.</p>{}</section>"#,
            secret_row("Key", "new-key", &secret)
        ),
        Some(Notice::ConnectorSecret {
            client_id,
            secret,
            url,
        }) => format!(
            r#"<section class="notice once" role="status"><h2>Connector credentials</h2><p>Enter these in the AudioHook integration of Genesys Cloud. The client secret is shown this once.</p>{}{}{}</section>"#,
            secret_row("Client id (API key)", "client-id", &client_id),
            secret_row("Client secret", "client-secret", &secret),
            secret_row("WebSocket URL", "ws-url", &url)
        ),
        Some(Notice::McpTest(Ok(tools))) => {
            let items: String = if tools.is_empty() {
                "<li>The server offers no tools.</li>".to_owned()
            } else {
                tools
                    .iter()
                    .map(|(n, d)| format!("<li><code>{}</code> {}</li>", esc(n), esc(d)))
                    .collect()
            };
            format!(
                r#"<section class="notice ok" role="status" id="mcp-result"><h2>Connection works</h2><p>Tools:</p><ul>{items}</ul></section>"#
            )
        }
        Some(Notice::McpTest(Err(e))) => format!(
            r#"<section class="notice error" role="alert" id="mcp-result"><h2>Connection failed</h2><p>{}</p></section>"#,
            esc(&e)
        ),
        Some(Notice::Info(m)) => format!(r#"<p class="notice ok" role="status">{}</p>"#, esc(&m)),
        Some(Notice::Error(m)) => {
            format!(r#"<p class="notice error" role="alert">{}</p>"#, esc(&m))
        }
    }
}

pub(super) fn date(rfc3339: &str) -> String {
    esc(&rfc3339
        .replace('T', " ")
        .chars()
        .take(16)
        .collect::<String>())
}

/// API keys.
pub fn keys(s: &Session, org: &Org, keys: &[KeyView], notice: Option<Notice>) -> String {
    let rows: String = keys
        .iter()
        .rev()
        .map(|k| {
            let state = match &k.revoked_at {
                Some(at) => format!("revoked {}", date(at)),
                None => format!(
                    r#"active <form method="post" action="/dashboard/keys/revoke" class="inline">{}<input type="hidden" name="id" value="{}"><button type="submit" class="danger" aria-label="Revoke key ending {}">Revoke</button></form>"#,
                    csrf(s),
                    esc(&k.id),
                    esc(&k.last4)
                ),
            };
            format!(
                "<tr><td>{}</td><td><code>…{}</code></td><td>{}</td><td>{state}</td></tr>",
                esc(k.name.as_deref().unwrap_or("")),
                esc(&k.last4),
                date(&k.created_at)
            )
        })
        .collect();
    let table = if keys.is_empty() {
        "<p>No keys yet.</p>".to_owned()
    } else {
        format!(
            r#"<table><caption>Keys of this organisation, newest first</caption><thead><tr><th scope="col">Name</th><th scope="col">Key</th><th scope="col">Created (UTC)</th><th scope="col">State</th></tr></thead><tbody>{rows}</tbody></table>"#
        )
    };
    let content = format!(
        r#"{notice}
<p>API keys authenticate chat and file transcription (header <code>X-API-Key</code>).</p>
<form method="post" action="/dashboard/keys/create" class="row">{csrf}<label for="key-name">Name</label> <input id="key-name" name="name" maxlength="100"> <button type="submit">Create key</button></form>
{table}"#,
        notice = notice_html(notice),
        csrf = csrf(s)
    );
    layout(s, org, "keys", "API keys", &content)
}

/// AudioHook connectors.
pub fn connectors(
    s: &Session,
    org: &Org,
    list: &[ConnectorView],
    url: &str,
    notice: Option<Notice>,
) -> String {
    let rows: String = list
        .iter()
        .rev()
        .map(|c| {
            let actions = match &c.revoked_at {
                Some(at) => format!("revoked {}", date(at)),
                None => format!(
                    r#"active <form method="post" action="/dashboard/connectors/rotate" class="inline">{csrf}<input type="hidden" name="id" value="{id}"><button type="submit">Rotate secret</button></form> <form method="post" action="/dashboard/connectors/revoke" class="inline">{csrf}<input type="hidden" name="id" value="{id}"><button type="submit" class="danger">Revoke</button></form>"#,
                    csrf = csrf(s),
                    id = esc(&c.client_id)
                ),
            };
            format!(
                "<tr><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{actions}</td></tr>",
                esc(c.name.as_deref().unwrap_or("")),
                esc(&c.client_id),
                date(&c.created_at),
                c.rotated_at.as_deref().map(date).unwrap_or_default()
            )
        })
        .collect();
    let table = if list.is_empty() {
        "<p>No connectors yet.</p>".to_owned()
    } else {
        format!(
            r#"<table><caption>Connectors of this organisation, newest first</caption><thead><tr><th scope="col">Name</th><th scope="col">Client id</th><th scope="col">Created (UTC)</th><th scope="col">Secret rotated</th><th scope="col">State</th></tr></thead><tbody>{rows}</tbody></table>"#
        )
    };
    let content = format!(
        r#"{notice}
<p>A connector is what Genesys Cloud's AudioHook integration uses to stream live calls here. Every connector uses the same WebSocket URL:</p>
{url_row}
<form method="post" action="/dashboard/connectors/create" class="row">{csrf}<label for="connector-name">Name</label> <input id="connector-name" name="name" maxlength="100"> <button type="submit">Create connector</button></form>
{table}"#,
        notice = notice_html(notice),
        url_row = secret_row("WebSocket URL", "fixed-ws-url", url),
        csrf = csrf(s)
    );
    layout(s, org, "connectors", "Connectors", &content)
}

/// What the call-history settings form shows: the plan's retention and the connectors and
/// keys a redaction override may name.
pub struct HistoryChoices {
    /// The plan's `retention_days`; `None`: kept for ever.
    pub plan_days: Option<u32>,
    /// (id, label) of each active connector and API key.
    pub sources: Vec<(String, String)>,
}

fn history_settings(s: &Session, org: &Org, choices: &HistoryChoices) -> String {
    let h = &org.history;
    let kept = match h.retention(choices.plan_days) {
        Some(d) => format!("Records are kept for <strong>{d} days</strong>, then erased."),
        None => "Records are kept until they are deleted.".to_owned(),
    };
    let most = match choices.plan_days {
        Some(d) => format!(r#" max="{d}""#),
        None => String::new(),
    };
    let plan = match choices.plan_days {
        Some(d) => format!("at most {d}, the plan's"),
        None => "empty: as long as the plan keeps them, for ever".to_owned(),
    };
    let overrides: String = choices
        .sources
        .iter()
        .map(|(id, label)| {
            let now = h.redact_connectors.get(id).copied();
            let opt = |value: &str, text: &str, on: bool| {
                format!(
                    r#"<option value="{value}"{}>{text}</option>"#,
                    if on { " selected" } else { "" }
                )
            };
            format!(
                r#"<label for="redact-{id}">{label}</label><select id="redact-{id}" name="redact_{id}">{}{}{}</select>"#,
                opt("default", "As the organisation", now.is_none()),
                opt("on", "Redact", now == Some(true)),
                opt("off", "Do not redact", now == Some(false)),
                id = esc(id),
                label = esc(label),
            )
        })
        .collect();
    let overrides = if overrides.is_empty() {
        String::new()
    } else {
        format!(
            r#"<fieldset class="stack"><legend>Per connector or API key</legend>{overrides}</fieldset>"#
        )
    };
    format!(
        r#"<section aria-labelledby="history-h"><h2 id="history-h">Call history</h2>
<p id="retention-now">{kept}</p>
<form method="post" action="/dashboard/settings/history" class="stack">{csrf}
<label for="retention_days">Keep records for (days; {plan})</label>
<input id="retention_days" name="retention_days" type="number" min="1"{most} value="{own}">
<label class="check"><input type="checkbox" id="redact" name="redact" value="1"{checked}> Redact card numbers, social security numbers, e-mail addresses and phone numbers in transcripts sent, stored and analysed</label>
{overrides}
<button type="submit">Save call history settings</button></form></section>"#,
        csrf = csrf(s),
        own = h.retention_days.map(|d| d.to_string()).unwrap_or_default(),
        checked = if h.redact { " checked" } else { "" },
    )
}

/// System prompt, MCP server and call history.
pub fn settings(
    s: &Session,
    org: &Org,
    history: &HistoryChoices,
    notice: Option<Notice>,
) -> String {
    // Header values are secrets (tokens): only their names are shown again.
    let (url, stored) = match &org.mcp {
        Some(m) if !m.headers.is_empty() => (
            m.url.clone(),
            format!(
                "<p id=\"mcp-stored\">Stored headers: {}. Leave the field empty to keep them; lines you enter replace them all.</p>",
                m.headers
                    .keys()
                    .map(|k| format!("<code>{}</code> (value hidden)", esc(k)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ),
        Some(m) => (m.url.clone(), String::new()),
        None => (String::new(), String::new()),
    };
    let content = format!(
        r#"{notice}
<section aria-labelledby="prompt-h"><h2 id="prompt-h">System prompt</h2>
<p>Put before every chat of this organisation (REST and realtime), ahead of the caller's own system prompt.</p>
<form method="post" action="/dashboard/settings/prompt" class="stack">{csrf}
<label for="system_prompt">Prompt</label>
<textarea id="system_prompt" name="system_prompt" rows="6" maxlength="20000">{prompt}</textarea>
<button type="submit">Save prompt</button></form></section>
<section aria-labelledby="mcp-h"><h2 id="mcp-h">MCP server</h2>
<p>Chat turns may call the tools of this server (Streamable HTTP). Headers are stored encrypted.</p>
<form method="post" action="/dashboard/settings/mcp" class="stack">{csrf}
<label for="mcp-url">URL</label>
<input id="mcp-url" name="url" type="url" value="{url}" placeholder="https://tools.example.com/mcp">
<label for="mcp-headers">Headers, one <code>Name: value</code> per line</label>
{stored}<textarea id="mcp-headers" name="headers" rows="3"></textarea>
<div class="row"><button type="submit">Save MCP server</button> <button type="submit" name="clear" value="1" class="danger">Remove</button></div></form>
<form method="post" action="/dashboard/settings/mcp-test" class="row">{csrf}<button type="submit">Test connection</button></form></section>
{history}"#,
        notice = notice_html(notice),
        history = history_settings(s, org, history),
        csrf = csrf(s),
        prompt = esc(org.system_prompt.as_deref().unwrap_or("")),
        url = esc(&url),
    );
    layout(s, org, "settings", "Settings", &content)
}

fn bar_chart(id: &str, title: &str, unit: &str, days: &[(String, f64)]) -> String {
    let max = days.iter().map(|d| d.1).fold(0.0f64, f64::max).max(1e-9);
    let (w, h, gap) = (22.0, 120.0, 4.0);
    let bars: String = days
        .iter()
        .enumerate()
        .map(|(i, (day, v))| {
            let bh = if *v > 0.0 { (v / max * h).max(2.0) } else { 0.0 };
            let x = i as f64 * (w + gap);
            format!(
                r#"<rect x="{x}" y="{y}" width="{w}" height="{bh}"><title>{day}: {v:.2} {unit}</title></rect><text x="{tx}" y="{ly}" class="day">{d}</text>"#,
                y = h - bh,
                tx = x + w / 2.0,
                ly = h + 14.0,
                d = &day[8..],
            )
        })
        .collect();
    let width = days.len() as f64 * (w + gap);
    let rows: String = days
        .iter()
        .filter(|d| d.1 > 0.0)
        .map(|(day, v)| format!("<tr><td>{day}</td><td>{v:.2}</td></tr>"))
        .collect();
    format!(
        r#"<figure class="chart" id="{id}"><figcaption>{title}</figcaption>
<svg viewBox="0 0 {width} {vh}" role="img" aria-label="{title}, per day">{bars}</svg>
<details><summary>Numbers</summary><table><thead><tr><th scope="col">Day</th><th scope="col">{unit}</th></tr></thead><tbody>{rows}</tbody></table></details></figure>"#,
        vh = h + 20.0,
    )
}

fn meter(label: &str, used: f64, quota: Option<f64>, unit: &str, decimals: usize) -> String {
    let n = |v: f64| format!("{v:.decimals$}");
    match quota {
        Some(q) => format!(
            r#"<p>{label}: <strong>{u}</strong> of {qq} {unit} used, <strong>{left}</strong> left.</p><meter min="0" max="{q}" value="{used}" aria-label="{label} used">{pct:.0}%</meter>"#,
            u = n(used),
            qq = n(q),
            left = n((q - used).max(0.0)),
            pct = if q > 0.0 { used / q * 100.0 } else { 100.0 }
        ),
        None => format!(
            r#"<p>{label}: <strong>{u}</strong> {unit} used; no quota on this plan.</p>"#,
            u = n(used)
        ),
    }
}

/// Usage of the current month.
pub fn usage(s: &Session, org: &Org, report: &UsageReport) -> String {
    let (y, m): (i32, u32) = (
        report.month[..4].parse().unwrap_or(1970),
        report.month[5..].parse().unwrap_or(1),
    );
    let days_in_month = match m {
        4 | 6 | 9 | 11 => 30,
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        _ => 31,
    };
    let series = |kind: UsageKind, scale: f64| -> Vec<(String, f64)> {
        (1..=days_in_month)
            .map(|d| {
                let day = format!("{}-{d:02}", report.month);
                let v = report
                    .days
                    .iter()
                    .filter(|u| u.kind == kind && u.day == day)
                    .map(|u| u.amount as f64)
                    .sum::<f64>();
                (day, v / scale)
            })
            .collect()
    };
    let t = &report.chat_tokens;
    let a = &report.audio_seconds;
    let content = format!(
        r#"<p>Month {month} (UTC), plan <strong>{plan}</strong>.</p>
<section aria-labelledby="pools-h"><h2 id="pools-h">Quotas</h2>
<div id="quota-tokens">{tokens}</div>
<div id="quota-audio">{audio}</div></section>
<section aria-labelledby="charts-h"><h2 id="charts-h">Per day</h2>
{chart_tokens}
{chart_audio}</section>"#,
        month = esc(&report.month),
        plan = esc(&report.plan),
        tokens = meter(
            "Chat tokens",
            t.used as f64,
            t.quota.map(|q| q as f64),
            "tokens",
            0
        ),
        audio = meter(
            "Audio-minutes",
            a.used / 60.0,
            a.quota.map(|q| q / 60.0),
            "minutes",
            2
        ),
        chart_tokens = bar_chart(
            "chart-tokens",
            "Chat tokens",
            "tokens",
            &series(UsageKind::Tokens, 1.0)
        ),
        chart_audio = bar_chart(
            "chart-audio",
            "Audio-minutes (files and live calls)",
            "minutes",
            &series(UsageKind::AudioMs, 60_000.0)
        ),
    );
    layout(s, org, "usage", "Usage", &content)
}

/// Calls in progress, filled in live by the script.
pub fn calls(s: &Session, org: &Org, calls: &[LiveCall], refusals: &Refusals) -> String {
    let initial = serde_json::to_string(calls).expect("calls serialize");
    let last = refusals
        .last_at
        .as_deref()
        .map(|at| format!(", the last at {} UTC", esc(at.get(11..19).unwrap_or(at))))
        .unwrap_or_default();
    let content = format!(
        r#"<p>Calls streaming now through this organisation's connectors. Final transcripts appear as they are recognised.</p>
<p id="live-status" role="status">Connecting…</p>
<p id="refused" data-count="{count}">New calls refused because the service was at its live-call capacity: <span class="n">{count}</span><span class="last">{last}</span>. A refused call is retried by the platform; the calls in progress are not slowed.</p>
<div id="calls" data-initial="{initial}" aria-live="polite"></div>"#,
        count = refusals.count,
        initial = esc(&initial)
    );
    layout(s, org, "calls", "Live calls", &content)
}
