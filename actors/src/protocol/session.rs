//! The AudioHook v2 session as a state machine without I/O.
//!
//! The caller feeds it what arrived on the socket ([`Session::on_text`], [`Session::on_audio`])
//! and acts on what it answers ([`Step`]); every server message goes out through
//! [`Session::envelope`], which numbers it. The session checks the envelope (version, session
//! id, `seq` one more than the last, `serverseq` not ahead of what was sent), negotiates the
//! media, keeps the state (awaiting open, active, paused, closing, ended) and the call timeline:
//! audio received plus audio the client reported as discarded or paused.

use super::messages::{
    ClientMessage, DisconnectParams, Empty, InboundEnvelope, MediaEntry, OpenParams, OpenedParams,
    ServerEnvelope, ServerMessage, VERSION,
};
use crate::audio::frame::{samples_per_channel, Encoding};

/// The only sample rate negotiated.
pub const RATE: u32 = 8000;
/// Longest text frame accepted, in bytes.
pub const MAX_TEXT: usize = 65_535;
/// The nil UUID of connection probes.
pub const NIL_UUID: &str = "00000000-0000-0000-0000-000000000000";

/// Where the session is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Connected; the first message must be `open`.
    AwaitingOpen,
    /// `open` accepted; waiting for the caller to answer it.
    Opening,
    /// Audio flows.
    Active,
    /// The client paused the audio.
    Paused,
    /// The client sent `close`; final transcripts, then `closed`.
    Closing,
    /// The server sent `disconnect`; waiting for the client's `close`.
    Disconnecting,
    /// `closed` was sent; nothing more is accepted.
    Ended,
}

/// The negotiated media.
#[derive(Debug, Clone, PartialEq)]
pub struct Negotiated {
    /// The entry as offered.
    pub entry: MediaEntry,
    /// Its encoding.
    pub encoding: Encoding,
}

impl Negotiated {
    /// Number of interleaved channels.
    pub fn channels(&self) -> usize {
        self.entry.channels.len()
    }
}

/// An accepted `open`, for the caller to answer with [`Session::opened`] or
/// [`Session::disconnect`].
#[derive(Debug, Clone, PartialEq)]
pub struct OpenRequest {
    /// The open's parameters.
    pub params: OpenParams,
    /// The negotiated media, or `None` when nothing offered is supported.
    pub media: Option<Negotiated>,
    /// A connection probe (nil conversation and participant): answer it, bill nothing.
    pub probe: bool,
}

/// What the caller must do after a client frame.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Nothing beyond what the session did.
    None,
    /// Send this reply (already numbered).
    Reply(ServerEnvelope),
    /// Answer the open: check the quota, then [`Session::opened`] or [`Session::disconnect`].
    Open(OpenRequest),
    /// Audio of this many samples per channel arrived; the caller decodes the frame.
    Audio(usize),
    /// Later utterances are in this language; reply with the `updated` here.
    Language(Option<String>, ServerEnvelope),
    /// Run the intent analysis over the transcript so far.
    Analyze,
    /// The client closed: flush the final transcripts, then send [`Session::closed`].
    Close,
    /// The client answered our `disconnect` with `close`: send this `closed`, then close the
    /// socket with 1000.
    Closed(ServerEnvelope),
    /// The client broke the protocol: send this `disconnect` (reason `error`); the session now
    /// waits for the client's `close`.
    Disconnect(ServerEnvelope),
}

/// Most gaps kept apart on a call's timeline (see [`Gaps`]).
const MAX_GAPS: usize = 1024;

/// The pauses and discards on a call's timeline, bounded whatever the client sends: each mark
/// is where a gap was reported (samples per channel received before it) and the seconds
/// skipped up to and including it, in order. Gaps reported with no audio between them are one
/// mark. Past [`MAX_GAPS`] marks the oldest is folded into a floor: a sample older than that
/// many gaps is placed as if it came after them (transcripts are placed within seconds of
/// their audio, so none is placed that far back).
#[derive(Debug, Default)]
struct Gaps {
    marks: std::collections::VecDeque<(u64, f64)>,
    floor: f64,
}

