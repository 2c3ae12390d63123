//! Quotas and usage reports, derived from the ledger's daily totals and the plans.

use std::sync::Arc;

use callstream_actors::usage::{Account, Allowance, QuotaGate, UsageError, UsageKind};
use serde::{Deserialize, Serialize};

use crate::clock::{self, MonthPeriod};
use crate::config::{Config, Plan};
use crate::store::{DayUsage, Store, StoreError};

/// Milliseconds in an audio-minute.
pub const MS_PER_MINUTE: u64 = 60_000;

/// Quota answers for every organisation.
#[derive(Clone)]
pub struct Quotas {
    config: Arc<Config>,
    store: Arc<dyn Store>,
}

/// One pool of an organisation in one month.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolReport {
    /// Used so far, in the pool's unit.
    pub used: u64,
    /// The plan's quota in the pool's unit; `null` when unlimited.
    pub quota: Option<u64>,
    /// What is left; `null` when unlimited.
    pub remaining: Option<u64>,
}

/// Usage of an organisation in one calendar month.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UsageReport {
    /// The organisation.
    pub org_id: String,
    /// Its plan.
    pub plan: String,
    /// `YYYY-MM`.
    pub month: String,
    /// Chat tokens.
    pub chat_tokens: PoolReport,
    /// Transcription audio in seconds (file and live together), to millisecond precision.
    pub audio_seconds: PoolReportSeconds,
    /// Per-day totals, in day order.
    pub days: Vec<DayUsage>,
}

/// The audio pool, in seconds and minutes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolReportSeconds {
    /// Seconds used.
    pub used: f64,
    /// Quota in seconds; `null` when unlimited.
    pub quota: Option<f64>,
    /// Seconds left; `null` when unlimited.
    pub remaining: Option<f64>,
}

impl Quotas {
    /// Quotas over `store` with the plans of `config`.
    pub fn new(config: Arc<Config>, store: Arc<dyn Store>) -> Self {
        Self { config, store }
    }

    fn plan_of(&self, org_id: &str) -> Result<(String, Plan), UsageError> {
        let org = self
            .store
            .org(org_id)
            .map_err(UsageError::from)?
            .ok_or_else(|| UsageError::UnknownOrg(org_id.to_owned()))?;
        let plan = self
            .config
            .plan(&org.plan)
            .cloned()
            .ok_or_else(|| UsageError::UnknownPlan(org.plan.clone()))?;
        Ok((org.plan, plan))
    }

    fn month_totals(
        &self,
        org_id: &str,
        month: &MonthPeriod,
    ) -> Result<(Vec<DayUsage>, u64, u64), StoreError> {
        let days = self
            .store
            .usage_by_day(org_id, &month.first_day, &month.last_day)?;
        let total = |kind| {
            days.iter()
                .filter(|d| d.kind == kind)
                .map(|d| d.amount)
                .sum()
        };
        let tokens = total(UsageKind::Tokens);
        let audio = total(UsageKind::AudioMs);
        Ok((days, tokens, audio))
    }

    /// The report of `org_id` for the month containing `at_ms`.
    pub fn report(&self, org_id: &str, at_ms: i64) -> Result<UsageReport, UsageError> {
        let (plan_name, plan) = self.plan_of(org_id)?;
        let month = clock::month_of(at_ms);
        let (days, tokens, audio_ms) = self.month_totals(org_id, &month)?;
        let token_quota = plan.chat_tokens_per_month;
        let audio_quota_ms = plan
            .audio_minutes_per_month
            .map(|m| m.saturating_mul(MS_PER_MINUTE));
        let secs = |ms: u64| ms as f64 / 1000.0;
        Ok(UsageReport {
            org_id: org_id.to_owned(),
            plan: plan_name,
            month: month.month,
            chat_tokens: PoolReport {
                used: tokens,
                quota: token_quota,
                remaining: token_quota.map(|q| q.saturating_sub(tokens)),
            },
            audio_seconds: PoolReportSeconds {
                used: secs(audio_ms),
                quota: audio_quota_ms.map(secs),
                remaining: audio_quota_ms.map(|q| secs(q.saturating_sub(audio_ms))),
            },
            days,
        })
    }
}

impl Quotas {
    /// What is left of `kind`'s pool for `org_id` on `plan`, for callers that already hold the
    /// organisation's plan (the edge does): it saves reading the organisation again.
    pub fn allowance_for(
        &self,
        org_id: &str,
        plan: &Plan,
        kind: UsageKind,
        at_ms: i64,
    ) -> Result<Allowance, StoreError> {
        let quota = match kind {
            UsageKind::Tokens => plan.chat_tokens_per_month,
            UsageKind::AudioMs => plan
                .audio_minutes_per_month
                .map(|m| m.saturating_mul(MS_PER_MINUTE)),
        };
        let Some(quota) = quota else {
            return Ok(Allowance::Unlimited);
        };
        let (_, tokens, audio_ms) = self.month_totals(org_id, &clock::month_of(at_ms))?;
        let used = match kind {
            UsageKind::Tokens => tokens,
            UsageKind::AudioMs => audio_ms,
        };
        Ok(Allowance::Remaining(quota.saturating_sub(used)))
    }
}

impl QuotaGate for Quotas {
    fn allowance(
        &self,
        org_id: &str,
        kind: UsageKind,
        at_ms: i64,
    ) -> Result<Allowance, UsageError> {
        let (_, plan) = self.plan_of(org_id)?;
        Ok(self.allowance_for(org_id, &plan, kind, at_ms)?)
    }
}

/// Appends a usage event for `account` and waits until it is durable. Runs the store write on
/// a blocking thread: it ends in an fsync.
pub async fn record(
    store: Arc<dyn Store>,
    account: &Account,
    kind: UsageKind,
    amount: u64,
    source: callstream_actors::usage::UsageSource,
    end_user: Option<String>,
) -> Result<(), UsageError> {
    let event = callstream_actors::usage::UsageEvent {
        org_id: account.org_id.clone(),
        key_id: account.key_id.clone(),
        end_user,
        kind,
        amount,
        source,
        at_ms: clock::now_ms(),
    };
    tokio::task::spawn_blocking(move || store.record(&event))
        .await
        .map_err(|e| UsageError::Store(format!("billing task failed: {e}")))?
}
