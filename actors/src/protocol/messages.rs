//! AudioHook v2 messages as typed values. Every text frame is an envelope (`version`, `id`,
//! `seq`, and `serverseq` + `position` from the client or `clientseq` from the server) around
//! a message whose `type` names its `parameters`.
//!
//! The server reads client frames leniently ([`InboundEnvelope`]): it requires what it cannot
//! act without (`version`, `id`, `seq`, `type`), defaults the rest (`serverseq` 0, `close`
//! reason `end`, `open` identifiers empty), and leaves types it does not know (`dtmf`,
//! `playback_started`, future ones) to the caller to log and ignore.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The protocol version string.
pub const VERSION: &str = "2";

/// A point or length on the stream timeline, written `PT<seconds>S` on the wire.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Default)]
pub struct Duration(pub f64);

impl Duration {
    /// Seconds.
    pub fn secs(self) -> f64 {
        self.0
    }
}

impl std::fmt::Display for Duration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Millisecond precision, trailing zeros dropped: PT0S, PT1.2S, PT12.345S.
        let ms = (self.0.max(0.0) * 1000.0).round() as u64;
        let (s, frac) = (ms / 1000, ms % 1000);
        if frac == 0 {
            write!(f, "PT{s}S")
        } else {
            let frac = format!("{frac:03}");
            write!(f, "PT{s}.{}S", frac.trim_end_matches('0'))
        }
    }
}

impl std::str::FromStr for Duration {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let secs = s
            .strip_prefix("PT")
            .and_then(|r| r.strip_suffix('S'))
            .filter(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit() || c == '.'))
            .and_then(|n| n.parse::<f64>().ok())
            .filter(|v| v.is_finite())
            .ok_or_else(|| format!("{s:?} is not a PT<seconds>S duration"))?;
        Ok(Duration(secs))
    }
}

impl Serialize for Duration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// An offered or negotiated media entry. Missing fields read as empty, so an entry the server
/// cannot use is passed over rather than refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MediaEntry {
    /// `audio`.
    #[serde(rename = "type", default = "audio")]
    pub kind: String,
    /// `PCMU` or `L16`.
    #[serde(default)]
    pub format: String,
    /// Leg names in interleaving order (`external`, `internal`, or any other names).
    #[serde(default)]
    pub channels: Vec<String>,
    /// Sample rate.
    #[serde(default)]
    pub rate: u32,
}

fn audio() -> String {
    "audio".to_owned()
}

/// The calling party.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Participant {
    /// UUID.
    #[serde(default)]
    pub id: String,
    /// Caller number.
    #[serde(default)]
    pub ani: String,
    /// Caller name.
    #[serde(default, rename = "aniName")]
    pub ani_name: String,
    /// Dialled number.
    #[serde(default)]
    pub dnis: String,
}

/// `open` parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OpenParams {
    /// Genesys organisation UUID.
    #[serde(default)]
    pub organization_id: String,
    /// Conversation UUID (nil for a connection probe).
    #[serde(default)]
    pub conversation_id: String,
    /// The calling party.
    #[serde(default)]
    pub participant: Participant,
    /// Offered media, in preference order.
    #[serde(default)]
    pub media: Vec<MediaEntry>,
    /// Language tag of the call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    /// Whether the client wants the language list in `opened`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supported_languages: Option<bool>,
    /// Earlier sessions of the same call, when the platform resumes it (oldest first).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub continued_sessions: Vec<ContinuedSession>,
}

/// An earlier session of a call that `open` continues.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContinuedSession {
    /// Its session id.
    #[serde(default)]
    pub id: String,
}

/// Parameters with nothing in them (`{}`); extra fields are ignored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Empty {}

/// `ping` parameters.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PingParams {
    /// The previous round trip.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtt: Option<Duration>,
}

/// `update` parameters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpdateParams {
    /// New language tag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
}

/// `resumed` and `discarded` parameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GapParams {
    /// Where the gap starts on the client's timeline.
    #[serde(default)]
    pub start: Duration,
    /// How long it is.
    #[serde(default)]
    pub discarded: Duration,
}

/// `error` parameters (client to server).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorParams {
    /// HTTP-like code.
    #[serde(default)]
    pub code: u16,
    /// Text.
    #[serde(default)]
    pub message: String,
}

/// `close` parameters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CloseParams {
    /// `end`, `error`, `disconnect` or `reconnect`; `end` when not given.
    #[serde(default = "end")]
    pub reason: String,
}

fn end() -> String {
    "end".to_owned()
}

