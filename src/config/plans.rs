//! `[limits]` and `[plans.*]`: what each organisation may use, by plan: its request rate, its
//! monthly quotas and its caps on what it holds at once.

use serde::Deserialize;

/// `[limits]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Plan of organisations created without one.
    pub default_plan: String,
}

/// A plan: request rate per key and monthly quotas per organisation.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    /// Requests per minute per API key, shared by every route of the key.
    pub rpm: u32,
    /// Chat tokens per calendar month; `None` is unlimited.
    #[serde(default)]
    pub chat_tokens_per_month: Option<u64>,
    /// Audio-minutes per calendar month, file and live together; `None` is unlimited.
    #[serde(default)]
    pub audio_minutes_per_month: Option<u64>,
    /// Live calls in progress at once (within `calls.max_calls_per_org`), over every instance.
    #[serde(default = "default_plan_live_calls")]
    pub max_live_calls: usize,
    /// Realtime chat sessions open at once, over every instance.
    #[serde(default = "default_plan_realtime_sessions")]
    pub max_realtime_sessions: usize,
    /// File transcriptions in progress at once, over every instance.
    #[serde(default = "default_plan_file_transcriptions")]
    pub max_file_transcriptions: usize,
    /// API keys not revoked.
    #[serde(default = "default_plan_api_keys")]
    pub max_api_keys: usize,
    /// AudioHook connectors not revoked.
    #[serde(default = "default_plan_connectors")]
    pub max_connectors: usize,
    /// Days the call history keeps a call or file transcription; `None` keeps them until they
    /// are deleted. An organisation may keep them for less.
    #[serde(default)]
    pub retention_days: Option<u32>,
}

impl Plan {
    /// A plan with no quota and no cap (benchmarks, tools).
    pub fn unlimited() -> Self {
        Self {
            rpm: u32::MAX,
            chat_tokens_per_month: None,
            audio_minutes_per_month: None,
            max_live_calls: usize::MAX,
            max_realtime_sessions: usize::MAX,
            max_file_transcriptions: usize::MAX,
            max_api_keys: usize::MAX,
            max_connectors: usize::MAX,
            retention_days: None,
        }
    }
}

fn default_plan_live_calls() -> usize {
    128
}

fn default_plan_realtime_sessions() -> usize {
    64
}

fn default_plan_file_transcriptions() -> usize {
    4
}

fn default_plan_api_keys() -> usize {
    100
}

fn default_plan_connectors() -> usize {
    50
}
