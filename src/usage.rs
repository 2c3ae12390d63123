//! Quotas and usage reports, derived from the ledger's daily totals and the plans, and the
//! reservations work in progress holds against them.
//!
//! Every piece of metered work reserves its worst case before it starts (a chat turn its
//! prompt and `max_tokens`, a file its length, a live call a slice of audio at a time) and
//! gives the reservation back in the same step as its real usage goes into the ledger, so a
//! reservation never sees it twice or not at all. What is left for new work
//! is the quota minus the ledger minus the reservations, checked and taken in one step (under
//! one lock in a process, under one database lock per pool across instances), so parallel
//! requests never share the same remainder.

use std::sync::Arc;

use callstream_actors::usage::{
    Account, Allowance, QuotaGate, UsageError, UsageEvent, UsageKind, UsageSink,
};
use serde::{Deserialize, Serialize};

use crate::clock::{self, MonthPeriod};
use crate::config::{Config, Plan};
use crate::store::shared::{PoolRef, Write};
use crate::store::{DayUsage, SharedState, Store, StoreError};

/// Milliseconds in an audio-minute.
pub const MS_PER_MINUTE: u64 = 60_000;

/// Quota answers for every organisation, and the reservations of work in progress, kept in
/// the [`SharedState`] of the instances.
#[derive(Clone)]
pub struct Quotas {
    config: Arc<Config>,
    store: Arc<dyn Store>,
    shared: Arc<dyn SharedState>,
}

/// A reservation against a pool, given back when dropped. [`Reservation::settle`] records the
/// real usage first.
pub struct Reservation {
    quotas: Quotas,
    org_id: String,
    kind: UsageKind,
    amount: u64,
    /// Held in the shared state (not so for an unlimited pool: nobody asks about it).
    booked: bool,
}

impl std::fmt::Debug for Reservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservation")
            .field("org_id", &self.org_id)
            .field("kind", &self.kind)
            .field("amount", &self.amount)
            .finish()
    }
}

impl Reservation {
    /// How much is reserved.
    pub fn amount(&self) -> u64 {
        self.amount
    }

    /// Keeps the reservation held past this value; the caller gives it back with
    /// [`QuotaGate::release`]. Returns the amount.
    fn keep(mut self) -> u64 {
        std::mem::take(&mut self.amount)
    }

    /// Records `used` for `account` (durably) and gives the reservation back, in one step to
    /// anyone reserving from the pool. When the write fails the reservation is given back
    /// all the same (on drop) and the error returned.
    pub async fn settle(
        mut self,
        account: &Account,
        used: u64,
        source: callstream_actors::usage::UsageSource,
        end_user: Option<String>,
    ) -> Result<(), UsageError> {
        if used == 0 {
            return Ok(());
        }
        let event = usage_event(account, self.kind, used, source, end_user);
        let held = if self.booked { self.amount } else { 0 };
        let ledger: &dyn UsageSink = self.quotas.store.as_ref();
        let written = self
            .quotas
            .shared
            .settle(
                ledger,
                Write::Event(&event),
                &[(&self.org_id, self.kind, held)],
            )
            .await;
        if written.is_ok() {
            // Given back with the write.
            self.amount = 0;
        }
        written
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.booked {
            self.quotas.release(&self.org_id, self.kind, self.amount);
        }
    }
}

/// One pool of an organisation in one month.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PoolReport {
    /// Used so far, in the pool's unit.
    pub used: u64,
    /// The plan's quota in the pool's unit; `null` when unlimited.
    pub quota: Option<u64>,
    /// What is left; `null` when unlimited.
    pub remaining: Option<u64>,
}

/// Usage of an organisation in one calendar month.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PoolReportSeconds {
    /// Seconds used.
    pub used: f64,
    /// Quota in seconds; `null` when unlimited.
    pub quota: Option<f64>,
    /// Seconds left; `null` when unlimited.
    pub remaining: Option<f64>,
}

impl Quotas {
    /// Quotas over `store` with the plans of `config`, holding reservations in `shared`.
    pub fn new(config: Arc<Config>, store: Arc<dyn Store>, shared: Arc<dyn SharedState>) -> Self {
        Self {
            config,
            store,
            shared,
        }
    }

    /// The plan of a live organisation (a deleted one is gone).
    async fn plan_of(&self, org_id: &str) -> Result<(String, Plan), UsageError> {
        self.org_plan(org_id, false).await
    }

    /// The plan's name and terms of `org_id`; of a deleted organisation too if `deleted_too`.
    async fn org_plan(
        &self,
        org_id: &str,
        deleted_too: bool,
    ) -> Result<(String, Plan), UsageError> {
        let org = self
            .store
            .org(org_id)
            .await
            .map_err(UsageError::from)?
            .filter(|o| deleted_too || !o.deleted)
            .ok_or_else(|| UsageError::UnknownOrg(org_id.to_owned()))?;
        let plan = self
            .config
            .plan(&org.plan)
            .cloned()
            .ok_or_else(|| UsageError::UnknownPlan(org.plan.clone()))?;
        Ok((org.plan, plan))
    }

