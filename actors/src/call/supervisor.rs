//! The call supervisor: one per live call. It owns the protocol session, answers the client,
//! spawns the call's children once the session opens (a deinterleaver, a transcriber per
//! channel, an intent actor), turns their results into `event` and `intent_update` messages,
//! and reports audio to the billing actor. Audio is served only under a lease: the call takes
//! [`CallSettings::quota_slice`] of the organisation's pool at open and asks for the next slice
//! when half of the current one is left, so no call streams past the quota, however fast its
//! client sends. Leases are asked for and answered by message ([`CallMsg::Leased`]), never
//! awaited inside a handler: a slow store delays no frame. A frame past the lease while the
//! next one is on its way waits, in order, with its credit held (so the socket is read no
//! further), and is served when the lease comes; nothing is dropped unless the pool is dry.
//! The service can end a call from outside ([`CallMsg::Disconnect`]: revocation, shutdown).
//!
//! A child that fails ends the call ([`CallEnd::ChildFailed`]), except the intent actor, which
//! is started again (its run is lost and answered with an error). The call's usage is written
//! before the socket is closed, whichever way the call ends.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use ractor::concurrency::JoinHandle;
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, SupervisionEvent};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::deinterleaver::{Deinterleaver, DeinterleaverArgs, DeinterleaverMsg};
use super::intent::{Intent, IntentArgs, IntentMsg, IntentOutcome};
pub use super::message::CallMsg;
use super::outbound::{CallEnd, Child, DisconnectReason, Outbound};
use super::ports::{CallEnded, CallInfo, CallObserver, FinalLine, IntentClassifier};
use super::settings::{CallSettings, Credit, LiveStats};
use super::transcriber::{
    ChannelTranscript, Transcriber, TranscriberArgs, TranscriberEvent, TranscriberMsg,
};
use crate::asr::pool::{AsrPool, LiveCallMark};
use crate::billing::{BillingMsg, SAMPLES_PER_MS};
use crate::protocol::messages::Duration as Pt;
use crate::protocol::messages::{
    Alternative, Entity, EventParams, IntentUpdateParams, Interpretation, ServerEnvelope,
    ServerMessage, Token, TranscriptData,
};
use crate::protocol::session::{OpenRequest, Session, State, Step};
use crate::transcript::round3;
use crate::usage::Account;

/// Arguments of a [`CallSupervisor`].
pub struct CallArgs {
    /// This call's id (for logs and billing).
    pub call_id: String,
    /// The `Audiohook-Session-Id` of the upgrade request, if sent.
    pub session_header: Option<String>,
    /// Who pays.
    pub account: Account,
    /// Frames to the socket.
    pub outbound: mpsc::Sender<Outbound>,
    /// The speech workers.
    pub pool: Arc<AsrPool>,
    /// The process-wide billing actor.
    pub billing: ActorRef<BillingMsg>,
    /// The intent analysis.
    pub classifier: Arc<dyn IntentClassifier>,
    /// Settings.
    pub settings: CallSettings,
    /// Process-wide counters.
    pub stats: Arc<LiveStats>,
    /// Who watches calls, if anyone.
    pub observer: Option<Arc<dyn CallObserver>>,
    /// Personal data is redacted from transcripts before they are sent, analysed or observed
    /// ([`crate::redact`]).
    pub redact: bool,
}

