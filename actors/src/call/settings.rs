//! What every call of the process starts with and shares: settings, counters, the inbound
//! frame credit.

use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::time::Duration;

use crate::asr::languages::{self, Language};
use crate::audio::vad::VadConfig;

/// A permit for one inbound frame in flight; dropping it lets the socket read the next one.
pub type Credit = std::sync::Arc<tokio::sync::OwnedSemaphorePermit>;

/// Settings of live calls.
#[derive(Debug, Clone)]
pub struct CallSettings {
    /// Utterance segmentation.
    pub vad: VadConfig,
    /// Languages the speech model accepts.
    pub languages: Vec<Language>,
    /// Language used when the call names none the model accepts.
    pub default_language: String,
    /// Audio leased from the organisation's pool at a time: the quota is checked each time
    /// this much of the call's audio has been served (see [`crate::billing`]).
    pub quota_slice: Duration,
    /// How long to wait for the client's `close` after a `disconnect`.
    pub disconnect_grace: Duration,
    /// A client that sends nothing (no message, no audio) for this long is gone: the call ends.
    /// AudioHook clients ping every 5 s, also while paused.
    pub idle_timeout: Duration,
    /// A connection probe is closed this long after its `opened` if the client has not closed it.
    pub probe_timeout: Duration,
    /// Utterances a transcriber holds while the ASR pool's live queue is full; beyond this the
    /// oldest held utterance is dropped (and counted).
    pub max_held_utterances: usize,
    /// Speaker label of the `external` leg in the transcript given to the intent analysis.
    pub external_label: String,
    /// Speaker label of the `internal` leg.
    pub internal_label: String,
    /// The least time between the starts of two intent analyses of one call; requests in
    /// between are coalesced into the next.
    pub analyze_interval: Duration,
}

impl Default for CallSettings {
    fn default() -> Self {
        Self {
            vad: VadConfig::default(),
            languages: vec![languages::language("en")],
            default_language: "en".to_owned(),
            quota_slice: Duration::from_secs(30),
            disconnect_grace: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(30),
            probe_timeout: Duration::from_secs(10),
            max_held_utterances: 8,
            external_label: "Customer".to_owned(),
            internal_label: "Agent".to_owned(),
            analyze_interval: Duration::from_secs(3),
        }
    }
}

impl CallSettings {
    /// The model language for an AudioHook language tag (`en-US` -> `en`), if the model
    /// accepts it.
    pub fn model_language(&self, tag: &str) -> Option<String> {
        languages::resolve(&self.languages, tag).map(|l| l.code.clone())
    }

    /// The BCP-47 tags of the model's languages, for `opened.supportedLanguages`.
    pub fn supported_tags(&self) -> Vec<String> {
        languages::supported_tags(&self.languages)
    }
}

/// Counters of live calls across the process, for logs and metrics.
#[derive(Debug, Default)]
pub struct LiveStats {
    /// Calls in progress.
    pub active_calls: AtomicUsize,
    /// Calls started.
    pub calls: AtomicU64,
    /// Utterances held back because the ASR pool's live queue was full.
    pub utterances_held: AtomicU64,
    /// Utterances dropped because a transcriber's hold was full too.
    pub utterances_dropped: AtomicU64,
    /// Final transcripts sent.
    pub transcripts: AtomicU64,
}

#[cfg(test)]
mod tests {
    use super::CallSettings;
    use crate::asr::languages::language;

    #[test]
    fn language_tags_map_to_model_languages() {
        let s = CallSettings {
            languages: vec![language("en"), language("de")],
            ..CallSettings::default()
        };
        assert_eq!(s.model_language("en-US").as_deref(), Some("en"));
        assert_eq!(s.model_language("DE_at").as_deref(), Some("de"));
        assert_eq!(s.model_language("es-ES"), None);
        assert_eq!(s.model_language(""), None);
    }
}