    async fn month_totals(
        &self,
        org_id: &str,
        month: &MonthPeriod,
    ) -> Result<(Vec<DayUsage>, u64, u64), StoreError> {
        let days = self
            .store
            .usage_by_day(org_id, &month.first_day, &month.last_day)
            .await?;
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

    /// The report of `org_id` for the month containing `at_ms` (a deleted organisation's
    /// too: its usage stays readable to operators).
    pub async fn report(&self, org_id: &str, at_ms: i64) -> Result<UsageReport, UsageError> {
        let (plan_name, plan) = self.org_plan(org_id, true).await?;
        let month = clock::month_of(at_ms);
        let (days, tokens, audio_ms) = self.month_totals(org_id, &month).await?;
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
    /// What is left of `kind`'s pool for `org_id` on `plan`, net of reservations, for callers
    /// that already hold the organisation's plan (the edge does).
    pub async fn allowance_for(
        &self,
        org_id: &str,
        plan: &Plan,
        kind: UsageKind,
        at_ms: i64,
    ) -> Result<Allowance, StoreError> {
        let Some(quota) = quota_of(plan, kind) else {
            return Ok(Allowance::Unlimited);
        };
        // The ledger first: work settled between the two reads is then missed, never counted
        // twice, so this answer errs towards letting work try; its reservation decides. The
        // reservations are read once settlements in flight have given theirs back (on one
        // instance by waiting for them, in a database by their one transaction), so work
        // already in the ledger is not also seen still reserved.
        let used = self.used(org_id, kind, &clock::month_of(at_ms)).await?;
        let reserved = self.shared.reserved(org_id, kind).await?;
        Ok(Allowance::Remaining(
            quota.saturating_sub(used).saturating_sub(reserved),
        ))
    }

    /// Reserves up to `want` of `kind` for `org_id` on `plan`, at least `min` (else nothing):
    /// `None` when less than `min` is left. The reservation is given back when dropped.
    pub async fn reserve_for(
        &self,
        org_id: &str,
        plan: &Plan,
        kind: UsageKind,
        want: u64,
        min: u64,
        at_ms: i64,
    ) -> Result<Option<Reservation>, StoreError> {
        let month = clock::month_of(at_ms);
        let quota = quota_of(plan, kind);
        let pool = PoolRef {
            org_id,
            kind,
            quota,
            first_day: &month.first_day,
            last_day: &month.last_day,
        };
        let quotas = self;
        let month = &month;
        let used = move || -> futures_util::future::BoxFuture<'_, Result<u64, StoreError>> {
            Box::pin(quotas.used(org_id, kind, month))
        };
        let granted = self.shared.reserve(pool, want, min, &used).await?;
        Ok(granted.map(|amount| Reservation {
            quotas: self.clone(),
            org_id: org_id.to_owned(),
            kind,
            amount,
            booked: quota.is_some(),
        }))
    }

    /// [`Quotas::reserve_for`] on the organisation's own plan, read from the store.
    pub async fn reserve_of(
        &self,
        org_id: &str,
        kind: UsageKind,
        want: u64,
        min: u64,
        at_ms: i64,
    ) -> Result<Option<Reservation>, UsageError> {
        let (_, plan) = self.plan_of(org_id).await?;
        Ok(self
            .reserve_for(org_id, &plan, kind, want, min, at_ms)
            .await?)
    }

    fn release(&self, org_id: &str, kind: UsageKind, amount: u64) {
        if amount > 0 {
            self.shared.release(org_id, kind, amount);
        }
    }

    /// What the ledger holds of `kind` for `org_id` in `month`.
    async fn used(
        &self,
        org_id: &str,
        kind: UsageKind,
        month: &MonthPeriod,
    ) -> Result<u64, StoreError> {
        let (_, tokens, audio_ms) = self.month_totals(org_id, month).await?;
        Ok(match kind {
            UsageKind::Tokens => tokens,
            UsageKind::AudioMs => audio_ms,
        })
    }
}

/// The plan's monthly quota of `kind`, in the pool's unit; `None` when unlimited.
fn quota_of(plan: &Plan, kind: UsageKind) -> Option<u64> {
    match kind {
        UsageKind::Tokens => plan.chat_tokens_per_month,
        UsageKind::AudioMs => plan
            .audio_minutes_per_month
            .map(|m| m.saturating_mul(MS_PER_MINUTE)),
    }
}

#[async_trait::async_trait]
impl QuotaGate for Quotas {
    async fn allowance(
        &self,
        org_id: &str,
        kind: UsageKind,
        at_ms: i64,
    ) -> Result<Allowance, UsageError> {
        let (_, plan) = self.plan_of(org_id).await?;
        Ok(self.allowance_for(org_id, &plan, kind, at_ms).await?)
    }

    async fn reserve(
        &self,
        org_id: &str,
        kind: UsageKind,
        want: u64,
        at_ms: i64,
    ) -> Result<u64, UsageError> {
        let (_, plan) = self.plan_of(org_id).await?;
        Ok(
            match self
                .reserve_for(org_id, &plan, kind, want, 1, at_ms)
                .await?
            {
                // The caller gives it back through `release`.
                Some(r) => r.keep(),
                None => 0,
            },
        )
    }

    fn release(&self, org_id: &str, kind: UsageKind, amount: u64) {
        Quotas::release(self, org_id, kind, amount);
    }

    async fn checkpoint(
        &self,
        sink: &dyn UsageSink,
        totals: &[UsageEvent],
        release: &[(&str, u64)],
    ) -> Result<(), UsageError> {
        let release: Vec<(&str, UsageKind, u64)> = release
            .iter()
            .map(|(org_id, ms)| (*org_id, UsageKind::AudioMs, *ms))
            .collect();
        self.shared
            .settle(sink, Write::Totals(totals), &release)
            .await
    }
}

/// The ledger event of `amount` of `kind` used now by `account`.
fn usage_event(
    account: &Account,
    kind: UsageKind,
    amount: u64,
    source: callstream_actors::usage::UsageSource,
    end_user: Option<String>,
) -> UsageEvent {
    UsageEvent {
        org_id: account.org_id.clone(),
        key_id: account.key_id.clone(),
        end_user,
        kind,
        amount,
        source,
        at_ms: clock::now_ms(),
        call_id: None,
    }
}
