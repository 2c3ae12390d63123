//! File transcription, the use case: an audio file in; its transcript, timed segments per
//! channel and the analyses asked for out, metered when someone pays for it.
//!
//! `POST /api/transcribe` and `callstream transcribe` both run [`transcribe`]; the route only
//! reads the form and writes the JSON, the CLI only reads the file and prints.
//!
//! Order of work, cheapest refusal first: the language; what the container declares (format,
//! sample rate, channels, a declared duration past `transcribe.max_duration_s`); for a payer,
//! the file's real length, measured by decoding it to its end without keeping the audio (a
//! header may declare one second of a ten-minute file: a declaration is a hint, never a
//! licence), refused past `transcribe.max_duration_s`, and reserved whole against the payer's
//! audio pool or refused (`quota_too_small`); then the file is decoded again and transcribed
//! as a stream; then the analyses and the usage record, after which the reservation is given
//! back. No speech work is done for a file that is then refused for its length or the quota.
//! Nothing is billed unless all of it succeeds. A caller that goes away (the future is
//! dropped) stops the work: no more audio is decoded and queued utterances are skipped. Memory
//! for one file is bounded whatever its length (see `callstream_actors::asr::file`).

use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use serde_json::Value;

use callstream_actors::asr::file::{transcribe_file, FileSegment, Packing, TranscribeError};
use callstream_actors::asr::pool::AsrPool;
use callstream_actors::asr::{AsrError, Language, Word};
use callstream_actors::audio::decode::{DecodeError, DecodeLimits, FileDecoder};
use callstream_actors::audio::vad::VadConfig;
use callstream_actors::transcript::{dialogue, round3, speaker_label};
use callstream_actors::usage::{Allowance, UsageError, UsageKind, UsageSource};

use crate::auth::{AuthError, Authenticator, Caller};
use crate::llm::profiles::{analyse, ProfileKind, FILE_LAYOUT};
use crate::llm::{LlmError, Provider};

/// One file to transcribe.
#[derive(Debug)]
pub struct FileRequest {
    /// The file's bytes.
    pub bytes: Vec<u8>,
    /// Its file-name extension, lower case, as a hint for the container.
    pub extension: Option<String>,
    /// Language code (`en`); must be one the speech model accepts.
    pub language: String,
    /// Which analyses to run over the transcript.
    pub analyses: Analyses,
    /// Replace card numbers, social security numbers, e-mail addresses and phone numbers in
    /// the transcript with tags, before the analyses see it.
    pub redact: bool,
}

/// Analyses of a transcript.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Analyses {
    /// Customer intent.
    pub intent: bool,
    /// A BANT record.
    pub bant: bool,
    /// A NEAT-P record.
    pub neat_p: bool,
}

/// What transcribing a file needs.
#[derive(Clone)]
pub struct FileEngines {
    /// The speech workers.
    pub pool: Arc<AsrPool>,
    /// Languages of the speech model.
    pub languages: Arc<Vec<Language>>,
    /// Utterance segmentation.
    pub vad: VadConfig,
    /// How utterances are packed into encoder windows.
    pub packing: Packing,
    /// Speaker role of each channel of a multi-channel file, in channel order.
    pub channel_roles: Vec<String>,
    /// Longest recording accepted, seconds.
    pub max_duration_s: f64,
    /// The language model, needed only when analyses are asked for.
    pub llm: Option<Arc<dyn Provider>>,
}

/// The speaker label of the selling side among a file's channel roles: the role named `agent`
/// (any case), whose words are not evidence of the buyer's qualification. None when no
/// channel is the agent's.
pub fn seller_label(channel_roles: &[String]) -> Option<String> {
    channel_roles
        .iter()
        .find(|role| role.trim().eq_ignore_ascii_case("agent"))
        .map(|role| speaker_label(role))
}

/// Who pays for a file: its length is reserved against their quota before the work and
/// billed after (the reservation records the usage).
pub struct Payer {
    /// Quotas and reservations.
    pub auth: Arc<Authenticator>,
    /// The caller.
    pub caller: Caller,
    /// Opaque end-user id recorded with the usage.
    pub end_user: Option<String>,
}

/// Progress of the speech work: (utterances done, utterances in all).
pub type Progress = Box<dyn FnMut(usize, usize) + Send>;

/// One timed segment of the transcript.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Segment {
    /// Position in the transcript.
    pub id: usize,
    /// Seconds from the start of the file.
    pub start: f64,
    /// Seconds from the start of the file.
    pub end: f64,
    /// The text.
    pub text: String,
    /// Channel index.
    pub channel: usize,
    /// The channel's speaker role (`speaker` for a one-channel file).
    pub speaker: String,
    /// 0 to 1.
    pub confidence: f64,
    /// Words with times from the start of the file.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub words: Vec<Word>,
}