/// A message from the client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "parameters", rename_all = "snake_case")]
pub enum ClientMessage {
    /// Start of a session.
    Open(OpenParams),
    /// Liveness.
    Ping(PingParams),
    /// A change mid-call (language).
    Update(UpdateParams),
    /// Audio paused (hold, secure pause).
    Paused(Empty),
    /// Audio resumed after a pause.
    Resumed(GapParams),
    /// Audio skipped.
    Discarded(GapParams),
    /// The client reports an error.
    Error(ErrorParams),
    /// End of the session.
    Close(CloseParams),
    /// Our extension: classify the intent of the transcript so far.
    Analyze(Empty),
}

/// The message types a client may send that this server acts on.
const CLIENT_TYPES: [&str; 9] = [
    "open",
    "ping",
    "update",
    "paused",
    "resumed",
    "discarded",
    "error",
    "close",
    "analyze",
];

/// A client text frame as the server reads it: the fields the sequence checks need, the
/// message type, and its parameters as JSON until the type is known to be one we act on.
#[derive(Debug, Clone, Deserialize)]
pub struct InboundEnvelope {
    /// `2`.
    pub version: String,
    /// Session UUID.
    pub id: String,
    /// The client's message number.
    pub seq: u64,
    /// The last server message the client saw (0 when not given).
    #[serde(default)]
    pub serverseq: u64,
    /// The message type.
    #[serde(rename = "type")]
    pub kind: String,
    /// Its parameters (`{}` when not given).
    #[serde(default)]
    pub parameters: serde_json::Value,
}

impl InboundEnvelope {
    /// The message; `Ok(None)` for a type this server does not act on (`dtmf`,
    /// `playback_started`, ...); `Err` when a known type's parameters cannot be read.
    pub fn message(&self) -> Result<Option<ClientMessage>, String> {
        if !CLIENT_TYPES.contains(&self.kind.as_str()) {
            return Ok(None);
        }
        let parameters = match &self.parameters {
            serde_json::Value::Null => serde_json::json!({}),
            p => p.clone(),
        };
        serde_json::from_value(serde_json::json!({"type": self.kind, "parameters": parameters}))
            .map(Some)
            .map_err(|e| format!("{} parameters not understood: {e}", self.kind))
    }
}

/// A client text frame, as a client writes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClientEnvelope {
    /// `2`.
    pub version: String,
    /// Session UUID.
    pub id: String,
    /// The client's message number.
    pub seq: u64,
    /// The last server message the client saw.
    pub serverseq: u64,
    /// Position on the client's stream timeline.
    pub position: Duration,
    /// The message.
    #[serde(flatten)]
    pub message: ClientMessage,
}

/// `opened` parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OpenedParams {
    /// The negotiated entry (one of the offered ones, unchanged), or none.
    pub media: Vec<MediaEntry>,
    /// Whether the client must start paused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_paused: Option<bool>,
    /// Audio the client should skip before sending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discard_to: Option<Duration>,
    /// Language tags we accept (when the client asked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supported_languages: Option<Vec<String>>,
}

/// One interpretation of an alternative.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Interpretation {
    /// `display`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The text.
    pub transcript: String,
    /// Words with timing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tokens: Vec<Token>,
}

/// A word of an interpretation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Token {
    /// `word`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The word.
    pub value: String,
    /// 0 to 1.
    pub confidence: f64,
    /// Start on the stream timeline.
    pub offset: Duration,
    /// Length.
    pub duration: Duration,
    /// Language of the word.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
}

/// One alternative of a transcript.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Alternative {
    /// 0 to 1.
    pub confidence: f64,
    /// Languages of the alternative.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub languages: Option<Vec<String>>,
    /// Interpretations; the first is `display`.
    pub interpretations: Vec<Interpretation>,
}

/// The data of a transcript entity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TranscriptData {
    /// Transcript UUID.
    pub id: String,
    /// Index into the negotiated channels.
    pub channel_id: usize,
    /// Always true here: only final transcripts are sent.
    pub is_final: bool,
    /// Start on the stream timeline.
    pub offset: Duration,
    /// Length.
    pub duration: Duration,
    /// Alternatives, best first.
    pub alternatives: Vec<Alternative>,
}

/// An entity of an `event`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data", rename_all = "snake_case")]
pub enum Entity {
    /// A transcript.
    Transcript(TranscriptData),
}

/// `event` parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventParams {
    /// The entities.
    pub entities: Vec<Entity>,
}

/// `disconnect` parameters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DisconnectParams {
    /// `completed`, `unauthorized` or `error`.
    pub reason: String,
    /// Explanation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub info: Option<String>,
}

