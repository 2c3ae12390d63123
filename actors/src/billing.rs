//! The billing actor: one per process. Live calls report the audio they receive; the actor
//! adds it up per call, writes what is new to the ledger about every 30 s and when a call
//! ends, and answers quota checks counting what is not written yet.
//!
//! Amounts are whole milliseconds derived from whole samples (8 per millisecond at 8 kHz), so
//! the ledger rows of a call add up to exactly the audio it streamed, rounded down to the
//! millisecond once, at the end.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::usage::{
    Account, Allowance, QuotaGate, UsageError, UsageEvent, UsageKind, UsageSink, UsageSource,
};

/// Samples per millisecond of live-call audio (8 kHz).
const SAMPLES_PER_MS: u64 = 8;

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
    /// What is left of the organisation's audio pool, counting audio not yet written.
    Check {
        /// The organisation.
        org_id: String,
        /// The answer.
        reply: RpcReplyPort<Result<Allowance, UsageError>>,
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

/// Ends a call's metering: writes the rest of its usage and logs the outcome. A write that
/// fails stays pending in the actor and is retried at the next flush.
pub async fn end_call(billing: &ActorRef<BillingMsg>, call_id: &str) {
    let call = call_id.to_owned();
    match ractor::call!(billing, |reply| BillingMsg::End { call, reply }) {
        Ok(Ok(ms)) => {
            tracing::info!(call = %call_id, billed_s = ms as f64 / 1000.0, "call billed")
        }
        Ok(Err(e)) => {
            tracing::error!(call = %call_id, error = %e, "call usage not written yet; billing retries")
        }
        Err(e) => tracing::error!(call = %call_id, error = %e, "billing actor unreachable"),
    }
}

/// The actor's arguments.
pub struct BillingArgs {
    /// Where events go (durably).
    pub sink: Arc<dyn UsageSink>,
    /// Where allowances come from.
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
    billed_ms: u64,
    ended: bool,
}

impl Meter {
    fn due_ms(&self) -> u64 {
        self.samples / SAMPLES_PER_MS - self.billed_ms
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
    /// Writes what is due for `calls` (all when `None`); a failed write is kept for the next
    /// flush. Returns the first error.
    async fn flush(&mut self, only: Option<&str>) -> Result<(), UsageError> {
        let now = (self.args.now_ms)();
        let events: Vec<(String, UsageEvent)> = self
            .calls
            .iter()
            .filter(|(id, m)| only.is_none_or(|o| o == id.as_str()) && m.due_ms() > 0)
            .map(|(id, m)| {
                let event = UsageEvent {
                    org_id: m.account.org_id.clone(),
                    key_id: m.account.key_id.clone(),
                    end_user: None,
                    kind: UsageKind::AudioMs,
                    amount: m.due_ms(),
                    source: UsageSource::Callstream,
                    at_ms: now,
                };
                (id.clone(), event)
            })
            .collect();
        let mut first_error = None;
        if !events.is_empty() {
            let sink = self.args.sink.clone();
            // The sink ends in an fsync: keep it off the async workers.
            let results = tokio::task::spawn_blocking(move || {
                events
                    .into_iter()
                    .map(|(id, e)| {
                        let r = sink.record(&e);
                        (id, e.amount, r)
                    })
                    .collect::<Vec<_>>()
            })
            .await
            .map_err(|e| UsageError::Store(format!("billing write task failed: {e}")))?;
            for (id, amount, result) in results {
                match result {
                    Ok(()) => {
                        if let Some(m) = self.calls.get_mut(&id) {
                            m.billed_ms += amount;
                        }
                    }
                    Err(e) => {
                        tracing::error!(call = %id, amount_ms = amount, error = %e,
                            "live-call usage not written; kept for the next flush");
                        first_error.get_or_insert(e);
                    }
                }
            }
        }
        // Ended calls whose usage is all written are done.
        self.calls.retain(|_, m| !(m.ended && m.due_ms() == 0));
        first_error.map_or(Ok(()), Err)
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
                state.calls.insert(
                    call,
                    Meter {
                        account,
                        samples: 0,
                        billed_ms: 0,
                        ended: false,
                    },
                );
            }
            BillingMsg::Audio { call, samples } => {
                if let Some(m) = state.calls.get_mut(&call) {
                    m.samples += samples;
                }
            }
            BillingMsg::Check { org_id, reply } => {
                let pending: u64 = state
                    .calls
                    .values()
                    .filter(|m| m.account.org_id == org_id)
                    .map(Meter::due_ms)
                    .sum();
                let gate = state.args.gate.clone();
                let now = (state.args.now_ms)();
                let answer = tokio::task::spawn_blocking(move || {
                    gate.allowance(&org_id, UsageKind::AudioMs, now)
                })
                .await
                .unwrap_or_else(|e| Err(UsageError::Store(format!("quota task failed: {e}"))))
                .map(|a| match a {
                    Allowance::Remaining(left) => {
                        Allowance::Remaining(left.saturating_sub(pending))
                    }
                    Allowance::Unlimited => Allowance::Unlimited,
                });
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
                // Errors are logged per call inside; the rest is retried next time.
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
    use std::sync::Mutex;

    #[derive(Default)]
    struct Ledger {
        events: Mutex<Vec<UsageEvent>>,
        fail: std::sync::atomic::AtomicBool,
        quota_ms: u64,
    }

    impl UsageSink for Ledger {
        fn record(&self, event: &UsageEvent) -> Result<(), UsageError> {
            if self.fail.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(UsageError::Store("disk full".into()));
            }
            self.events.lock().unwrap().push(event.clone());
            Ok(())
        }
    }

    impl QuotaGate for Ledger {
        fn allowance(&self, _: &str, _: UsageKind, _: i64) -> Result<Allowance, UsageError> {
            let used: u64 = self.events.lock().unwrap().iter().map(|e| e.amount).sum();
            Ok(Allowance::Remaining(self.quota_ms.saturating_sub(used)))
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

    fn account() -> Account {
        Account {
            org_id: "org_a".into(),
            key_id: "cc_1".into(),
        }
    }

    #[tokio::test]
    async fn rows_add_up_to_the_streamed_audio_and_checks_count_unwritten_audio() {
        let ledger = Arc::new(Ledger {
            quota_ms: 10_000,
            ..Ledger::default()
        });
        let billing = start(ledger.clone(), Duration::from_secs(3600)).await;
        let call = "call-1".to_owned();
        billing
            .cast(BillingMsg::Start {
                call: call.clone(),
                account: account(),
            })
            .unwrap();
        for _ in 0..7 {
            // 1601 samples: not a whole number of milliseconds each.
            billing
                .cast(BillingMsg::Audio {
                    call: call.clone(),
                    samples: 1601,
                })
                .unwrap();
        }
        let left = ractor::call!(billing, |reply| BillingMsg::Check {
            org_id: "org_a".into(),
            reply
        })
        .unwrap()
        .unwrap();
        assert_eq!(left, Allowance::Remaining(10_000 - 11_207 / 8));
        billing.cast(BillingMsg::Flush).unwrap();
        billing
            .cast(BillingMsg::Audio {
                call: call.clone(),
                samples: 8000,
            })
            .unwrap();
        let total = ractor::call!(billing, |reply| BillingMsg::End {
            call: call.clone(),
            reply
        })
        .unwrap()
        .unwrap();
        assert_eq!(total, (7 * 1601 + 8000) / 8);
        let events = ledger.events.lock().unwrap().clone();
        assert_eq!(events.len(), 2);
        assert_eq!(events.iter().map(|e| e.amount).sum::<u64>(), total);
        assert!(events
            .iter()
            .all(|e| e.source == UsageSource::Callstream && e.kind == UsageKind::AudioMs));
        billing.stop(None);
    }

    #[tokio::test]
    async fn a_failed_write_is_kept_and_retried() {
        let ledger = Arc::new(Ledger::default());
        let billing = start(ledger.clone(), Duration::from_secs(3600)).await;
        billing
            .cast(BillingMsg::Start {
                call: "c".into(),
                account: account(),
            })
            .unwrap();
        billing
            .cast(BillingMsg::Audio {
                call: "c".into(),
                samples: 80_000,
            })
            .unwrap();
        ledger.fail.store(true, std::sync::atomic::Ordering::SeqCst);
        let first = ractor::call!(billing, |reply| BillingMsg::End {
            call: "c".into(),
            reply
        })
        .unwrap();
        assert!(first.is_err());
        ledger
            .fail
            .store(false, std::sync::atomic::Ordering::SeqCst);
        billing.cast(BillingMsg::Flush).unwrap();
        // A Check after the flush is processed in order: the write has happened by then.
        ractor::call!(billing, |reply| BillingMsg::Check {
            org_id: "org_a".into(),
            reply
        })
        .unwrap()
        .unwrap();
        let amounts: Vec<u64> = ledger
            .events
            .lock()
            .unwrap()
            .iter()
            .map(|e| e.amount)
            .collect();
        assert_eq!(amounts, [10_000]);
        billing.stop(None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_timer_flushes() {
        let ledger = Arc::new(Ledger::default());
        let billing = start(ledger.clone(), Duration::from_secs(30)).await;
        billing
            .cast(BillingMsg::Start {
                call: "c".into(),
                account: account(),
            })
            .unwrap();
        billing
            .cast(BillingMsg::Audio {
                call: "c".into(),
                samples: 800,
            })
            .unwrap();
        let check = || async {
            // A Check is handled after any flush queued before it.
            ractor::call!(billing, |reply| BillingMsg::Check {
                org_id: "org_a".into(),
                reply
            })
            .unwrap()
            .unwrap()
        };
        tokio::time::sleep(Duration::from_secs(29)).await;
        check().await;
        assert!(ledger.events.lock().unwrap().is_empty(), "not before 30 s");
        // Just past the tick, so the flush is queued before the check.
        tokio::time::sleep(Duration::from_millis(1001)).await;
        check().await;
        assert_eq!(ledger.events.lock().unwrap()[0].amount, 100);
        billing.stop(None);
    }
}