impl Gaps {
    fn push(&mut self, at_sample: u64, secs: f64) {
        let total = self.marks.back().map_or(self.floor, |m| m.1) + secs;
        match self.marks.back_mut() {
            Some(last) if last.0 == at_sample => last.1 = total,
            _ => self.marks.push_back((at_sample, total)),
        }
        if self.marks.len() > MAX_GAPS {
            if let Some((_, total)) = self.marks.pop_front() {
                self.floor = total;
            }
        }
    }

    /// Seconds skipped before sample `n`.
    fn skipped_before(&self, n: u64) -> f64 {
        match self.marks.partition_point(|m| m.0 <= n) {
            0 => self.floor,
            i => self.marks[i - 1].1,
        }
    }
}

/// One AudioHook session.
#[derive(Debug)]
pub struct Session {
    id: Option<String>,
    expected_id: Option<String>,
    state: State,
    client_seq: u64,
    server_seq: u64,
    media: Option<Negotiated>,
    samples: u64,
    gaps: Gaps,
}

impl Session {
    /// A session; `expected_id` is the `Audiohook-Session-Id` of the upgrade request, if any.
    pub fn new(expected_id: Option<String>) -> Self {
        Self {
            id: None,
            expected_id,
            state: State::AwaitingOpen,
            client_seq: 0,
            server_seq: 0,
            media: None,
            samples: 0,
            gaps: Gaps::default(),
        }
    }

    /// The current state.
    pub fn state(&self) -> State {
        self.state
    }

    /// The session id, once `open` arrived.
    pub fn id(&self) -> Option<&str> {
        self.id.as_deref()
    }

    /// The negotiated media, once opened.
    pub fn media(&self) -> Option<&Negotiated> {
        self.media.as_ref()
    }

    /// Samples per channel received so far.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Numbers a server message.
    pub fn envelope(&mut self, message: ServerMessage) -> ServerEnvelope {
        self.server_seq += 1;
        ServerEnvelope {
            version: VERSION.to_owned(),
            id: self.id.clone().unwrap_or_else(|| NIL_UUID.to_owned()),
            seq: self.server_seq,
            clientseq: self.client_seq,
            message,
        }
    }

    /// A `disconnect` with reason `error`; the session then waits for the client's `close`.
    pub fn disconnect(&mut self, info: impl Into<String>) -> ServerEnvelope {
        self.disconnect_for("error", info)
    }

    /// Sends `disconnect` with `reason` (`error`, `unauthorized` or `completed`) and `info`.
    pub fn disconnect_for(&mut self, reason: &str, info: impl Into<String>) -> ServerEnvelope {
        self.state = State::Disconnecting;
        self.envelope(ServerMessage::Disconnect(DisconnectParams {
            reason: reason.to_owned(),
            info: Some(info.into()),
        }))
    }

    /// Accepts the open with its negotiated media.
    pub fn opened(&mut self, supported_languages: Option<Vec<String>>) -> ServerEnvelope {
        self.state = State::Active;
        let media = self.media.iter().map(|m| m.entry.clone()).collect();
        self.envelope(ServerMessage::Opened(OpenedParams {
            media,
            start_paused: None,
            discard_to: None,
            supported_languages,
        }))
    }

    /// The `closed` that ends a session the client closed.
    pub fn closed(&mut self) -> ServerEnvelope {
        self.state = State::Ended;
        self.envelope(ServerMessage::Closed(Empty {}))
    }

    /// Where sample `n` of a channel lies on the call timeline, in seconds: audio received
    /// before it plus every gap reported before it.
    pub fn timeline_secs(&self, n: u64) -> f64 {
        n as f64 / f64::from(RATE) + self.gaps.skipped_before(n)
    }

    /// A binary frame of `len` bytes arrived.
    pub fn on_audio(&mut self, len: usize) -> Step {
        match self.state {
            State::Active | State::Closing => {}
            // Audio racing our disconnect is dropped, as is audio after `closed`.
            State::Disconnecting | State::Ended => return Step::None,
            State::Paused => {
                // Clients pause when they stop sending; audio in a pause is late, not wrong.
                self.state = State::Active;
            }
            State::AwaitingOpen | State::Opening => {
                return Step::Disconnect(self.disconnect("audio before the session was opened"))
            }
        }
        let media = self.media.as_ref().expect("active sessions have media");
        match samples_per_channel(media.encoding, media.channels(), len) {
            Ok(n) => {
                self.samples += n as u64;
                Step::Audio(n)
            }
            Err(e) => Step::Disconnect(self.disconnect(format!("bad audio frame: {e}"))),
        }
    }

