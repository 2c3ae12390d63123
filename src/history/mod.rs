//! Call history: every live call and file transcription of an organisation, kept in the store
//! as it happens, searchable, exportable, erased on request and purged after the
//! organisation's retention period.
//!
//! A record is a head ([`RecordHead`]: who, when, how it ended, what was billed, the latest
//! intent, a file's analyses), its final transcript lines ([`Line`]) and, for a live call, its
//! intent updates ([`IntentEntry`]). Every read and write names the organisation: a record of
//! another organisation is not found, whatever its id.
//!
//! A live call's record id is derived from the organisation and the AudioHook session the call
//! began with (the first of `continuedSessions` when the platform resumes a call on another
//! instance), so a call that moves between instances stays one record. Lines are keyed by
//! channel and offset, so a line written twice is kept once.
//!
//! The writes of live calls go through [`writer`]: the call's actor hands them over without
//! waiting, and one task per process writes them in order, a batch at a time.

pub mod export;

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Most records a page of `GET /api/calls` holds.
pub const MAX_PAGE: usize = 100;
/// Records a page holds when the client does not say.
pub const DEFAULT_PAGE: usize = 20;
/// Longest search query, characters.
pub const MAX_QUERY_CHARS: usize = 200;
/// Most words of a search query.
pub const MAX_QUERY_WORDS: usize = 8;

/// A live call or a file transcription.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RecordKind {
    /// A live call (AudioHook).
    Call,
    /// A transcribed file (`POST /api/transcribe`).
    File,
}

impl RecordKind {
    /// Its tag in the store.
    pub fn tag(self) -> i16 {
        match self {
            RecordKind::Call => 1,
            RecordKind::File => 2,
        }
    }

    /// The kind of a tag.
    pub fn from_tag(tag: i16) -> Option<Self> {
        match tag {
            1 => Some(RecordKind::Call),
            2 => Some(RecordKind::File),
            _ => None,
        }
    }
}

/// What a record is, without its lines.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RecordHead {
    /// `call_` or `tr_` followed by 24 hex digits.
    pub id: String,
    /// Owner.
    pub org_id: String,
    /// A call or a file.
    pub kind: RecordKind,
    /// Unix milliseconds.
    pub started_ms: i64,
    /// Unix milliseconds; none while a call is in progress.
    #[serde(default)]
    pub ended_ms: Option<i64>,
    /// The connector (client id) of a call, or the API key id a file was sent with.
    pub connector: String,
    /// The platform's conversation id (calls).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation_id: Option<String>,
    /// Caller number as the platform sent it (calls).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ani: Option<String>,
    /// Dialled number as the platform sent it (calls).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dnis: Option<String>,
    /// How the call ended (calls).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub close_reason: Option<String>,
    /// Language tag as sent, or the file's language.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    /// Speaker of each channel, in channel order (`Customer`, `Agent`, ...).
    #[serde(default)]
    pub channels: Vec<String>,
    /// Audio billed, milliseconds (a call's length as billing counted it).
    #[serde(default)]
    pub billed_ms: u64,
    /// The file's name as uploaded (files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_name: Option<String>,
    /// Seconds of audio (files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<f64>,
    /// The latest top intent (`intents[0].intent`), for filtering.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intent: Option<String>,
    /// A file's analyses: `intent`, `bant`, `neat_p` as the response had them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub analyses: Option<Value>,
}

/// One final transcript line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Line {
    /// Channel index.
    pub channel: usize,
    /// Seconds from the start of the call (or file).
    pub offset: f64,
    /// Seconds.
    pub duration: f64,
    /// 0 to 1.
    pub confidence: f64,
    /// What was said (redacted when the organisation asks for it).
    pub text: String,
}

impl Line {
    /// Its start in milliseconds: with the channel, the line's key.
    pub fn offset_ms(&self) -> i64 {
        (self.offset * 1000.0).round().max(0.0) as i64
    }
}

/// An intent update of a live call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct IntentEntry {
    /// Unix milliseconds.
    pub at_ms: i64,
    /// The intent result as sent on the call (`intents`, `reasoning`).
    #[schema(value_type = Object)]
    pub result: Value,
}

/// A record with its lines (in time order) and intent updates.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Record {
    /// What it is.
    #[serde(flatten)]
    pub head: RecordHead,
    /// Final transcript lines, in time order (channel breaks ties).
    pub transcript: Vec<Line>,
    /// Intent updates, oldest first.
    pub intents: Vec<IntentEntry>,
}