/// `intent_update` parameters (our extension).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IntentUpdateParams {
    /// An intent result (spec 2.6); `null` when the analysis failed.
    pub intent: serde_json::Value,
    /// Why the analysis failed, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A message from the server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "parameters", rename_all = "snake_case")]
pub enum ServerMessage {
    /// The session is open.
    Opened(OpenedParams),
    /// Answer to `ping`.
    Pong(Empty),
    /// Answer to `update`.
    Updated(Empty),
    /// Transcripts.
    Event(EventParams),
    /// Ask the client to pause.
    Pause(Empty),
    /// Ask the client to resume.
    Resume(Empty),
    /// The server ends the session.
    Disconnect(DisconnectParams),
    /// Answer to `close`.
    Closed(Empty),
    /// Answer to `analyze`.
    IntentUpdate(IntentUpdateParams),
}

/// A server text frame.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerEnvelope {
    /// `2`.
    pub version: String,
    /// Session UUID.
    pub id: String,
    /// The server's message number.
    pub seq: u64,
    /// The last client message the server processed.
    pub clientseq: u64,
    /// The message.
    #[serde(flatten)]
    pub message: ServerMessage,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn capture(direction: &str) -> Vec<Value> {
        let path = crate::package_dir(env!("CARGO_MANIFEST_DIR"))
            .join("../fixtures/audiohook-session-capture.txt");
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .filter_map(|l| {
                l.split_once(&format!("{direction} TEXT "))
                    .map(|(_, json)| serde_json::from_str(json).unwrap())
            })
            .collect()
    }

    #[test]
    fn durations_read_and_write_the_wire_form() {
        for (text, secs) in [
            ("PT0S", 0.0),
            ("PT1.2S", 1.2),
            ("PT12S", 12.0),
            ("PT0.001864231S", 0.001864231),
        ] {
            assert_eq!(text.parse::<Duration>().unwrap().secs(), secs);
        }
        for bad in ["P1S", "PT1M2S", "PTS", "PT-1S", "1.2"] {
            assert!(bad.parse::<Duration>().is_err(), "{bad}");
        }
        assert_eq!(Duration(0.0).to_string(), "PT0S");
        assert_eq!(Duration(1.25).to_string(), "PT1.25S");
        assert_eq!(Duration(70.8).to_string(), "PT70.8S");
    }

    #[test]
    fn every_captured_client_message_parses() {
        let frames = capture("C->S");
        assert!(frames.len() >= 20);
        let mut kinds = std::collections::BTreeSet::new();
        for f in &frames {
            let env: ClientEnvelope =
                serde_json::from_value(f.clone()).unwrap_or_else(|e| panic!("{f}: {e}"));
            assert_eq!(env.version, VERSION);
            kinds.insert(f["type"].as_str().unwrap().to_owned());
            if let ClientMessage::Open(open) = &env.message {
                assert!(!open.media.is_empty());
            }
        }
        for kind in [
            "open",
            "ping",
            "close",
            "paused",
            "resumed",
            "discarded",
            "update",
            "error",
        ] {
            assert!(kinds.contains(kind), "the capture has {kind}");
        }
    }

    #[test]
    fn captured_server_messages_round_trip_exactly() {
        let frames = capture("S->C");
        let mut checked = 0;
        for f in frames {
            let env: ServerEnvelope =
                serde_json::from_value(f.clone()).unwrap_or_else(|e| panic!("{f}: {e}"));
            // Our serializer writes the same JSON (up to key order) for every message kind we send.
            assert_eq!(serde_json::to_value(&env).unwrap(), f);
            checked += 1;
        }
        assert!(checked >= 10);
    }

    #[test]
    fn our_messages_have_the_spec_shape() {
        let env = ServerEnvelope {
            version: VERSION.into(),
            id: "s".into(),
            seq: 3,
            clientseq: 2,
            message: ServerMessage::Disconnect(DisconnectParams {
                reason: "error".into(),
                info: Some("Transcription quota exhausted for this plan".into()),
            }),
        };
        assert_eq!(
            serde_json::to_value(&env).unwrap(),
            json!({"version": "2", "id": "s", "seq": 3, "clientseq": 2, "type": "disconnect",
                   "parameters": {"reason": "error", "info": "Transcription quota exhausted for this plan"}})
        );
        let analyze: ClientEnvelope =
            serde_json::from_value(json!({"version": "2", "id": "s", "seq": 4, "serverseq": 3,
            "position": "PT5S", "type": "analyze", "parameters": {}}))
            .unwrap();
        assert_eq!(analyze.message, ClientMessage::Analyze(Empty {}));
        assert_eq!(analyze.position, Duration(5.0));
    }
}