/// A transcribed file (the body of `POST /api/transcribe`).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct FileTranscript {
    /// Where the call history keeps it (`GET /api/transcriptions/{id}`); absent when it was
    /// not stored.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The whole transcript, segment texts joined with spaces.
    pub text: String,
    /// Language code used.
    pub language: String,
    /// Seconds of audio (per channel).
    pub duration: f64,
    /// Channels in the file.
    pub channels: usize,
    /// Segments in time order.
    pub segments: Vec<Segment>,
    /// The customer's intent, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub intent: Option<Value>,
    /// The BANT record, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bant: Option<Value>,
    /// The NEAT-P record, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub neat_p: Option<Value>,
}

/// Why a file could not be transcribed.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The language is not one the speech model accepts.
    #[error("language {given:?} is not supported; GET /api/languages lists {known} (or a tag of one of them, such as en-US)")]
    Language {
        /// What was asked for.
        given: String,
        /// The codes accepted, comma separated.
        known: String,
    },
    /// The container or codec is not one we decode.
    #[error("unsupported audio format: {0}")]
    Unsupported(String),
    /// The audio is damaged, holds nothing, or declares what we do not take (rate, channels).
    #[error("{0}")]
    InvalidAudio(String),
    /// The recording is longer than `transcribe.max_duration_s`.
    #[error("the recording is longer than the {limit_secs} s accepted{}", declared(*.declared_secs))]
    TooLong {
        /// The limit.
        limit_secs: f64,
        /// What the container declares, if anything.
        declared_secs: Option<f64>,
    },
    /// The payer's quota does not cover the file.
    #[error("{}; {:.2} audio-minutes remain this month", file_minutes(*.length_ms), *.left_ms as f64 / 60_000.0)]
    QuotaTooSmall {
        /// The file's length, when it is known.
        length_ms: Option<u64>,
        /// What is left of the quota.
        left_ms: u64,
    },
    /// The quota could not be read.
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// The speech engine failed.
    #[error("speech engine: {0}")]
    Speech(#[from] AsrError),
    /// An analysis failed.
    #[error(transparent)]
    Llm(#[from] LlmError),
    /// Analyses were asked for but no language model is loaded.
    #[error("no language model is loaded for the analyses")]
    NoModel,
    /// The usage could not be recorded; the answer is withheld.
    #[error("usage could not be recorded: {0}")]
    Billing(#[from] UsageError),
    /// A worker task failed (a bug).
    #[error("internal error: {0}")]
    Internal(String),
}

/// Sets the cancel flag when dropped: when the future transcribing a file is dropped (its
/// client went away), the speech work stops.
#[derive(Default)]
struct CancelOnDrop(callstream_actors::asr::file::Cancel);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The error of a file the decoder refused. A file that ran past `reserved_ms` (when that is
/// below the longest file accepted, `max_ms`) ran past what was reserved of the payer's quota.
fn decode_error(e: DecodeError, max_ms: u64, reserved_ms: Option<u64>) -> FileError {
    match e {
        DecodeError::TooLong { declared_secs, .. } => match reserved_ms.filter(|r| *r < max_ms) {
            Some(left_ms) => FileError::QuotaTooSmall {
                length_ms: declared_secs.map(|d| (d * 1000.0).round() as u64),
                left_ms,
            },
            None => FileError::TooLong {
                limit_secs: max_ms as f64 / 1000.0,
                declared_secs,
            },
        },
        DecodeError::Unsupported(m) => FileError::Unsupported(m),
        e => FileError::InvalidAudio(e.to_string()),
    }
}

/// Reserves `length_ms` of the payer's audio pool, all of it or nothing.
async fn reserve(payer: &Payer, length_ms: u64) -> Result<crate::usage::Reservation, FileError> {
    let now = crate::clock::now_ms();
    let reserved = payer
        .auth
        .reserve(&payer.caller, UsageKind::AudioMs, length_ms, length_ms, now)
        .await;
    match reserved {
        Ok(r) => Ok(r),
        Err(AuthError::QuotaExhausted(_)) => {
            let left_ms = match payer
                .auth
                .allowance(&payer.caller, UsageKind::AudioMs, now)
                .await?
            {
                Allowance::Remaining(left) => left,
                Allowance::Unlimited => 0,
            };
            Err(FileError::QuotaTooSmall {
                length_ms: Some(length_ms),
                left_ms,
            })
        }
        Err(e) => Err(e.into()),
    }
}

fn declared(secs: Option<f64>) -> String {
    secs.map(|d| format!(" (the file declares {d:.0} s)"))
        .unwrap_or_default()
}

fn file_minutes(ms: Option<u64>) -> String {
    match ms {
        Some(ms) => format!("the file is {:.2} audio-minutes", ms as f64 / 60_000.0),
        None => "the file is longer than the quota left".to_owned(),
    }
}

/// Transcribes `request` with `engines`, checking the quota of and billing `payer` when there
/// is one, reporting speech progress to `progress`.
pub async fn transcribe(
    engines: &FileEngines,
    request: FileRequest,
    payer: Option<&Payer>,
    progress: Option<Progress>,
) -> Result<FileTranscript, FileError> {
    let FileRequest {
        bytes,
        extension,
        language,
        analyses,
        redact,
    } = request;
    // A model code (`es`) or a BCP-47 tag (`es-MX`); the response shows it as sent.
    let Some(model_language) =
        callstream_actors::asr::languages::resolve(&engines.languages, &language)
            .map(|l| l.code.clone())
    else {
        let known: Vec<&str> = engines.languages.iter().map(|l| l.code.as_str()).collect();
        return Err(FileError::Language {
            given: language,
            known: known.join(", "),
        });
    };
    let needs_model = analyses != Analyses::default();
    if needs_model && engines.llm.is_none() {
        return Err(FileError::NoModel);
    }
    let limits = DecodeLimits {
        max_secs: engines.max_duration_s,
        ..DecodeLimits::default()
    };
    let max_ms = (engines.max_duration_s * 1000.0) as u64;
    // Dropped with this future when the caller goes away: the speech work stops.
    let cancel = CancelOnDrop::default();
    let started = Instant::now();
    let opened =
        tokio::task::spawn_blocking(move || FileDecoder::open(bytes, extension.as_deref(), limits))
            .await
            .map_err(|e| FileError::Internal(e.to_string()))?;
    let mut decoder = opened.map_err(|e| decode_error(e, max_ms, None))?;
    // What the container declares is a hint, never a licence: a paid file is measured (decoded
    // to its end without keeping the audio, a small fraction of the cost of transcribing it),
    // and exactly that length is reserved before any speech work. A file past the longest
    // accepted, or past the quota left, is refused before it costs anything.
    let reservation = match payer {
        Some(payer) => {
            let again = decoder.reopen();
            let stop = cancel.0.clone();
            let measured = tokio::task::spawn_blocking(move || again?.measure(&stop))
                .await
                .map_err(|e| FileError::Internal(e.to_string()))?
                .map_err(|e| decode_error(e, max_ms, None))?;
            let Some(secs) = measured else {
                return Err(FileError::Internal("cancelled".into()));
            };
            let length_ms = (secs * 1000.0).round() as u64;
            if length_ms == 0 {
                return Err(FileError::InvalidAudio("the file holds no audio".into()));
            }
            // The second pass decodes the same bytes the same way; this only makes sure.
            decoder.limit_secs(secs);
            Some((reserve(payer, length_ms).await?, length_ms))
        }
        None => None,
    };
    let (pool, vad, packing, lang) = (
        engines.pool.clone(),
        engines.vad,
        engines.packing,
        model_language,
    );
    let mut progress = progress.unwrap_or_else(|| Box::new(|_, _| {}));
    let flag = cancel.0.clone();
    let done = tokio::task::spawn_blocking(move || {
        transcribe_file(&pool, decoder, &lang, vad, packing, &mut *progress, &flag)
    })
    .await
    .map_err(|e| FileError::Internal(e.to_string()))?;
    let transcription = match done {
        Ok(t) => t,
        Err(TranscribeError::Decode(e)) => {
            return Err(decode_error(e, max_ms, reservation.as_ref().map(|r| r.1)))
        }
        Err(TranscribeError::Asr(e)) => return Err(FileError::Speech(e)),
        Err(TranscribeError::Cancelled) => return Err(FileError::Internal("cancelled".into())),
    };
    let transcribed = started.elapsed();
    let duration_ms = (transcription.duration_secs * 1000.0).round() as u64;
    if duration_ms == 0 {
        return Err(FileError::InvalidAudio("the file holds no audio".into()));
    }
    let channels = transcription.channels;
    let found = transcription.segments;

    let speaker = |c: usize| {
        if channels > 1 {
            engines
                .channel_roles
                .get(c)
                .cloned()
                .unwrap_or_else(|| format!("channel {c}"))
        } else {
            "speaker".to_owned()
        }
    };
    let mut segments: Vec<Segment> = found
        .into_iter()
        .enumerate()
        .map(|(id, s): (usize, FileSegment)| Segment {
            id,
            start: round3(s.start),
            end: round3(s.end),
            speaker: speaker(s.channel),
            channel: s.channel,
            confidence: round3(f64::from(s.confidence)),
            words: s.words,
            text: s.text,
        })
        .collect();
    if redact {
        for s in &mut segments {
            let (text, found) = callstream_actors::redact::redact_text(&s.text);
            if !found.is_empty() {
                s.text = text;
                s.words = callstream_actors::redact::redact_words(&s.words);
            }
        }
    }

    let started_analysis = Instant::now();
    let (intent, bant, neat_p) = match engines.llm.as_ref().filter(|_| needs_model) {
        None => (None, None, None),
        Some(llm) => {
            // The payer's prompts are reused only for the payer.
            let llm = match payer {
                Some(payer) => crate::llm::for_tenant(
                    llm.clone(),
                    &payer.caller.org.id,
                    crate::llm::fair::Class::Batch,
                ),
                None => llm.clone(),
            };
            let labels: Vec<String> = segments.iter().map(|s| speaker_label(&s.speaker)).collect();
            let spoken = dialogue(
                segments
                    .iter()
                    .zip(&labels)
                    .map(|(s, label)| (label.as_str(), s.text.as_str())),
            );
            // One prompt for the three analyses but its last words: the transcript is evaluated
            // once, and the model keeps it for the next analysis.
            let seller = (channels > 1)
                .then(|| seller_label(&engines.channel_roles))
                .flatten();
            analyse_transcript(llm.as_ref(), analyses, &spoken, seller.as_deref()).await?
        }
    };
    tracing::info!(
        audio_s = duration_ms as f64 / 1000.0,
        channels,
        transcription_s = transcribed.as_secs_f64(),
        analysis_s = started_analysis.elapsed().as_secs_f64(),
        "file transcribed"
    );

    if let (Some(payer), Some((reservation, _))) = (payer, reservation) {
        reservation
            .settle(
                &payer.caller.account(),
                duration_ms,
                UsageSource::Transcribe,
                payer.end_user.clone(),
            )
            .await?;
    }

    let text = segments
        .iter()
        .map(|s| s.text.as_str())
        .collect::<Vec<_>>()
        .join(" ");
    Ok(FileTranscript {
        id: None,
        text,
        language,
        duration: duration_ms as f64 / 1000.0,
        channels,
        segments,
        intent,
        bant,
        neat_p,
    })
}

/// The records `analyses` asks for, of a file's `spoken` transcript: intent, BANT, NEAT-P.
///
/// The first analysis reads the transcript; the sales records then start from it together,
/// their answers written side by side (one model step carries a token of each) where one after
/// the other would take the sum of their times. Without intent, BANT reads the transcript
/// alone first: two reading it at once would read it twice.
pub async fn analyse_transcript(
    llm: &dyn Provider,
    analyses: Analyses,
    spoken: &str,
    seller: Option<&str>,
) -> Result<(Option<Value>, Option<Value>, Option<Value>), LlmError> {
    let run = |wanted: bool, kind| async move {
        match wanted {
            true => analyse(llm, kind, FILE_LAYOUT, spoken, seller)
                .await
                .map(|(record, _)| Some(record)),
            false => Ok(None),
        }
    };
    if analyses.intent {
        let intent = run(true, ProfileKind::Intent).await?;
        let (bant, neat_p) = tokio::try_join!(
            run(analyses.bant, ProfileKind::Bant),
            run(analyses.neat_p, ProfileKind::NeatP)
        )?;
        Ok((intent, bant, neat_p))
    } else {
        let bant = run(analyses.bant, ProfileKind::Bant).await?;
        let neat_p = run(analyses.neat_p, ProfileKind::NeatP).await?;
        Ok((None, bant, neat_p))
    }
}

#[cfg(test)]
mod tests {
    use super::{analyse_transcript, seller_label, Analyses};
    use crate::llm::{Completion, Deltas, FinishReason, Generation, LlmError, Provider, Usage};

    /// A model that answers every analysis with nothing found, notes when each starts and
    /// ends, and (with `meet`) holds the sales records until both have started.
    struct Analyst {
        meet: bool,
        events: parking_lot::Mutex<Vec<String>>,
        started: tokio::sync::Barrier,
    }

    impl Analyst {
        fn new(meet: bool) -> Self {
            Self {
                meet,
                events: Vec::new().into(),
                started: tokio::sync::Barrier::new(2),
            }
        }
    }

    #[async_trait::async_trait]
    impl Provider for Analyst {
        async fn generate(&self, g: Generation, _: Deltas) -> Result<Completion, LlmError> {
            let schema = g.json_schema.map(|s| s.to_string()).unwrap_or_default();
            let none = r#"{"status":"not_found","summary":"","confidence":0.9,"evidence":[]}"#;
            let (kind, fields) = if schema.contains("economic_impact") {
                let fields = ["need", "economic_impact", "access_to_authority"];
                ("neat_p", [&fields[..], &["timeline", "priority"]].concat())
            } else if schema.contains("budget") {
                ("bant", vec!["budget", "authority", "need", "timeline"])
            } else if schema.contains("intents") {
                ("intent", Vec::new())
            } else {
                return Err(LlmError::Engine(format!("not an analysis: {schema}")));
            };
            self.events.lock().push(format!("{kind} starts"));
            if self.meet && kind != "intent" {
                let met =
                    tokio::time::timeout(std::time::Duration::from_secs(10), self.started.wait())
                        .await;
                if met.is_err() {
                    self.events.lock().push(format!("{kind} waited alone"));
                }
            }
            let text = match kind {
                "intent" => {
                    r#"{"intents":[{"intent":"billing_inquiry","confidence":"high"}],"reasoning":"a fee"}"#
                        .to_owned()
                }
                _ => {
                    let fields: Vec<String> =
                        fields.iter().map(|f| format!(r#""{f}":{none}"#)).collect();
                    format!("{{{}}}", fields.join(","))
                }
            };
            self.events.lock().push(format!("{kind} ends"));
            Ok(Completion {
                text,
                tool_calls: Vec::new(),
                usage: Usage::default(),
                finish: FinishReason::Stop,
                odds: Vec::new(),
            })
        }

        fn name(&self) -> &str {
            "analyst"
        }
    }

    const CALL: &str = "Agent: How can I help?\nCustomer: What is this fee on my bill?\n";

    #[tokio::test]
    async fn the_sales_records_are_written_side_by_side_after_intent() {
        let model = Analyst::new(true);
        let all = Analyses {
            intent: true,
            bant: true,
            neat_p: true,
        };
        let (intent, bant, neat_p) = analyse_transcript(&model, all, CALL, Some("Agent"))
            .await
            .unwrap();
        assert_eq!(intent.unwrap()["intents"][0]["intent"], "billing_inquiry");
        assert_eq!(bant.unwrap()["budget"]["status"], "not_found");
        assert_eq!(neat_p.unwrap()["priority"]["status"], "not_found");
        let events = model.events.into_inner();
        // Intent reads the transcript alone; then both records run at once, neither waiting
        // for the other to end.
        assert_eq!(events[..2], ["intent starts", "intent ends"]);
        assert!(
            !events.iter().any(|e| e.ends_with("waited alone")),
            "{events:?}"
        );
        let mut sales = events[2..4].to_vec();
        sales.sort();
        assert_eq!(sales, ["bant starts", "neat_p starts"], "{events:?}");
    }

    #[tokio::test]
    async fn without_intent_the_first_record_reads_the_transcript_alone() {
        let model = Analyst::new(false);
        let sales = Analyses {
            intent: false,
            bant: true,
            neat_p: true,
        };
        let (intent, bant, neat_p) = analyse_transcript(&model, sales, CALL, Some("Agent"))
            .await
            .unwrap();
        assert!(intent.is_none() && bant.is_some() && neat_p.is_some());
        assert_eq!(
            model.events.into_inner(),
            ["bant starts", "bant ends", "neat_p starts", "neat_p ends"]
        );
        // Only what was asked for.
        let model = Analyst::new(false);
        let one = Analyses {
            neat_p: true,
            ..Analyses::default()
        };
        let got = analyse_transcript(&model, one, CALL, None).await.unwrap();
        assert!(got.0.is_none() && got.1.is_none() && got.2.is_some());
        assert_eq!(model.events.into_inner(), ["neat_p starts", "neat_p ends"]);
    }

    #[test]
    fn the_seller_is_the_agent_channel_if_there_is_one() {
        let roles = |r: &[&str]| r.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            seller_label(&roles(&["customer", "agent"])).as_deref(),
            Some("Agent")
        );
        assert_eq!(
            seller_label(&roles(&["AGENT", "caller"])).as_deref(),
            Some("AGENT")
        );
        assert_eq!(seller_label(&roles(&["caller", "rep"])), None);
        assert_eq!(seller_label(&[]), None);
    }
}