/// The top intent label of an intent result, if any.
pub fn top_intent(result: &Value) -> Option<String> {
    result
        .get("intents")?
        .as_array()?
        .first()?
        .get("intent")?
        .as_str()
        .map(|s| s.chars().take(64).collect())
}

/// Which records of an organisation a listing wants.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Query {
    /// Started at or after (Unix ms).
    pub from_ms: Option<i64>,
    /// Started before (Unix ms).
    pub to_ms: Option<i64>,
    /// Connector client id (or API key id of a file).
    pub connector: Option<String>,
    /// Latest top intent, exactly.
    pub intent: Option<String>,
    /// Words that must all appear in the transcript ([`words`]).
    pub words: Vec<String>,
    /// Continue after this record (newest first).
    pub after: Option<Cursor>,
    /// Most records.
    pub limit: usize,
}

impl Query {
    /// Whether a head passes the filters other than the words.
    pub fn admits(&self, head: &RecordHead) -> bool {
        self.from_ms.is_none_or(|f| head.started_ms >= f)
            && self.to_ms.is_none_or(|t| head.started_ms < t)
            && self.connector.as_ref().is_none_or(|c| &head.connector == c)
            && self
                .intent
                .as_ref()
                .is_none_or(|i| head.intent.as_ref() == Some(i))
    }
}

/// A position in a listing: the last record of a page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    /// Its start.
    pub started_ms: i64,
    /// Its id.
    pub id: String,
}

impl Cursor {
    /// Opaque text for `next_cursor`.
    pub fn encode(&self) -> String {
        use base64::Engine as _;
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(format!("{}:{}", self.started_ms, self.id))
    }

    /// The cursor `encode` gave, or none for anything else.
    pub fn decode(text: &str) -> Option<Self> {
        use base64::Engine as _;
        if text.len() > 128 {
            return None;
        }
        let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(text)
            .ok()?;
        let raw = String::from_utf8(raw).ok()?;
        let (ms, id) = raw.split_once(':')?;
        let started_ms = ms.parse().ok()?;
        valid_id(id).then(|| Cursor {
            started_ms,
            id: id.to_owned(),
        })
    }

    /// Whether a record comes after this cursor in a listing: newest first, and by id among
    /// records that started in the same millisecond.
    pub fn precedes(&self, started_ms: i64, id: &str) -> bool {
        started_ms < self.started_ms || (started_ms == self.started_ms && id > self.id.as_str())
    }
}

/// A page of records, newest first.
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    /// The records.
    pub heads: Vec<RecordHead>,
    /// Where the next page starts, if there may be one.
    pub next: Option<Cursor>,
}

/// The lower-case words of a text, as search sees them: runs of letters and digits (an
/// apostrophe inside a word is dropped: `don't` is `dont`). Bracketed redaction tags are words
/// too (`[card]` is `card`).
pub fn words(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    for c in text.chars() {
        if c.is_alphanumeric() {
            word.extend(c.to_lowercase());
        } else if c == '\'' || c == '\u{2019}' {
            continue;
        } else if !word.is_empty() {
            out.push(std::mem::take(&mut word));
        }
    }
    if !word.is_empty() {
        out.push(word);
    }
    for w in &mut out {
        // A key part, bounded: a 200-character "word" is cut, not refused.
        if w.len() > 64 {
            let mut end = 64;
            while !w.is_char_boundary(end) {
                end -= 1;
            }
            w.truncate(end);
        }
    }
    out
}

/// The distinct words of a search query, at most [`MAX_QUERY_WORDS`].
pub fn query_words(q: &str) -> Vec<String> {
    let mut seen = Vec::new();
    for w in words(q) {
        if !seen.contains(&w) && seen.len() < MAX_QUERY_WORDS {
            seen.push(w);
        }
    }
    seen
}

/// The id of a live call's record: derived from the organisation and the session the call
/// began with, so the sessions of one call share it.
pub fn call_record_id(org_id: &str, first_session: &str) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(format!("{org_id}\0{first_session}").as_bytes());
    let mut id = String::from("call_");
    for b in &digest[..12] {
        id.push_str(&format!("{b:02x}"));
    }
    id
}

/// A new file record's id.
pub fn file_record_id() -> String {
    let bytes: [u8; 12] = rand::random();
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("tr_{hex}")
}

