//! The billing actor: one per process. Live calls report the audio they receive; the actor
//! adds it up per call and writes every call's running total to the ledger about once a second
//! (one flush to disk for all calls in progress), and once more when a call ends. A crash loses
//! at most the audio since the last write.
//!
//! Calls stream against leases: before it serves audio a call takes a slice of the
//! organisation's audio pool ([`BillingMsg::Lease`]) and takes another when that slice is used
//! up; an organisation with nothing left gets no slice. A lease is a reservation in the
//! [`QuotaGate`], handed back as the audio it covers reaches the ledger or when the call ends.
//!
//! Amounts are whole milliseconds derived from whole samples (8 per millisecond at 8 kHz), so
//! a call's ledger rows add up to exactly the audio it streamed, rounded down to the
//! millisecond once, at the end.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::usage::{Account, QuotaGate, UsageError, UsageEvent, UsageKind, UsageSink, UsageSource};

/// Samples per millisecond of live-call audio (8 kHz).
pub const SAMPLES_PER_MS: u64 = 8;

/// Milliseconds in a UTC day: a call's running total starts a new row each day.
const DAY_MS: i64 = 86_400_000;

/// Messages of the [`Billing`] actor.
#[derive(Debug)]
pub enum BillingMsg {
    /// A call starts metering.
    Start {
        /// Call id.
        call: String,
        /// Who pays.
        account: Account,
    },
    /// A call received this many samples per channel.
    Audio {
        /// Call id.
        call: String,
        /// Samples per channel, 8 kHz.
        samples: u64,
    },
    /// A call asks for another slice of the audio pool. Answers the milliseconds granted:
    /// up to `want_ms`, zero when nothing is left.
    Lease {
        /// Call id.
        call: String,
        /// Milliseconds of audio wanted.
        want_ms: u64,
        /// The answer.
        reply: RpcReplyPort<Result<u64, UsageError>>,
    },
    /// The call ended: write the rest and forget it. Answers the call's total, in ms.
    End {
        /// Call id.
        call: String,
        /// Total milliseconds billed for the call, or why the last write failed.
        reply: RpcReplyPort<Result<u64, UsageError>>,
    },
    /// Write what is new for every call (sent by the actor's own timer).
    Flush,
}

/// How long a call waits for the billing actor before it gives up on an answer.
pub const BILLING_WAIT: Duration = Duration::from_secs(5);

/// Ends a call's metering: writes the rest of its usage and logs the outcome. A write that
/// fails stays pending in the actor and is retried at the next flush.
pub async fn end_call(billing: &ActorRef<BillingMsg>, call_id: &str) {
    let call = call_id.to_owned();
    match ractor::call_t!(
        billing,
        |reply| BillingMsg::End { call, reply },
        BILLING_WAIT.as_millis() as u64
    ) {
        Ok(Ok(ms)) => {
            tracing::info!(call = %call_id, billed_s = ms as f64 / 1000.0, "call billed")
        }
        Ok(Err(e)) => {
            tracing::error!(call = %call_id, error = %e, "call usage not written yet; billing retries")
        }
        Err(e) => {
            tracing::error!(call = %call_id, error = %e, "billing actor did not answer; it writes the call at its next flush")
        }
    }
}

/// Asks for another slice of the audio pool for `call_id`, waiting at most [`BILLING_WAIT`].
pub async fn lease(
    billing: &ActorRef<BillingMsg>,
    call_id: &str,
    want_ms: u64,
) -> Result<u64, UsageError> {
    let call = call_id.to_owned();
    match ractor::call_t!(
        billing,
        |reply| BillingMsg::Lease {
            call,
            want_ms,
            reply
        },
        BILLING_WAIT.as_millis() as u64
    ) {
        Ok(answer) => answer,
        Err(e) => Err(UsageError::Store(format!("billing did not answer: {e}"))),
    }
}

/// The actor's arguments.
pub struct BillingArgs {
    /// Where events go (durably).
    pub sink: Arc<dyn UsageSink>,
    /// Where allowances and reservations come from.
    pub gate: Arc<dyn QuotaGate>,
    /// How often to write.
    pub flush_every: Duration,
    /// Unix milliseconds now.
    pub now_ms: fn() -> i64,
}

#[derive(Debug)]
struct Meter {
    account: Account,
    samples: u64,
    /// Written to the ledger, in all.
    billed_ms: u64,
    /// The ledger row of today's part of the call: when it began, and its total.
    row_at_ms: i64,
    row_ms: u64,
    /// Leased from the pool, in all; and given back so far.
    leased_ms: u64,
    released_ms: u64,
    ended: bool,
}