/// The supervisor's state.
pub struct CallState {
    args: CallArgs,
    session: Session,
    language: String,
    language_tag: Option<String>,
    labels: Vec<String>,
    lines: Vec<(f64, String, String)>,
    deinterleaver: Option<ActorRef<DeinterleaverMsg>>,
    transcribers: Vec<ActorRef<TranscriberMsg>>,
    intent: Option<ActorRef<IntentMsg>>,
    channels_done: usize,
    metered: bool,
    /// Samples per channel leased from the pool, and served, so far.
    leased: u64,
    served: u64,
    /// A lease has been asked for and not answered yet.
    renewing: bool,
    /// The pool had nothing more to give: the call ends once its lease is served.
    dry: bool,
    /// Frames past the lease, waiting for the next one (in order, each with its credit).
    held: std::collections::VecDeque<(Vec<u8>, Credit, u64)>,
    /// The `open` accepted, waiting for the call's first lease.
    opening: Option<(OpenRequest, Option<Vec<String>>)>,
    idle_timer: Option<JoinHandle<()>>,
    last_heard: Instant,
    /// Why we sent `disconnect`, while waiting for the client's `close`.
    disconnecting: Option<DisconnectReason>,
    ending: bool,
    active: Option<ActiveCall>,
}

/// Counts the call in [`LiveStats::active_calls`], and in the speech pool (which keeps a
/// worker for live work while any call is in progress), for as long as it lives, however it
/// ends.
struct ActiveCall {
    stats: Arc<LiveStats>,
    _in_pool: LiveCallMark,
}

impl ActiveCall {
    fn new(stats: Arc<LiveStats>, pool: &AsrPool) -> Self {
        stats.active_calls.fetch_add(1, Ordering::Relaxed);
        Self {
            stats,
            _in_pool: pool.live_call(),
        }
    }
}

