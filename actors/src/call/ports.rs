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

    /// Tells the classifier the call's transcript so far, `transcript`, after each new line, so
    /// that it can prepare the next classification in the background (a language model that
    /// keeps evaluated prompts reads it ahead). `asked`: the call has asked for its intent
    /// already, and is likely to ask again; a call that has not may be prepared only as far as
    /// the classifier can afford. Returns at once; the default ignores it.
    fn prefill(&self, transcript: String, asked: bool) {
        let _ = (transcript, asked);
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
    /// The connector (client id) the call came in through.
    pub connector: String,
    /// The AudioHook session the call began with: the first of `continuedSessions` when the
    /// platform resumes a call, else this session's id (else the call's id).
    pub first_session: String,
    /// The calling party's number, as sent.
    pub ani: String,
    /// The dialled number, as sent.
    pub dnis: String,
    /// Speaker label of each channel, in order.
    pub labels: Vec<String>,
}

/// A final transcript, as observers see it.
#[derive(Debug, Clone, PartialEq)]
pub struct FinalLine {
    /// Channel index.
    pub channel: usize,
    /// Start on the call timeline, seconds.
    pub offset: f64,
    /// Seconds.
    pub duration: f64,
    /// 0 to 1.
    pub confidence: f64,
    /// The text, as sent to the client.
    pub text: String,
}

/// How a call ended, as observers see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallEnded {
    /// Why (the [`crate::call::CallEnd`] in words).
    pub reason: String,
    /// Audio served under the call's leases, milliseconds per channel: what was billed.
    pub billed_ms: u64,
}

/// Watches calls (the dashboard's live page). Called from the call's actor: be quick.
pub trait CallObserver: Send + Sync + 'static {
    /// A call opened (probes and refused calls are not reported).
    fn opened(&self, call: &CallInfo);
    /// A final transcript.
    fn transcript(&self, call_id: &str, line: &FinalLine);
    /// An intent update sent on the call.
    fn intent(&self, call_id: &str, result: &serde_json::Value) {
        let _ = (call_id, result);
    }
    /// The call ended.
    fn ended(&self, call_id: &str, end: &CallEnded);
}