impl Meter {
    fn due_ms(&self) -> u64 {
        self.samples / SAMPLES_PER_MS - self.billed_ms
    }

    /// What is still reserved in the gate for this call.
    fn outstanding_ms(&self) -> u64 {
        self.leased_ms - self.released_ms
    }
}

/// The actor's state.
pub struct BillingState {
    args: BillingArgs,
    calls: HashMap<String, Meter>,
}

/// The billing actor.
#[derive(Debug, Default)]
pub struct Billing;

impl BillingState {
    /// Gives back up to `ms` of `meter`'s lease.
    fn release(gate: &dyn QuotaGate, meter: &mut Meter, ms: u64) {
        let ms = ms.min(meter.outstanding_ms());
        if ms > 0 {
            gate.release(&meter.account.org_id, UsageKind::AudioMs, ms);
            meter.released_ms += ms;
        }
    }

    /// Writes the running totals of `calls` (all when `None`) that grew, in one batch; a
    /// failed write is kept for the next flush.
    async fn flush(&mut self, only: Option<&str>) -> Result<(), UsageError> {
        let now = (self.args.now_ms)();
        let mut rows = Vec::new();
        let mut written = Vec::new();
        for (id, m) in &self.calls {
            if only.is_some_and(|o| o != id.as_str()) || m.due_ms() == 0 {
                continue;
            }
            let due = m.due_ms();
            // A new day starts a new row, so day totals and ledger rows agree.
            let (at_ms, before) = if m.row_at_ms.div_euclid(DAY_MS) == now.div_euclid(DAY_MS) {
                (m.row_at_ms, m.row_ms)
            } else {
                (now, 0)
            };
            rows.push(UsageEvent {
                org_id: m.account.org_id.clone(),
                key_id: m.account.key_id.clone(),
                end_user: None,
                kind: UsageKind::AudioMs,
                amount: before + due,
                source: UsageSource::Callstream,
                at_ms,
                call_id: Some(id.clone()),
            });
            // What the call gives back of its lease, in the same step as the write.
            let give_back = due.min(m.outstanding_ms());
            written.push((id.clone(), at_ms, before + due, due, give_back));
        }
        let mut result = Ok(());
        if !rows.is_empty() {
            let given: Vec<u64> = written.iter().map(|w| w.4).collect();
            let release: Vec<(&str, u64)> = rows
                .iter()
                .zip(given)
                .filter(|(_, ms)| *ms > 0)
                .map(|(row, ms)| (row.org_id.as_str(), ms))
                .collect();
            // The gate's store keeps its blocking writes (an fsync) off the async workers.
            let outcome = self
                .args
                .gate
                .checkpoint(self.args.sink.as_ref(), &rows, &release)
                .await;
            match outcome {
                Ok(()) => {
                    for (id, at_ms, total, due, give_back) in written {
                        if let Some(m) = self.calls.get_mut(&id) {
                            m.row_at_ms = at_ms;
                            m.row_ms = total;
                            m.billed_ms += due;
                            m.released_ms += give_back;
                        }
                    }
                }
                Err(e) => {
                    tracing::error!(calls = written.len(), error = %e,
                        "live-call usage not written; kept for the next flush");
                    result = Err(e);
                }
            }
        }
        // Ended calls whose usage is all written are done; what is left of their lease goes back.
        let gate = self.args.gate.clone();
        self.calls.retain(|_, m| {
            let done = m.ended && m.due_ms() == 0;
            if done {
                Self::release(gate.as_ref(), m, u64::MAX);
            }
            !done
        });
        result
    }
}

