//! Metering ports: what the engine reports (usage events) and what it asks (quota allowance).
//!
//! The engine meters; the service decides where events are kept and how plans turn into
//! allowances. Amounts are integers in the smallest unit billed so aggregation never rounds:
//! tokens for chat, milliseconds of audio for transcription.

use serde::{Deserialize, Serialize};

/// What a usage amount counts, and so which quota pool it draws from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum UsageKind {
    /// LLM tokens (prompt + completion), the chat pool.
    Tokens,
    /// Milliseconds of audio, the transcription pool shared by file and live audio.
    AudioMs,
}

impl UsageKind {
    /// Every kind, in a fixed order (used for reports).
    pub const ALL: [UsageKind; 2] = [UsageKind::Tokens, UsageKind::AudioMs];

    /// A one-byte tag used in storage keys.
    pub fn tag(self) -> u8 {
        match self {
            UsageKind::Tokens => b't',
            UsageKind::AudioMs => b'a',
        }
    }

    /// The inverse of [`UsageKind::tag`].
    pub fn from_tag(tag: u8) -> Option<Self> {
        match tag {
            b't' => Some(UsageKind::Tokens),
            b'a' => Some(UsageKind::AudioMs),
            _ => None,
        }
    }
}

/// Which surface produced a usage event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UsageSource {
    /// `POST /api/llm/chat/completions`.
    Chat,
    /// `WSS /api/llm/chat/realtime`.
    Realtime,
    /// `POST /api/transcribe`.
    Transcribe,
    /// `WSS /api/callstream/ws`.
    Callstream,
}

/// Who pays for a piece of work: an organisation, and the API key or connector it came through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    /// The organisation.
    pub org_id: String,
    /// The API key id or connector client id.
    pub key_id: String,
}

/// One billable fact, appended to the ledger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageEvent {
    /// The organisation billed.
    pub org_id: String,
    /// The API key or connector client id that was used.
    pub key_id: String,
    /// Opaque end-user id given by the caller, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_user: Option<String>,
    /// What `amount` counts.
    pub kind: UsageKind,
    /// Tokens, or milliseconds of audio.
    pub amount: u64,
    /// The surface that produced it.
    pub source: UsageSource,
    /// When it happened, Unix time in milliseconds. For a live call's running total: when
    /// the call (or the part of it on this day) began.
    pub at_ms: i64,
    /// The live call a running total belongs to (see [`UsageSink::checkpoint`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
}

/// How much of a pool an organisation may still use in the current period.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Allowance {
    /// The plan sets no quota for this pool.
    Unlimited,
    /// This much is left; zero means the quota is exhausted.
    Remaining(u64),
}

impl Allowance {
    /// True when nothing more may be used.
    pub fn is_exhausted(self) -> bool {
        self == Allowance::Remaining(0)
    }
}

/// Errors of the metering ports.
#[derive(Debug, Clone, thiserror::Error)]
pub enum UsageError {
    /// The organisation is not known to the store.
    #[error("unknown organisation {0}")]
    UnknownOrg(String),
    /// The organisation's plan is not in the configuration.
    #[error("plan {0:?} is not configured")]
    UnknownPlan(String),
    /// The backing store failed; nothing was recorded.
    #[error("usage store failed: {0}")]
    Store(String),
}

/// Where usage events go. Both methods return only once what they were given is durable.
#[async_trait::async_trait]
pub trait UsageSink: Send + Sync {
    /// Appends one event to the ledger, durably.
    async fn record(&self, event: &UsageEvent) -> Result<(), UsageError>;

    /// Writes running totals of live calls, all with one flush to disk. Each total has a
    /// `call_id` and replaces the previous total of the same call, organisation and `at_ms`
    /// (one ledger row per call and day); the day totals grow by the difference. Writing the
    /// same total twice changes nothing, so a batch whose flush failed may simply be sent again.
    async fn checkpoint(&self, totals: &[UsageEvent]) -> Result<(), UsageError>;
}

/// Answers quota questions for an organisation and holds reservations against its pools:
/// work that is about to be done takes its worst case out of what is left, and gives back
/// what it did not use once its usage is recorded.
#[async_trait::async_trait]
pub trait QuotaGate: Send + Sync {
    /// What is left of `kind`'s pool for `org_id` in the period containing `at_ms`, net of
    /// what is reserved.
    async fn allowance(
        &self,
        org_id: &str,
        kind: UsageKind,
        at_ms: i64,
    ) -> Result<Allowance, UsageError>;

    /// Reserves up to `want` of what is left; returns how much was reserved (zero when
    /// nothing is left; `want` when the pool is unlimited). The check and the reservation are
    /// one step, so two callers never both take the same remainder.
    async fn reserve(
        &self,
        org_id: &str,
        kind: UsageKind,
        want: u64,
        at_ms: i64,
    ) -> Result<u64, UsageError>;

    /// Gives back `amount` of a reservation (its usage is recorded, or it was not used). Never
    /// waits: a gate kept in a database gives it back from a task of its own, in order.
    fn release(&self, org_id: &str, kind: UsageKind, amount: u64);

    /// Writes live-call `totals` to `sink` (as [`UsageSink::checkpoint`]) and gives back
    /// `release` (organisation, milliseconds) of audio reservations, as one step to anyone
    /// reserving: what was written is never seen twice (in the ledger and still reserved),
    /// which would refuse work that fits, nor not at all, which would let the pool be passed.
    /// When the write fails nothing is given back.
    async fn checkpoint(
        &self,
        sink: &dyn UsageSink,
        totals: &[UsageEvent],
        release: &[(&str, u64)],
    ) -> Result<(), UsageError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_tags_round_trip() {
        for kind in UsageKind::ALL {
            assert_eq!(UsageKind::from_tag(kind.tag()), Some(kind));
        }
        assert_eq!(UsageKind::from_tag(b'x'), None);
    }

    #[test]
    fn event_json_is_stable() {
        let event = UsageEvent {
            org_id: "org_1".into(),
            key_id: "key_1".into(),
            end_user: None,
            kind: UsageKind::AudioMs,
            amount: 1500,
            source: UsageSource::Callstream,
            at_ms: 1_700_000_000_000,
            call_id: None,
        };
        let json = serde_json::to_value(&event).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"org_id":"org_1","key_id":"key_1","kind":"audio_ms","amount":1500,
                "source":"callstream","at_ms":1_700_000_000_000i64})
        );
        assert_eq!(serde_json::from_value::<UsageEvent>(json).unwrap(), event);
    }
}
