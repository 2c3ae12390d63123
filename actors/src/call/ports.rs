//! What a call needs from the outside world and tells it: the intent analysis and the observer
//! of calls in progress. The service implements both.

use std::future::Future;
use std::pin::Pin;

/// The future of an intent classification.
pub type IntentFuture = Pin<Box<dyn Future<Output = Result<serde_json::Value, String>> + Send>>;

/// Classifies the intent of a transcript (lines of `Speaker: text`; empty when nothing was
/// said yet) into an intent result (`intents` with `intent` and `confidence`, and
/// `reasoning`).
pub trait IntentClassifier: Send + Sync + 'static {
    /// Starts a classification.
    fn classify(&self, transcript: String) -> IntentFuture;

    /// Tells the classifier that a classification of a transcript starting with `transcript`
    /// is likely, so that it can prepare in the background (a language model that keeps
    /// evaluated prompts evaluates it while idle). Returns at once; the default ignores it.
    fn prefill(&self, transcript: String) {
        let _ = transcript;
    }
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
