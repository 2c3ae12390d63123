//! The transcriber of one channel: cuts the channel's audio into utterances with the VAD,
//! resamples each to 16 kHz, hands it to the ASR pool as live work and passes the results on
//! to the supervisor in the order the utterances were spoken.
//!
//! When the pool's live queue is full the utterance is held here and offered again as soon as
//! one of this channel's utterances comes back (or after [`RETRY`]). At most
//! [`CallSettings::max_held_utterances`](super::CallSettings) are held; past that the oldest
//! held one is dropped, logged and counted in [`LiveStats`].

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, DerivedActorRef};

use super::settings::{Credit, LiveStats};
use crate::asr::pool::{AsrPool, Job};
use crate::asr::{AsrError, Transcript};
use crate::audio::resample::Upsampler;
use crate::audio::vad::{Segmenter, Utterance, VadConfig};

/// How soon held utterances are offered again when nothing else wakes the transcriber.
pub const RETRY: Duration = Duration::from_millis(100);

/// Messages of a [`Transcriber`].
#[derive(Debug)]
pub enum TranscriberMsg {
    /// The next block of this channel's 8 kHz samples.
    Samples(Vec<i16>, Credit),
    /// Later utterances are in this model language.
    Language(String),
    /// The pool's answer for utterance `seq` (sent from a worker thread).
    Done {
        /// The utterance's number.
        seq: u64,
        /// The engine's reading.
        result: Result<Transcript, AsrError>,
    },
    /// Offer held utterances to the pool again.
    Retry,
    /// The call is closing: cut the last utterance, and report [`TranscriberEvent::Drained`]
    /// once every utterance is answered.
    Finish,
}

/// What a transcriber reports to its call.
#[derive(Debug)]
pub enum TranscriberEvent {
    /// A recognised utterance, in the order the channel's utterances were spoken.
    Transcript(ChannelTranscript),
    /// After [`TranscriberMsg::Finish`]: every utterance of this channel is answered.
    Drained(usize),
}

/// A recognised utterance of one channel.
#[derive(Debug, Clone)]
pub struct ChannelTranscript {
    /// Channel index in the negotiated order.
    pub channel: usize,
    /// First sample of the utterance in the channel's stream.
    pub start_sample: u64,
    /// Its length in samples (8 kHz).
    pub samples: usize,
    /// What the engine read.
    pub transcript: Transcript,
}

/// Arguments of a [`Transcriber`].
pub struct TranscriberArgs {
    /// Channel index.
    pub channel: usize,
    /// Model language to start with.
    pub language: String,
    /// Segmentation.
    pub vad: VadConfig,
    /// Most utterances held while the pool is full.
    pub max_held: usize,
    /// The speech workers.
    pub pool: Arc<AsrPool>,
    /// Where transcripts go.
    pub report: DerivedActorRef<TranscriberEvent>,
    /// Process-wide counters.
    pub stats: Arc<LiveStats>,
}

/// The transcriber's state.
pub struct TranscriberState {
    args: TranscriberArgs,
    segmenter: Segmenter,
    upsampler: Upsampler,
    next_seq: u64,
    next_emit: u64,
    /// Utterance spans by number, until emitted.
    spans: BTreeMap<u64, (u64, usize)>,
    /// Results waiting for earlier utterances (`None`: nothing to emit).
    ready: BTreeMap<u64, Option<Transcript>>,
    held: VecDeque<(u64, Job)>,
    retry_pending: bool,
    finishing: bool,
    done_reported: bool,
}

/// The transcriber actor.
#[derive(Debug, Default)]
pub struct Transcriber;