    /// A text frame arrived.
    pub fn on_text(&mut self, text: &str) -> Step {
        if self.state == State::Ended {
            return Step::None;
        }
        if text.len() > MAX_TEXT {
            return self.fail(format!(
                "text frame of {} bytes; at most {MAX_TEXT}",
                text.len()
            ));
        }
        let envelope: InboundEnvelope = match serde_json::from_str(text) {
            Ok(e) => e,
            Err(e) => return self.fail(format!("message not understood: {e}")),
        };
        if envelope.version != VERSION {
            return self.fail(format!(
                "version {:?}; this server speaks \"2\"",
                envelope.version
            ));
        }
        match &self.id {
            Some(id) if *id != envelope.id => {
                return self.fail(format!("message for session {}, not {id}", envelope.id))
            }
            None => {
                if let Some(expected) = &self.expected_id {
                    if !expected.eq_ignore_ascii_case(&envelope.id) {
                        return self.fail(format!(
                            "session id {} differs from the Audiohook-Session-Id header {expected}",
                            envelope.id
                        ));
                    }
                }
                self.id = Some(envelope.id.clone());
            }
            Some(_) => {}
        }
        if envelope.seq != self.client_seq + 1 {
            let expected = self.client_seq + 1;
            return self.fail(format!("seq {} where {expected} was due", envelope.seq));
        }
        self.client_seq = envelope.seq;
        if envelope.serverseq > self.server_seq {
            return self.fail(format!(
                "serverseq {} is ahead of the last server message {}",
                envelope.serverseq, self.server_seq
            ));
        }
        match envelope.message() {
            Ok(Some(message)) => self.on_message(message),
            Ok(None) => {
                tracing::info!(session = ?self.id, kind = %envelope.kind, "message type not acted on; ignored");
                Step::None
            }
            Err(e) => self.fail(e),
        }
    }

    fn fail(&mut self, info: String) -> Step {
        if self.state == State::Disconnecting {
            // Already ending; do not stack disconnects.
            return Step::None;
        }
        Step::Disconnect(self.disconnect(info))
    }

    fn on_message(&mut self, message: ClientMessage) -> Step {
        use ClientMessage as M;
        match (self.state, message) {
            (State::AwaitingOpen, M::Open(params)) => {
                self.state = State::Opening;
                let media = negotiate(&params.media);
                self.media = media.clone();
                let probe = params.conversation_id == NIL_UUID && params.participant.id == NIL_UUID;
                Step::Open(OpenRequest {
                    params,
                    media,
                    probe,
                })
            }
            (State::AwaitingOpen, other) => self.fail(format!(
                "{} before open; the first message must be open",
                kind(&other)
            )),
            (_, M::Open(_)) => self.fail("open sent twice".to_owned()),
            // A disconnecting session waits for close only.
            (State::Disconnecting, M::Close(_)) => Step::Closed(self.closed()),
            (State::Disconnecting, _) => Step::None,
            (_, M::Ping(_)) => Step::Reply(self.envelope(ServerMessage::Pong(Empty {}))),
            (_, M::Update(update)) => {
                let updated = self.envelope(ServerMessage::Updated(Empty {}));
                Step::Language(update.language, updated)
            }
            (State::Active | State::Paused, M::Paused(_)) => {
                tracing::info!(session = ?self.id, "client paused the audio");
                self.state = State::Paused;
                Step::None
            }
            (State::Active | State::Paused, m @ (M::Resumed(gap) | M::Discarded(gap))) => {
                tracing::info!(session = ?self.id, message = kind(&m), start_s = gap.start.secs(),
                    skipped_s = gap.discarded.secs(), "client skipped audio");
                if gap.discarded.secs() > 0.0 {
                    self.gaps.push(self.samples, gap.discarded.secs());
                }
                self.state = State::Active;
                Step::None
            }
            (_, m @ (M::Paused(_) | M::Resumed(_) | M::Discarded(_))) => {
                tracing::info!(session = ?self.id, message = kind(&m), "ignored in this state");
                Step::None
            }
            (_, M::Error(e)) => {
                tracing::warn!(code = e.code, message = %e.message, "client reported an error");
                Step::None
            }
            (_, M::Analyze(_)) => Step::Analyze,
            (State::Closing | State::Ended, M::Close(_)) => Step::None,
            (_, M::Close(_)) => {
                self.state = State::Closing;
                Step::Close
            }
        }
    }
}