impl Drop for ActiveCall {
    fn drop(&mut self) {
        self.stats.active_calls.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The call supervisor actor.
#[derive(Debug, Default)]
pub struct CallSupervisor;

/// How long a call waits before it asks again for a lease billing could not grant.
const LEASE_RETRY: std::time::Duration = std::time::Duration::from_millis(500);

impl CallState {
    async fn send(&self, envelope: &ServerEnvelope) {
        let text = serde_json::to_string(envelope).expect("server messages always serialize");
        // The socket may be gone already; then there is nobody to tell.
        let _ = self.args.outbound.send(Outbound::Text(text)).await;
    }

    async fn reply(&mut self, message: ServerMessage) {
        let envelope = self.session.envelope(message);
        self.send(&envelope).await;
    }

    /// Sends `disconnect` and gives the client a moment to answer with `close`.
    async fn disconnect(&mut self, myself: &ActorRef<CallMsg>, reason: DisconnectReason) {
        let (why, info) = reason.message();
        tracing::info!(call = %self.args.call_id, reason = why, info, "disconnecting");
        let envelope = self.session.disconnect_for(why, info);
        self.send(&envelope).await;
        self.await_close(myself, reason);
    }

    /// A `disconnect` was sent for `reason`: wait a moment for the client's `close`.
    fn await_close(&mut self, myself: &ActorRef<CallMsg>, reason: DisconnectReason) {
        self.disconnecting.get_or_insert(reason);
        myself.send_after(self.args.settings.disconnect_grace, || CallMsg::GraceOver);
    }

    /// How the call ends now that the client answered or the grace ran out.
    fn disconnected(&self) -> CallEnd {
        CallEnd::Disconnected(
            self.disconnecting
                .unwrap_or(DisconnectReason::ProtocolError),
        )
    }

    /// Writes the call's usage, closes the socket and stops the call.
    async fn end(&mut self, myself: &ActorRef<CallMsg>, end: CallEnd) {
        if std::mem::replace(&mut self.ending, true) {
            return;
        }
        if let Some(timer) = self.idle_timer.take() {
            timer.abort();
        }
        if self.metered {
            crate::billing::end_call(&self.args.billing, &self.args.call_id).await;
            if let Some(o) = &self.args.observer {
                o.ended(
                    &self.args.call_id,
                    &CallEnded {
                        reason: end.to_string(),
                        billed_ms: self.served / SAMPLES_PER_MS,
                    },
                );
            }
        }
        tracing::info!(call = %self.args.call_id, end = %end, "call ended");
        let _ = self.args.outbound.send(Outbound::Close(end)).await;
        myself.stop(None);
    }

    async fn open(
        &mut self,
        myself: &ActorRef<CallMsg>,
        request: OpenRequest,
    ) -> Result<(), ActorProcessingErr> {
        if request.media.is_none() {
            self.disconnect(myself, DisconnectReason::UnsupportedMedia)
                .await;
            return Ok(());
        }
        let settings = &self.args.settings;
        if let Some(tag) = &request.params.language {
            match settings.model_language(tag) {
                Some(code) => self.language = code,
                None => tracing::warn!(call = %self.args.call_id, language = %tag,
                    fallback = %settings.default_language, "language not supported by the speech model"),
            }
            self.language_tag = Some(tag.clone());
        }
        let supported = request
            .params
            .supported_languages
            .filter(|asked| *asked)
            .map(|_| settings.supported_tags());
        if request.probe {
            tracing::info!(call = %self.args.call_id, "connection probe");
            let opened = self.session.opened(supported);
            self.send(&opened).await;
            // A probe is answered and done; a client that keeps it open is not kept long.
            myself.send_after(self.args.settings.probe_timeout, || CallMsg::ProbeOver);
            return Ok(());
        }
        // Metering and the first slice of the pool come before anything is served: the call
        // opens when billing answers ([`CallState::leased_answer`]).
        self.args.billing.cast(BillingMsg::Start {
            call: self.args.call_id.clone(),
            account: self.args.account.clone(),
        })?;
        self.metered = true;
        self.opening = Some((request, supported));
        self.ask_lease(myself, 0);
        Ok(())
    }

    /// The call's first lease came: the call opens (children, `opened`).
    async fn finish_open(
        &mut self,
        myself: &ActorRef<CallMsg>,
        request: OpenRequest,
        supported: Option<Vec<String>>,
    ) -> Result<(), ActorProcessingErr> {
        let Some(media) = request.media.clone() else {
            return Ok(());
        };
        // Children first, so no audio can arrive before they exist.
        let settings = &self.args.settings;
        let cell = myself.get_cell();
        let mut transcribers = Vec::new();
        for (channel, name) in media.entry.channels.iter().enumerate() {
            // Genesys names its legs external (the customer) and internal (the agent); other
            // clients' channel names are their own labels.
            self.labels.push(match name.as_str() {
                "external" => settings.external_label.clone(),
                "internal" => settings.internal_label.clone(),
                other => other.to_owned(),
            });
            let args = TranscriberArgs {
                channel,
                language: self.language.clone(),
                vad: settings.vad,
                max_held: settings.max_held_utterances,
                pool: self.args.pool.clone(),
                report: myself.get_derived(),
                stats: self.args.stats.clone(),
            };
            let name = format!("{}:transcriber:{channel}", self.args.call_id);
            let (t, _) = Actor::spawn_linked(Some(name), Transcriber, args, cell.clone()).await?;
            transcribers.push(t);
        }
        let (d, _) = Actor::spawn_linked(
            Some(format!("{}:deinterleaver", self.args.call_id)),
            Deinterleaver,
            DeinterleaverArgs {
                encoding: media.encoding,
                transcribers: transcribers.clone(),
            },
            cell.clone(),
        )
        .await?;
        self.transcribers = transcribers;
        self.deinterleaver = Some(d);
        self.spawn_intent(myself).await?;
        self.args.stats.calls.fetch_add(1, Ordering::Relaxed);
        self.active = Some(ActiveCall::new(self.args.stats.clone(), &self.args.pool));
        tracing::info!(call = %self.args.call_id, session = ?self.session.id(),
            conversation = %request.params.conversation_id, format = %media.entry.format,
            channels = ?media.entry.channels, language = %self.language, "call opened");
        if let Some(o) = &self.args.observer {
            let first_session = request
                .params
                .continued_sessions
                .first()
                .map(|s| s.id.clone())
                .filter(|id| !id.is_empty())
                .or_else(|| self.session.id().map(str::to_owned))
                .unwrap_or_else(|| self.args.call_id.clone());
            o.opened(&CallInfo {
                call_id: self.args.call_id.clone(),
                org_id: self.args.account.org_id.clone(),
                conversation_id: request.params.conversation_id.clone(),
                channels: media.entry.channels.clone(),
                language: self.language_tag.clone(),
                connector: self.args.account.key_id.clone(),
                first_session,
                ani: request.params.participant.ani.clone(),
                dnis: request.params.participant.dnis.clone(),
                labels: self.labels.clone(),
            });
        }
        let opened = self.session.opened(supported);
        self.send(&opened).await;
        Ok(())
    }

    async fn spawn_intent(&mut self, myself: &ActorRef<CallMsg>) -> Result<(), ActorProcessingErr> {
        let args = IntentArgs {
            classifier: self.args.classifier.clone(),
            report: myself.get_derived(),
            min_interval: self.args.settings.analyze_interval,
        };
        let (i, _) = Actor::spawn_linked(None, Intent, args, myself.get_cell()).await?;
        // A new intent actor starts from the transcript so far.
        for (at, who, text) in &self.lines {
            i.cast(IntentMsg::Line(*at, who.clone(), text.clone()))?;
        }
        self.intent = Some(i);
        Ok(())
    }

    /// Asks billing for another slice of the pool, at least enough for `needed` more samples,
    /// unless an ask is on its way. The answer comes as [`CallMsg::Leased`].
    fn ask_lease(&mut self, myself: &ActorRef<CallMsg>, needed: u64) {
        if self.renewing {
            return;
        }
        self.renewing = true;
        let want_ms = (self.args.settings.quota_slice.as_millis() as u64)
            .max(needed.div_ceil(SAMPLES_PER_MS))
            .max(1);
        let me = myself.clone();
        let asked = self.args.billing.cast(BillingMsg::Lease {
            call: self.args.call_id.clone(),
            want_ms,
            reply: crate::billing::LeaseReply::new(move |answer| {
                // The call may have ended meanwhile: then nobody needs the answer.
                let _ = me.cast(CallMsg::Leased(answer));
            }),
        });
        if asked.is_err() {
            self.renewing = false;
            tracing::error!(call = %self.args.call_id, "billing is not running");
            myself.send_after(LEASE_RETRY, || CallMsg::RetryLease);
        }
    }

    /// Billing answered a lease.
    async fn leased_answer(
        &mut self,
        myself: &ActorRef<CallMsg>,
        answer: Result<u64, crate::usage::UsageError>,
    ) -> Result<(), ActorProcessingErr> {
        self.renewing = false;
        match answer {
            Ok(granted) => {
                self.leased += granted * SAMPLES_PER_MS;
                if granted == 0 {
                    self.dry = true;
                }
            }
            Err(e) => {
                tracing::error!(call = %self.args.call_id, error = %e, "no lease from billing");
                if self.opening.take().is_some() {
                    self.end(myself, CallEnd::Failed).await;
                    return Ok(());
                }
                // What waits keeps waiting (its credits hold the socket): ask again shortly.
                myself.send_after(LEASE_RETRY, || CallMsg::RetryLease);
                return Ok(());
            }
        }
        if let Some((request, supported)) = self.opening.take() {
            if self.leased == 0 {
                self.disconnect(myself, DisconnectReason::QuotaExhausted)
                    .await;
                return Ok(());
            }
            return self.finish_open(myself, request, supported).await;
        }
        self.serve_held(myself).await
    }

    /// Serves the frames that waited for a lease, as far as the lease goes.
    async fn serve_held(&mut self, myself: &ActorRef<CallMsg>) -> Result<(), ActorProcessingErr> {
        while let Some(&(_, _, samples)) = self.held.front() {
            if self.served + samples <= self.leased {
                let (bytes, credit, samples) = self.held.pop_front().expect("a front was seen");
                self.serve(bytes, credit, samples)?;
                self.ahead(myself);
            } else if self.dry {
                self.held.clear();
                if self.disconnecting.is_none() {
                    self.disconnect(myself, DisconnectReason::QuotaExhausted)
                        .await;
                }
                break;
            } else {
                self.ask_lease(myself, samples);
                break;
            }
        }
        Ok(())
    }

    /// Hands a frame on to the deinterleaver and bills it.
    fn serve(
        &mut self,
        bytes: Vec<u8>,
        credit: Credit,
        samples: u64,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(d) = &self.deinterleaver {
            self.served += samples;
            self.args.billing.cast(BillingMsg::Audio {
                call: self.args.call_id.clone(),
                samples,
            })?;
            d.cast(DeinterleaverMsg::Frame(bytes, credit))?;
        }
        Ok(())
    }

    /// Asks for the next slice ahead of need: when half of the current one is left.
    fn ahead(&mut self, myself: &ActorRef<CallMsg>) {
        let half = self.args.settings.quota_slice.as_millis() as u64 * SAMPLES_PER_MS / 2;
        if !self.dry && self.leased.saturating_sub(self.served) <= half {
            self.ask_lease(myself, 0);
        }
    }

    fn transcript_event(&self, t: ChannelTranscript) -> (TranscriptData, f64) {
        let base = self.session.timeline_secs(t.start_sample);
        let tr = t.transcript;
        let tokens = tr
            .words
            .iter()
            .map(|w| Token {
                kind: "word".to_owned(),
                value: w.text.clone(),
                confidence: round3(f64::from(w.probability)),
                offset: Pt(base + w.start),
                duration: Pt((w.end - w.start).max(0.0)),
                language: None,
            })
            .collect();
        let data = TranscriptData {
            id: uuid::Uuid::new_v4().to_string(),
            channel_id: t.channel,
            is_final: true,
            offset: Pt(base + tr.start),
            duration: Pt((tr.end - tr.start).max(0.0)),
            alternatives: vec![Alternative {
                confidence: round3(f64::from(tr.confidence)),
                languages: self.language_tag.clone().map(|l| vec![l]),
                interpretations: vec![Interpretation {
                    kind: "display".to_owned(),
                    transcript: tr.text,
                    tokens,
                }],
            }],
        };
        (data, base + tr.start)
    }

    async fn on_step(
        &mut self,
        myself: &ActorRef<CallMsg>,
        step: Step,
        frame: Option<(Vec<u8>, Credit)>,
    ) -> Result<(), ActorProcessingErr> {
        match step {
            Step::None => {}
            Step::Reply(envelope) => self.send(&envelope).await,
            Step::Open(request) => self.open(myself, request).await?,
            Step::Audio(samples) => {
                let samples = samples as u64;
                if let (Some(_), Some((bytes, credit))) = (&self.deinterleaver, frame) {
                    // Behind frames that wait for a lease, in order.
                    self.held.push_back((bytes, credit, samples));
                    self.serve_held(myself).await?;
                }
            }
            Step::Language(tag, updated) => {
                if let Some(tag) = tag {
                    match self.args.settings.model_language(&tag) {
                        Some(code) => {
                            tracing::info!(call = %self.args.call_id, language = %tag, "language changed");
                            if let Some(d) = &self.deinterleaver {
                                d.cast(DeinterleaverMsg::Language(code.clone()))?;
                            }
                            self.language = code;
                            self.language_tag = Some(tag);
                        }
                        None => tracing::warn!(call = %self.args.call_id, language = %tag,
                            "language not supported by the speech model; keeping the current one"),
                    }
                }
                self.send(&updated).await;
            }
            Step::Analyze => match &self.intent {
                Some(_) if self.session.state() != State::Closing => {
                    self.to_intent(IntentMsg::Analyze)
                }
                _ => {
                    tracing::debug!(call = %self.args.call_id, "analyze ignored: no transcript to analyse")
                }
            },
            Step::Close => {
                match &self.deinterleaver {
                    // Through the deinterleaver, so frames still on their way are transcribed.
                    Some(d) => d.cast(DeinterleaverMsg::Finish)?,
                    None => {
                        let closed = self.session.closed();
                        self.send(&closed).await;
                        self.end(myself, CallEnd::Closed).await;
                    }
                }
            }
            Step::Closed(closed) => {
                self.send(&closed).await;
                let end = self.disconnected();
                self.end(myself, end).await;
            }
            Step::Disconnect(envelope) => {
                tracing::info!(call = %self.args.call_id, message = ?envelope.message, "protocol error");
                self.send(&envelope).await;
                self.await_close(myself, DisconnectReason::ProtocolError);
            }
        }
        Ok(())
    }

    /// Tells the intent actor. If it has just died, its restart replays the transcript, and an
    /// analyze it missed was answered with an error: the call goes on either way.
    fn to_intent(&self, message: IntentMsg) {
        if let Some(intent) = &self.intent {
            if intent.cast(message).is_err() {
                tracing::debug!(call = %self.args.call_id, "intent actor gone; it is restarted");
            }
        }
    }

    fn child_of(&self, cell: &ActorCell) -> Option<Child> {
        let id = cell.get_id();
        if self.intent.as_ref().is_some_and(|i| i.get_id() == id) {
            Some(Child::Intent)
        } else if self
            .deinterleaver
            .as_ref()
            .is_some_and(|d| d.get_id() == id)
        {
            Some(Child::Deinterleaver)
        } else {
            self.transcribers
                .iter()
                .position(|t| t.get_id() == id)
                .map(Child::Transcriber)
        }
    }
}

impl Actor for CallSupervisor {
    type Msg = CallMsg;
    type State = CallState;
    type Arguments = CallArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: CallArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        let check = (args.settings.idle_timeout / 4).max(std::time::Duration::from_millis(100));
        Ok(CallState {
            idle_timer: Some(myself.send_interval(check, || CallMsg::IdleTick)),
            last_heard: Instant::now(),
            disconnecting: None,
            session: Session::new(args.session_header.clone()),
            language: args.settings.default_language.clone(),
            language_tag: None,
            labels: Vec::new(),
            lines: Vec::new(),
            deinterleaver: None,
            transcribers: Vec::new(),
            intent: None,
            channels_done: 0,
            metered: false,
            leased: 0,
            served: 0,
            renewing: false,
            dry: false,
            held: std::collections::VecDeque::new(),
            opening: None,
            ending: false,
            active: None,
            args,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if state.ending {
            return Ok(());
        }
        match message {
            CallMsg::Text(text, _credit) => {
                state.last_heard = Instant::now();
                let step = state.session.on_text(&text);
                state.on_step(&myself, step, None).await?;
            }
            CallMsg::Audio(bytes, credit) => {
                state.last_heard = Instant::now();
                let step = state.session.on_audio(bytes.len());
                state.on_step(&myself, step, Some((bytes, credit))).await?;
            }
            CallMsg::SocketClosed => {
                state.end(&myself, CallEnd::ClientGone).await;
            }
            CallMsg::FrameTooLarge => state.end(&myself, CallEnd::FrameTooLarge).await,
            CallMsg::Channel(TranscriberEvent::Transcript(mut t)) => {
                if state.session.state() == State::Ended {
                    return Ok(());
                }
                if state.args.redact {
                    crate::redact::redact_transcript(&mut t.transcript);
                }
                let channel = t.channel;
                let label = state.labels.get(channel).cloned().unwrap_or_default();
                let (data, at) = state.transcript_event(t);
                let text = data.alternatives[0].interpretations[0].transcript.clone();
                state.to_intent(IntentMsg::Line(at, label.clone(), text.clone()));
                if let Some(o) = &state.args.observer {
                    o.transcript(
                        &state.args.call_id,
                        &FinalLine {
                            channel,
                            offset: data.offset.0,
                            duration: data.duration.0,
                            confidence: data.alternatives[0].confidence,
                            text: text.clone(),
                        },
                    );
                }
                state.lines.push((at, label, text));
                state.args.stats.transcripts.fetch_add(1, Ordering::Relaxed);
                state
                    .reply(ServerMessage::Event(EventParams {
                        entities: vec![Entity::Transcript(data)],
                    }))
                    .await;
            }
            CallMsg::Channel(TranscriberEvent::Drained(_)) => {
                state.channels_done += 1;
                if state.channels_done == state.transcribers.len()
                    && state.session.state() == State::Closing
                {
                    let closed = state.session.closed();
                    state.send(&closed).await;
                    state.end(&myself, CallEnd::Closed).await;
                }
            }
            CallMsg::Intent(IntentOutcome(result)) => {
                if matches!(state.session.state(), State::Active | State::Paused) {
                    if let (Ok(intent), Some(o)) = (&result, &state.args.observer) {
                        o.intent(&state.args.call_id, intent);
                    }
                    let params = match result {
                        Ok(intent) => IntentUpdateParams {
                            intent,
                            error: None,
                        },
                        Err(e) => IntentUpdateParams {
                            intent: Value::Null,
                            error: Some(e),
                        },
                    };
                    state.reply(ServerMessage::IntentUpdate(params)).await;
                }
            }
            CallMsg::Disconnect(reason) => match state.session.state() {
                State::Active | State::Paused => state.disconnect(&myself, reason).await,
                // Before `open` there is no session to disconnect.
                State::AwaitingOpen | State::Opening => {
                    state.end(&myself, CallEnd::Disconnected(reason)).await
                }
                _ => {}
            },
            CallMsg::IdleTick => {
                let silent = state.last_heard.elapsed();
                // A closing call is waiting for its own transcripts, not for the client.
                if silent > state.args.settings.idle_timeout
                    && state.session.state() != State::Closing
                {
                    tracing::info!(call = %state.args.call_id, silent_s = silent.as_secs_f64(),
                        "client silent: ending the call");
                    state.end(&myself, CallEnd::IdleTimeout).await;
                }
            }
            CallMsg::ProbeOver => state.end(&myself, CallEnd::ProbeOver).await,
            CallMsg::Leased(answer) => state.leased_answer(&myself, answer).await?,
            CallMsg::RetryLease => {
                if state.opening.is_some() {
                    state.ask_lease(&myself, 0);
                } else {
                    state.serve_held(&myself).await?;
                }
            }
            CallMsg::GraceOver => {
                if state.session.state() == State::Disconnecting {
                    let end = state.disconnected();
                    state.end(&myself, end).await;
                }
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let (cell, why) = match &event {
            SupervisionEvent::ActorFailed(cell, e) => (cell.clone(), e.to_string()),
            SupervisionEvent::ActorTerminated(cell, _, reason) => (
                cell.clone(),
                reason.clone().unwrap_or_else(|| "stopped".into()),
            ),
            _ => return Ok(()),
        };
        if state.ending {
            return Ok(());
        }
        match state.child_of(&cell) {
            Some(Child::Intent) => {
                tracing::error!(call = %state.args.call_id, why = %why, "intent actor ended; starting a new one");
                state.spawn_intent(&myself).await?;
                state
                    .reply(ServerMessage::IntentUpdate(IntentUpdateParams {
                        intent: Value::Null,
                        error: Some("intent analysis failed".to_owned()),
                    }))
                    .await;
            }
            Some(child) => {
                tracing::error!(call = %state.args.call_id, child = %child, why = %why, "call child ended; ending the call");
                state.end(&myself, CallEnd::ChildFailed(child)).await;
            }
            None => {}
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        for t in &state.transcribers {
            t.stop(None);
        }
        if let Some(d) = &state.deinterleaver {
            d.stop(None);
        }
        if let Some(i) = &state.intent {
            i.stop(None);
        }
        Ok(())
    }
}