impl Actor for Billing {
    type Msg = BillingMsg;
    type State = BillingState;
    type Arguments = BillingArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: BillingArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        myself.send_interval(args.flush_every, || BillingMsg::Flush);
        Ok(BillingState {
            args,
            calls: HashMap::new(),
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            BillingMsg::Start { call, account } => {
                let now = (state.args.now_ms)();
                state.calls.entry(call).or_insert(Meter {
                    account,
                    samples: 0,
                    billed_ms: 0,
                    row_at_ms: now,
                    row_ms: 0,
                    leased_ms: 0,
                    released_ms: 0,
                    ended: false,
                });
            }
            BillingMsg::Audio { call, samples } => {
                if let Some(m) = state.calls.get_mut(&call) {
                    m.samples += samples;
                }
            }
            BillingMsg::Lease {
                call,
                want_ms,
                reply,
            } => {
                let Some(org_id) = state
                    .calls
                    .get(&call)
                    .filter(|m| !m.ended)
                    .map(|m| m.account.org_id.clone())
                else {
                    let _ = reply.send(Ok(0));
                    return Ok(());
                };
                let now = (state.args.now_ms)();
                let answer = state
                    .args
                    .gate
                    .reserve(&org_id, UsageKind::AudioMs, want_ms, now)
                    .await;
                if let (Ok(granted), Some(m)) = (&answer, state.calls.get_mut(&call)) {
                    m.leased_ms += granted;
                }
                let _ = reply.send(answer);
            }
            BillingMsg::End { call, reply } => {
                if let Some(m) = state.calls.get_mut(&call) {
                    m.ended = true;
                }
                let total = state
                    .calls
                    .get(&call)
                    .map_or(0, |m| m.samples / SAMPLES_PER_MS);
                let result = state.flush(Some(&call)).await.map(|()| total);
                let _ = reply.send(result);
            }
            BillingMsg::Flush => {
                // Errors are logged inside; the rest is retried next time.
                let _ = state.flush(None).await;
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let _ = state.flush(None).await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use crate::usage::Allowance;

    /// Running totals by (call, row start), a quota and its reservations, in memory.
    #[derive(Default)]
    struct Ledger {
        rows: Mutex<BTreeMap<(String, i64), u64>>,
        batches: AtomicUsize,
        fail: AtomicBool,
        quota_ms: u64,
        reserved: Mutex<u64>,
    }

    impl Ledger {
        fn billed(&self) -> u64 {
            self.rows.lock().values().sum()
        }
    }

    #[async_trait::async_trait]
    impl UsageSink for Ledger {
        async fn record(&self, _: &UsageEvent) -> Result<(), UsageError> {
            unreachable!("live calls write running totals")
        }

        async fn checkpoint(&self, totals: &[UsageEvent]) -> Result<(), UsageError> {
            if self.fail.load(Ordering::SeqCst) {
                return Err(UsageError::Store("disk full".into()));
            }
            self.batches.fetch_add(1, Ordering::SeqCst);
            let mut rows = self.rows.lock();
            for t in totals {
                assert_eq!(t.source, UsageSource::Callstream);
                assert_eq!(t.kind, UsageKind::AudioMs);
                rows.insert((t.call_id.clone().unwrap(), t.at_ms), t.amount);
            }
            Ok(())
        }
    }

    #[async_trait::async_trait]
    impl QuotaGate for Ledger {
        async fn allowance(&self, _: &str, _: UsageKind, _: i64) -> Result<Allowance, UsageError> {
            let taken = self.billed() + *self.reserved.lock();
            Ok(Allowance::Remaining(self.quota_ms.saturating_sub(taken)))
        }

        async fn reserve(
            &self,
            _: &str,
            _: UsageKind,
            want: u64,
            _: i64,
        ) -> Result<u64, UsageError> {
            let mut reserved = self.reserved.lock();
            let left = self.quota_ms.saturating_sub(self.billed() + *reserved);
            let granted = want.min(left);
            *reserved += granted;
            Ok(granted)
        }

        fn release(&self, _: &str, _: UsageKind, amount: u64) {
            let mut reserved = self.reserved.lock();
            *reserved = reserved
                .checked_sub(amount)
                .expect("never more than reserved");
        }

        async fn checkpoint(
            &self,
            sink: &dyn UsageSink,
            totals: &[UsageEvent],
            release: &[(&str, u64)],
        ) -> Result<(), UsageError> {
            sink.checkpoint(totals).await?;
            // The write and the release as one step, as a real gate makes them.
            let mut reserved = self.reserved.lock();
            let given: u64 = release.iter().map(|(_, ms)| ms).sum();
            *reserved = reserved
                .checked_sub(given)
                .expect("never more than reserved");
            Ok(())
        }
    }

    async fn start(ledger: Arc<Ledger>, every: Duration) -> ActorRef<BillingMsg> {
        let args = BillingArgs {
            sink: ledger.clone(),
            gate: ledger,
            flush_every: every,
            now_ms: || 1_700_000_000_000,
        };
        Actor::spawn(None, Billing, args).await.unwrap().0
    }

    fn begin(billing: &ActorRef<BillingMsg>, call: &str) {
        billing
            .cast(BillingMsg::Start {
                call: call.into(),
                account: Account {
                    org_id: "org_a".into(),
                    key_id: "cc_1".into(),
                },
            })
            .unwrap();
    }

    fn audio(billing: &ActorRef<BillingMsg>, call: &str, samples: u64) {
        billing
            .cast(BillingMsg::Audio {
                call: call.into(),
                samples,
            })
            .unwrap();
    }

    async fn end(billing: &ActorRef<BillingMsg>, call: &str) -> Result<u64, UsageError> {
        let call = call.to_owned();
        ractor::call!(billing, |reply| BillingMsg::End { call, reply }).unwrap()
    }

    #[tokio::test]
    async fn running_totals_add_up_to_the_streamed_audio_in_one_batch_per_flush() {
        let ledger = Arc::new(Ledger::default());
        let billing = start(ledger.clone(), Duration::from_secs(3600)).await;
        for call in ["c1", "c2", "c3"] {
            begin(&billing, call);
            for _ in 0..7 {
                // 1601 samples: not a whole number of milliseconds each.
                audio(&billing, call, 1601);
            }
        }
        billing.cast(BillingMsg::Flush).unwrap();
        audio(&billing, "c1", 8000);
        let total = end(&billing, "c1").await.unwrap();
        assert_eq!(total, (7 * 1601 + 8000) / 8);
        // One batch for the three calls, one for the end of c1.
        assert_eq!(ledger.batches.load(Ordering::SeqCst), 2);
        let rows = ledger.rows.lock().clone();
        assert_eq!(rows.len(), 3, "one row per call, written over: {rows:?}");
        assert_eq!(rows[&("c1".to_owned(), 1_700_000_000_000)], total);
        assert_eq!(rows[&("c2".to_owned(), 1_700_000_000_000)], 7 * 1601 / 8);
        billing.stop(None);
    }

    #[tokio::test]
    async fn leases_never_grant_more_than_is_left_and_go_back_as_audio_is_written() {
        let ledger = Arc::new(Ledger {
            quota_ms: 50_000,
            ..Ledger::default()
        });
        let billing = start(ledger.clone(), Duration::from_secs(3600)).await;
        begin(&billing, "a");
        begin(&billing, "b");
        assert_eq!(lease(&billing, "a", 30_000).await.unwrap(), 30_000);
        assert_eq!(lease(&billing, "b", 30_000).await.unwrap(), 20_000);
        assert_eq!(lease(&billing, "b", 30_000).await.unwrap(), 0);
        assert_eq!(lease(&billing, "unknown", 30_000).await.unwrap(), 0);
        // Call a streams 10 s; once written, its lease still covers the other 20 s.
        audio(&billing, "a", 80_000);
        billing.cast(BillingMsg::Flush).unwrap();
        assert_eq!(lease(&billing, "a", 30_000).await.unwrap(), 0);
        assert_eq!(*ledger.reserved.lock(), 40_000);
        // Call b ends having used 5 s: the rest of its lease goes back to the pool.
        audio(&billing, "b", 40_000);
        assert_eq!(end(&billing, "b").await.unwrap(), 5_000);
        assert_eq!(*ledger.reserved.lock(), 20_000);
        assert_eq!(lease(&billing, "a", 30_000).await.unwrap(), 15_000);
        assert_eq!(end(&billing, "a").await.unwrap(), 10_000);
        assert_eq!(*ledger.reserved.lock(), 0);
        assert_eq!(ledger.billed(), 15_000);
        billing.stop(None);
    }

    #[tokio::test]
    async fn a_failed_write_is_kept_and_retried() {
        let ledger = Arc::new(Ledger::default());
        let billing = start(ledger.clone(), Duration::from_secs(3600)).await;
        begin(&billing, "c");
        audio(&billing, "c", 80_000);
        ledger.fail.store(true, Ordering::SeqCst);
        assert!(end(&billing, "c").await.is_err());
        ledger.fail.store(false, Ordering::SeqCst);
        billing.cast(BillingMsg::Flush).unwrap();
        // A lease asked after the flush is answered after it: the write has happened by then.
        lease(&billing, "c", 1).await.unwrap();
        assert_eq!(ledger.billed(), 10_000);
        billing.stop(None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_timer_flushes_every_period() {
        let ledger = Arc::new(Ledger::default());
        let billing = start(ledger.clone(), Duration::from_secs(1)).await;
        begin(&billing, "c");
        audio(&billing, "c", 800);
        tokio::time::sleep(Duration::from_millis(900)).await;
        lease(&billing, "c", 1).await.unwrap();
        assert_eq!(ledger.billed(), 0, "not before the period");
        tokio::time::sleep(Duration::from_millis(101)).await;
        lease(&billing, "c", 1).await.unwrap();
        assert_eq!(ledger.billed(), 100);
        audio(&billing, "c", 800);
        tokio::time::sleep(Duration::from_secs(1)).await;
        lease(&billing, "c", 1).await.unwrap();
        assert_eq!(ledger.billed(), 200);
        billing.stop(None);
    }
}