fn kind(message: &ClientMessage) -> &'static str {
    match message {
        ClientMessage::Open(_) => "open",
        ClientMessage::Ping(_) => "ping",
        ClientMessage::Update(_) => "update",
        ClientMessage::Paused(_) => "paused",
        ClientMessage::Resumed(_) => "resumed",
        ClientMessage::Discarded(_) => "discarded",
        ClientMessage::Error(_) => "error",
        ClientMessage::Close(_) => "close",
        ClientMessage::Analyze(_) => "analyze",
    }
}

/// The first audio entry offering PCMU or L16 at 8000 Hz with one or two channels, whatever
/// their names (the names label the channels).
pub fn negotiate(offers: &[MediaEntry]) -> Option<Negotiated> {
    offers.iter().find_map(|m| {
        let encoding = match m.format.to_ascii_uppercase().as_str() {
            "PCMU" => Encoding::Pcmu,
            "L16" => Encoding::L16,
            _ => return None,
        };
        let channels_ok = (1..=2).contains(&m.channels.len());
        (m.kind.eq_ignore_ascii_case("audio") && m.rate == RATE && channels_ok).then(|| {
            Negotiated {
                entry: m.clone(),
                encoding,
            }
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    const ID: &str = "e160e428-53e2-487c-977d-96989bf5c99d";

    fn text(seq: u64, serverseq: u64, kind: &str, parameters: Value) -> String {
        json!({"version":"2","id":ID,"seq":seq,"serverseq":serverseq,"position":"PT0S",
            "type":kind,"parameters":parameters})
        .to_string()
    }

    fn open_params(media: Value) -> Value {
        json!({"organizationId":"d7934305-0972-4844-938e-9060eef73d05",
            "conversationId":"090eaa2f-72fa-480a-83e0-8667ff89c0ec",
            "participant":{"id":"883efee8-3d6c-4537-b500-6d7ca4b92fa0","ani":"+1555","aniName":"","dnis":"+1800"},
            "media":media,"language":"en-US"})
    }

    fn stereo_pcmu() -> Value {
        json!([{"type":"audio","format":"PCMU","channels":["external","internal"],"rate":8000}])
    }

    fn opened() -> Session {
        let mut s = Session::new(None);
        let Step::Open(req) = s.on_text(&text(1, 0, "open", open_params(stereo_pcmu()))) else {
            panic!("open expected")
        };
        assert!(!req.probe);
        s.opened(None);
        s
    }

    fn json_of(e: &ServerEnvelope) -> Value {
        serde_json::to_value(e).unwrap()
    }

    #[test]
    fn open_negotiates_the_first_supported_entry() {
        let offers = json!([
            {"type":"audio","format":"PCMA","channels":["external"],"rate":8000},
            {"type":"audio","format":"L16","channels":["external","internal"],"rate":16000},
            {"type":"audio","format":"L16","channels":["internal","external"],"rate":8000},
            {"type":"audio","format":"PCMU","channels":["external"],"rate":8000}
        ]);
        let mut s = Session::new(Some(ID.to_uppercase()));
        let Step::Open(req) = s.on_text(&text(1, 0, "open", open_params(offers.clone()))) else {
            panic!("open expected")
        };
        let media = req.media.unwrap();
        assert_eq!(media.encoding, Encoding::L16);
        assert_eq!(media.entry.channels, ["internal", "external"]);
        let reply = json_of(&s.opened(None));
        assert_eq!(reply["type"], "opened");
        assert_eq!(reply["seq"], 1);
        assert_eq!(reply["clientseq"], 1);
        assert_eq!(reply["parameters"]["media"], json!([offers[2]]));
        assert_eq!(s.state(), State::Active);
    }

    #[test]
    fn a_minimal_open_is_accepted_and_any_channel_names_label_the_channels() {
        // Only what the contract sends: no serverseq, position, organisation, conversation or
        // participant; channel names that are neither external nor internal.
        let mut s = Session::new(None);
        let minimal = json!({"version":"2","id":ID,"seq":1,"type":"open","parameters":{
            "language":"en-US",
            "media":[{"type":"audio","format":"pcmu","channels":["caller","agent"],"rate":8000}]}});
        let Step::Open(req) = s.on_text(&minimal.to_string()) else {
            panic!("open expected")
        };
        assert!(!req.probe);
        let media = req.media.unwrap();
        assert_eq!(media.encoding, Encoding::Pcmu);
        assert_eq!(media.entry.channels, ["caller", "agent"]);
        s.opened(None);
        // A close without a reason is a close: transcripts are flushed, then `closed`.
        let close = json!({"version":"2","id":ID,"seq":2,"type":"close","parameters":{}});
        assert_eq!(s.on_text(&close.to_string()), Step::Close);
        assert_eq!(s.closed().message, ServerMessage::Closed(Empty {}));
    }

    #[test]
    fn unknown_message_types_are_ignored_but_still_numbered() {
        let mut s = opened();
        for (seq, kind) in [
            (2, "dtmf"),
            (3, "playback_started"),
            (4, "playback_completed"),
        ] {
            let params = json!({"digit": "5"});
            assert_eq!(s.on_text(&text(seq, 1, kind, params)), Step::None, "{kind}");
        }
        assert!(matches!(
            s.on_text(&text(5, 1, "ping", json!({}))),
            Step::Reply(_)
        ));
        // Sequence checks still apply to them.
        assert!(matches!(
            s.on_text(&text(7, 1, "dtmf", json!({}))),
            Step::Disconnect(_)
        ));
        // A known type whose parameters cannot be read is refused.
        let mut s = opened();
        assert!(matches!(
            s.on_text(&text(2, 1, "update", json!({"language": 5}))),
            Step::Disconnect(_)
        ));
    }

    #[test]
    fn unsupported_media_negotiates_nothing() {
        let offers = json!([{"type":"audio","format":"PCMA","channels":["external"],"rate":8000},
            {"type":"audio","format":"PCMU","channels":["external"],"rate":16000}]);
        let mut s = Session::new(None);
        let Step::Open(req) = s.on_text(&text(1, 0, "open", open_params(offers))) else {
            panic!("open expected")
        };
        assert_eq!(req.media, None);
        let d = json_of(&s.disconnect("no supported media"));
        assert_eq!(d["type"], "disconnect");
        assert_eq!(d["parameters"]["reason"], "error");
        assert_eq!(s.state(), State::Disconnecting);
        let Step::Closed(c) = s.on_text(&text(2, 1, "close", json!({"reason":"disconnect"})))
        else {
            panic!("closed expected")
        };
        assert_eq!(json_of(&c)["type"], "closed");
        assert_eq!(s.state(), State::Ended);
    }

    #[test]
    fn probes_are_recognised() {
        let mut params = open_params(stereo_pcmu());
        params["conversationId"] = json!(NIL_UUID);
        params["participant"] = json!({"id":NIL_UUID,"ani":"","aniName":"","dnis":""});
        let mut s = Session::new(None);
        let Step::Open(req) = s.on_text(&text(1, 0, "open", params)) else {
            panic!("open expected")
        };
        assert!(req.probe);
    }

    #[test]
    fn ping_gets_a_pong_answering_its_seq() {
        let mut s = opened();
        let Step::Reply(pong) = s.on_text(&text(2, 1, "ping", json!({"rtt":"PT0.05S"}))) else {
            panic!("pong expected")
        };
        let pong = json_of(&pong);
        assert_eq!(
            (pong["type"].clone(), pong["seq"].clone()),
            (json!("pong"), json!(2))
        );
        assert_eq!(pong["clientseq"], 2);
        assert_eq!(pong["id"], ID);
    }

    #[test]
    fn sequence_errors_disconnect() {
        let mut s = opened();
        let Step::Disconnect(d) = s.on_text(&text(3, 1, "ping", json!({}))) else {
            panic!("disconnect expected")
        };
        assert!(json_of(&d)["parameters"]["info"]
            .as_str()
            .unwrap()
            .contains("seq 3 where 2 was due"));

        let mut s = opened();
        assert!(matches!(
            s.on_text(&text(2, 5, "ping", json!({}))),
            Step::Disconnect(_)
        ));

        let mut s = opened();
        let other =
            text(2, 1, "ping", json!({})).replace(ID, "11111111-2222-4333-8444-555555555555");
        assert!(matches!(s.on_text(&other), Step::Disconnect(_)));
    }

    #[test]
    fn header_session_id_must_match() {
        let mut s = Session::new(Some("11111111-2222-4333-8444-555555555555".into()));
        assert!(matches!(
            s.on_text(&text(1, 0, "open", open_params(stereo_pcmu()))),
            Step::Disconnect(_)
        ));
    }

    #[test]
    fn first_message_must_be_open_and_audio_must_follow_it() {
        let mut s = Session::new(None);
        assert!(matches!(s.on_audio(320), Step::Disconnect(_)));
        let mut s = Session::new(None);
        assert!(matches!(
            s.on_text(&text(1, 0, "ping", json!({}))),
            Step::Disconnect(_)
        ));
        let mut s = Session::new(None);
        assert!(matches!(s.on_text("not json"), Step::Disconnect(_)));
        assert!(matches!(s.on_text("still not json"), Step::None));
    }

    #[test]
    fn audio_counts_samples_and_rejects_partial_frames() {
        let mut s = opened();
        assert_eq!(s.on_audio(3200), Step::Audio(1600));
        assert_eq!(s.samples(), 1600);
        assert!(matches!(s.on_audio(3201), Step::Disconnect(_)));
    }

    #[test]
    fn gaps_move_the_timeline() {
        let mut s = opened();
        s.on_audio(16_000); // 1 s
        assert_eq!(s.on_text(&text(2, 1, "paused", json!({}))), Step::None);
        assert_eq!(s.state(), State::Paused);
        s.on_text(&text(
            3,
            1,
            "resumed",
            json!({"start":"PT1S","discarded":"PT2.5S"}),
        ));
        assert_eq!(s.state(), State::Active);
        s.on_audio(16_000);
        s.on_text(&text(
            4,
            1,
            "discarded",
            json!({"start":"PT4.5S","discarded":"PT0.5S"}),
        ));
        assert!((s.timeline_secs(4000) - 0.5).abs() < 1e-9);
        assert!((s.timeline_secs(8000) - 3.5).abs() < 1e-9);
        assert!((s.timeline_secs(12_000) - 4.0).abs() < 1e-9);
        assert!((s.timeline_secs(16_000) - 5.0).abs() < 1e-9);
    }

    #[test]
    fn gaps_are_merged_and_bounded() {
        let mut s = opened();
        let mut seq = 1;
        let mut discard = |s: &mut Session| {
            seq += 1;
            s.on_text(&text(
                seq,
                1,
                "discarded",
                json!({"start":"PT0S","discarded":"PT0.5S"}),
            ));
        };
        // Gaps with no audio between them are one.
        discard(&mut s);
        discard(&mut s);
        assert_eq!(s.gaps.marks.len(), 1);
        assert!((s.timeline_secs(0) - 1.0).abs() < 1e-9);
        // A flood of gaps between frames keeps a bounded list, and recent audio in place.
        for _ in 0..10 * MAX_GAPS {
            s.on_audio(2);
            discard(&mut s);
        }
        assert_eq!(s.gaps.marks.len(), MAX_GAPS);
        let n = s.samples();
        let expected = n as f64 / 8000.0 + 0.5 * (2 + 10 * MAX_GAPS) as f64;
        assert!((s.timeline_secs(n) - expected).abs() < 1e-6);
        assert!((s.timeline_secs(n - 1) - (expected - 0.5 - 1.0 / 8000.0)).abs() < 1e-6);
    }

    #[test]
    fn update_analyze_and_close() {
        let mut s = opened();
        let Step::Language(lang, updated) =
            s.on_text(&text(2, 1, "update", json!({"language":"en-GB"})))
        else {
            panic!("language expected")
        };
        assert_eq!(lang.as_deref(), Some("en-GB"));
        assert_eq!(json_of(&updated)["type"], "updated");
        assert_eq!(s.on_text(&text(3, 2, "analyze", json!({}))), Step::Analyze);
        assert_eq!(
            s.on_text(&text(4, 2, "error", json!({"code":500,"message":"x"}))),
            Step::None
        );
        assert_eq!(
            s.on_text(&text(5, 2, "close", json!({"reason":"end"}))),
            Step::Close
        );
        assert_eq!(s.state(), State::Closing);
        let closed = json_of(&s.closed());
        assert_eq!(
            (closed["type"].clone(), closed["seq"].clone()),
            (json!("closed"), json!(3))
        );
        assert_eq!(s.on_text(&text(6, 3, "ping", json!({}))), Step::None);
    }
}