impl TranscriberState {
    fn utterance(
        &mut self,
        myself: &ActorRef<TranscriberMsg>,
        u: Utterance,
    ) -> Result<(), ActorProcessingErr> {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.spans.insert(seq, (u.start, u.samples.len()));
        let mut audio = Vec::with_capacity(Upsampler::output_len(u.samples.len()));
        self.upsampler.utterance_into(&u.samples, &mut audio)?;
        let me = myself.clone();
        let job = Job {
            audio,
            language: self.args.language.clone(),
            reply: Box::new(move |result| {
                // The call may be gone by now; then nobody needs the answer.
                let _ = me.cast(TranscriberMsg::Done { seq, result });
            }),
            cancel: None,
        };
        self.held.push_back((seq, job));
        self.offer(myself)?;
        while self.held.len() > self.args.max_held {
            let (dropped, job) = self.held.pop_front().expect("held is not empty");
            self.args
                .stats
                .utterances_dropped
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                channel = self.args.channel,
                utterance = dropped,
                audio_s = job.audio.len() as f64 / 16_000.0,
                "speech workers are behind: utterance dropped from the live transcript"
            );
            self.ready.insert(dropped, None);
        }
        self.emit_ready()
    }

    /// Offers held utterances to the pool, oldest first, until it refuses one.
    fn offer(&mut self, myself: &ActorRef<TranscriberMsg>) -> Result<(), ActorProcessingErr> {
        while let Some((seq, job)) = self.held.pop_front() {
            match self.args.pool.submit_live(job) {
                Ok(()) => {}
                Err(refused) if refused.stopped => {
                    return Err(AsrError::from(refused).into());
                }
                Err(refused) => {
                    self.args
                        .stats
                        .utterances_held
                        .fetch_add(1, Ordering::Relaxed);
                    self.held.push_front((seq, refused.job));
                    if !self.retry_pending {
                        self.retry_pending = true;
                        myself.send_after(RETRY, || TranscriberMsg::Retry);
                    }
                    break;
                }
            }
        }
        Ok(())
    }

    /// Sends finished utterances on, in order.
    fn emit_ready(&mut self) -> Result<(), ActorProcessingErr> {
        while let Some(result) = self.ready.remove(&self.next_emit) {
            let seq = self.next_emit;
            self.next_emit += 1;
            let (start_sample, samples) = self.spans.remove(&seq).unwrap_or((0, 0));
            if let Some(transcript) = result.filter(|t| !t.text.is_empty()) {
                self.args
                    .report
                    .send_message(TranscriberEvent::Transcript(ChannelTranscript {
                        channel: self.args.channel,
                        start_sample,
                        samples,
                        transcript,
                    }))?;
            }
        }
        if self.finishing && !self.done_reported && self.next_emit == self.next_seq {
            self.done_reported = true;
            self.args
                .report
                .send_message(TranscriberEvent::Drained(self.args.channel))?;
        }
        Ok(())
    }
}

impl Actor for Transcriber {
    type Msg = TranscriberMsg;
    type State = TranscriberState;
    type Arguments = TranscriberArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: TranscriberArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(TranscriberState {
            segmenter: Segmenter::new(args.vad),
            upsampler: Upsampler::new()?,
            args,
            next_seq: 0,
            next_emit: 0,
            spans: BTreeMap::new(),
            ready: BTreeMap::new(),
            held: VecDeque::new(),
            retry_pending: false,
            finishing: false,
            done_reported: false,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            TranscriberMsg::Samples(samples, credit) => {
                let mut cut = Vec::new();
                state.segmenter.push(&samples, &mut |u| cut.push(u));
                // The samples are taken: the socket may read on.
                drop(credit);
                for u in cut {
                    state.utterance(&myself, u)?;
                }
            }
            TranscriberMsg::Language(language) => state.args.language = language,
            TranscriberMsg::Done { seq, result } => {
                let transcript = match result {
                    Ok(t) => Some(t),
                    Err(e) => {
                        tracing::error!(channel = state.args.channel, utterance = seq, error = %e,
                            "utterance not transcribed");
                        None
                    }
                };
                state.ready.insert(seq, transcript);
                state.offer(&myself)?;
                state.emit_ready()?;
            }
            TranscriberMsg::Retry => {
                state.retry_pending = false;
                state.offer(&myself)?;
            }
            TranscriberMsg::Finish => {
                let mut cut = Vec::new();
                state.segmenter.finish(&mut |u| cut.push(u));
                state.finishing = true;
                for u in cut {
                    state.utterance(&myself, u)?;
                }
                state.emit_ready()?;
            }
        }
        Ok(())
    }
}