/// Whether `id` has the shape of a record id (so nothing else reaches a store key).
pub fn valid_id(id: &str) -> bool {
    let hex = id.strip_prefix("call_").or_else(|| id.strip_prefix("tr_"));
    hex.is_some_and(|h| h.len() == 24 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The kind a record id names.
pub fn kind_of(id: &str) -> Option<RecordKind> {
    if id.starts_with("call_") {
        Some(RecordKind::Call)
    } else if id.starts_with("tr_") {
        Some(RecordKind::File)
    } else {
        None
    }
}

/// Why a listing's query string is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct QueryError {
    /// Stable machine-readable code (`invalid_query`, `invalid_cursor`).
    pub code: &'static str,
    /// What is wrong.
    pub message: String,
}

impl QueryError {
    fn new(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

/// A time in a query: RFC 3339, or Unix milliseconds.
fn instant(name: &str, value: &str) -> Result<i64, QueryError> {
    let value = value.trim();
    if let Ok(ms) = value.parse::<i64>() {
        return Ok(ms);
    }
    time::OffsetDateTime::parse(value, &time::format_description::well_known::Rfc3339)
        .map(|t| (t.unix_timestamp_nanos() / 1_000_000) as i64)
        .map_err(|_| {
            QueryError::new(
                "invalid_query",
                format!("{name} must be an RFC 3339 time or Unix milliseconds, not {value:?}"),
            )
        })
}

/// The listing a query string asks for.
pub fn query_of(params: &HashMap<String, String>) -> Result<Query, QueryError> {
    let text = |name: &str| params.get(name).map(|v| v.trim()).filter(|v| !v.is_empty());
    let q = text("q").unwrap_or("");
    if q.chars().count() > MAX_QUERY_CHARS {
        return Err(QueryError::new(
            "invalid_query",
            format!("q is longer than {MAX_QUERY_CHARS} characters"),
        ));
    }
    let limit = match text("limit") {
        None => DEFAULT_PAGE,
        Some(l) => match l.parse::<usize>() {
            Ok(n) if (1..=MAX_PAGE).contains(&n) => n,
            _ => {
                return Err(QueryError::new(
                    "invalid_query",
                    format!("limit must be a number from 1 to {MAX_PAGE}"),
                ))
            }
        },
    };
    let after = match text("cursor") {
        None => None,
        Some(c) => Some(Cursor::decode(c).ok_or_else(|| {
            QueryError::new("invalid_cursor", "cursor is not one this service gave")
        })?),
    };
    let bounded = |name: &str, most: usize| -> Result<Option<String>, QueryError> {
        match text(name) {
            Some(v) if v.chars().count() > most => Err(QueryError::new(
                "invalid_query",
                format!("{name} is longer than {most} characters"),
            )),
            v => Ok(v.map(str::to_owned)),
        }
    };
    Ok(Query {
        from_ms: text("from").map(|v| instant("from", v)).transpose()?,
        to_ms: text("to").map(|v| instant("to", v)).transpose()?,
        connector: bounded("connector", 128)?,
        intent: bounded("intent", 64)?,
        words: query_words(q),
        after,
        limit,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn search_words_are_lower_case_runs_of_letters_and_digits() {
        assert_eq!(
            words("Hello, I'd like to CANCEL order #4471-b. [card]"),
            vec!["hello", "id", "like", "to", "cancel", "order", "4471", "b", "card"]
        );
        assert_eq!(query_words("refund REFUND refund"), vec!["refund"]);
        assert_eq!(query_words(&"a ".repeat(50)).len(), 1);
        let long = "x".repeat(300);
        assert_eq!(words(&long)[0].len(), 64);
    }

    #[test]
    fn cursors_round_trip_and_refuse_anything_else() {
        let c = Cursor {
            started_ms: 1_700_000_000_123,
            id: call_record_id("org_a", "s1"),
        };
        assert_eq!(Cursor::decode(&c.encode()), Some(c.clone()));
        assert_eq!(Cursor::decode("not a cursor"), None);
        assert_eq!(Cursor::decode(""), None);
        assert!(c.precedes(c.started_ms - 1, &c.id));
        assert!(!c.precedes(c.started_ms, &c.id));
    }

    #[test]
    fn a_call_record_id_is_the_organisations_own() {
        let a = call_record_id("org_a", "session");
        assert!(valid_id(&a));
        assert_eq!(a, call_record_id("org_a", "session"));
        assert_ne!(a, call_record_id("org_b", "session"));
        assert!(valid_id(&file_record_id()));
        assert!(!valid_id("call_../../etc"));
        assert_eq!(kind_of(&a), Some(RecordKind::Call));
    }
}
