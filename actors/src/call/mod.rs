//! The actor tree of one live call.
//!
//! ```text
//! socket task --Text/Audio--> CallSupervisor --Frame--> Deinterleaver --Samples--> Transcriber x channels
//!                                  ^    |                                              |
//!                                  |    '--Analyze--> Intent (one run at a time)       | utterances
//!                                  |                                                   v
//!                                  '------------- Transcript / IntentResult ------ ASR pool (threads)
//! ```
//!
//! The supervisor owns the protocol [`Session`](crate::protocol::session::Session), numbers
//! every message it sends, maps utterances onto the call timeline and reports audio to the
//! process-wide [`Billing`](crate::billing::Billing) actor, which also answers its 30 s quota
//! checks. Queues are bounded: the socket task holds a [`Credit`] for every frame it hands in
//! until the transcribers have taken the samples, the outbound queue to the socket is bounded,
//! the ASR pool's live queue is bounded and each transcriber holds at most
//! [`CallSettings::max_held_utterances`] utterances the pool refused.

pub mod deinterleaver;
pub mod intent;
pub mod supervisor;
pub mod transcriber;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::audio::vad::VadConfig;

pub use supervisor::{CallArgs, CallMsg, CallSupervisor};

/// A permit for one inbound frame in flight; dropping it lets the socket read the next one.
pub type Credit = Arc<tokio::sync::OwnedSemaphorePermit>;

/// What the call sends to its socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outbound {
    /// A JSON text frame.
    Text(String),
    /// Close the socket with this code and reason; nothing follows.
    Close(u16, String),
}

/// The future of an intent classification.
pub type IntentFuture = Pin<Box<dyn Future<Output = Result<serde_json::Value, String>> + Send>>;

/// Classifies the intent of a transcript (lines of `Speaker: text`) into an intent result
/// (`intents` with `intent` and `confidence`, and `reasoning`).
pub trait IntentClassifier: Send + Sync + 'static {
    /// Starts a classification.
    fn classify(&self, transcript: String) -> IntentFuture;
}

/// A call that opened, as observers see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallInfo {
    /// The call's id.
    pub call_id: String,
    /// The organisation billed.
    pub org_id: String,
    /// The platform's conversation id.
    pub conversation_id: String,
    /// Negotiated channel names, in order.
    pub channels: Vec<String>,
    /// The call's language tag, as the client sent it.
    pub language: Option<String>,
}

/// Watches calls (the dashboard's live page). Called from the call's actor: be quick.
pub trait CallObserver: Send + Sync + 'static {
    /// A call opened (probes and refused calls are not reported).
    fn opened(&self, call: &CallInfo);
    /// A final transcript: channel, start on the call timeline, text.
    fn transcript(&self, call_id: &str, channel: usize, offset_secs: f64, text: &str);
    /// The call ended.
    fn ended(&self, call_id: &str);
}

/// Settings of live calls.
#[derive(Debug, Clone)]
pub struct CallSettings {
    /// Utterance segmentation.
    pub vad: VadConfig,
    /// Language codes the speech model accepts (`en`, ...).
    pub languages: Vec<String>,
    /// Language used when the call names none the model accepts.
    pub default_language: String,
    /// How often the quota is checked during a call.
    pub quota_check: Duration,
    /// How long to wait for the client's `close` after a `disconnect`.
    pub disconnect_grace: Duration,
    /// A client that sends nothing (no message, no audio) for this long is gone: the call ends.
    /// AudioHook clients ping every 5 s, also while paused.
    pub idle_timeout: Duration,
    /// Utterances a transcriber holds while the ASR pool's live queue is full; beyond this the
    /// oldest held utterance is dropped (and counted).
    pub max_held_utterances: usize,
    /// Speaker label of the `external` leg in the transcript given to the intent analysis.
    pub external_label: String,
    /// Speaker label of the `internal` leg.
    pub internal_label: String,
}

impl Default for CallSettings {
    fn default() -> Self {
        Self {
            vad: VadConfig::default(),
            languages: vec!["en".to_owned()],
            default_language: "en".to_owned(),
            quota_check: Duration::from_secs(30),
            disconnect_grace: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(30),
            max_held_utterances: 8,
            external_label: "Customer".to_owned(),
            internal_label: "Agent".to_owned(),
        }
    }
}

impl CallSettings {
    /// The model language for an AudioHook language tag (`en-US` -> `en`), if the model
    /// accepts it.
    pub fn model_language(&self, tag: &str) -> Option<String> {
        let primary = tag.split(['-', '_']).next()?.to_ascii_lowercase();
        self.languages.iter().find(|l| **l == primary).cloned()
    }
}

/// Counters of live calls across the process, for logs and metrics.
#[derive(Debug, Default)]
pub struct LiveStats {
    /// Calls in progress.
    pub active_calls: std::sync::atomic::AtomicUsize,
    /// Calls started.
    pub calls: std::sync::atomic::AtomicU64,
    /// Utterances held back because the ASR pool's live queue was full.
    pub utterances_held: std::sync::atomic::AtomicU64,
    /// Utterances dropped because a transcriber's hold was full too.
    pub utterances_dropped: std::sync::atomic::AtomicU64,
    /// Final transcripts sent.
    pub transcripts: std::sync::atomic::AtomicU64,
}

#[cfg(test)]
mod tests {
    use super::CallSettings;

    #[test]
    fn language_tags_map_to_model_languages() {
        let s = CallSettings {
            languages: vec!["en".into(), "de".into()],
            ..CallSettings::default()
        };
        assert_eq!(s.model_language("en-US").as_deref(), Some("en"));
        assert_eq!(s.model_language("DE_at").as_deref(), Some("de"));
        assert_eq!(s.model_language("es-ES"), None);
        assert_eq!(s.model_language(""), None);
    }
}
