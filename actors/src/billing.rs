//! The billing actor: one per process. Live calls report the audio they receive; the actor
//! adds it up per call and writes every call's running total to the ledger about once a second
//! (one flush to disk for all calls in progress), and once more when a call ends. A crash loses
//! at most the audio since the last write.
//!
//! Calls stream against leases: before it serves audio a call takes a slice of the
//! organisation's audio pool ([`BillingMsg::Lease`]) and asks for the next one ahead of need;
//! an organisation with nothing left gets no slice. A lease is a reservation in the
//! [`QuotaGate`], handed back as the audio it covers reaches the ledger or when the call ends.
//!
//! Nothing the actor does waits on the store inside its handler: a write goes to a task of its
//! own, one at a time, which reports back by message ([`BillingMsg::Written`]), and so does
//! each reservation ([`BillingMsg::Granted`]). A slow disk or database therefore delays only
//! the answers that depend on it, never another call's lease or audio.
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

/// Where the answer to a [`BillingMsg::Lease`] goes: called once with the milliseconds
/// granted, or why none could be.
pub struct LeaseReply(Box<dyn FnOnce(Result<u64, UsageError>) + Send>);

impl LeaseReply {
    /// A reply that calls `f`.
    pub fn new(f: impl FnOnce(Result<u64, UsageError>) + Send + 'static) -> Self {
        Self(Box::new(f))
    }

    fn send(self, answer: Result<u64, UsageError>) {
        (self.0)(answer);
    }
}

impl std::fmt::Debug for LeaseReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LeaseReply")
    }
}

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
    /// A call asks for another slice of the audio pool. Answered by `reply` with the
    /// milliseconds granted: up to `want_ms`, zero when nothing is left (or the call is not
    /// metered).
    Lease {
        /// Call id.
        call: String,
        /// Milliseconds of audio wanted.
        want_ms: u64,
        /// The answer.
        reply: LeaseReply,
    },
    /// The call ended: write the rest and forget it. Answers the call's total, in ms, once it
    /// is written.
    End {
        /// Call id.
        call: String,
        /// Total milliseconds billed for the call, or why the last write failed.
        reply: RpcReplyPort<Result<u64, UsageError>>,
    },
    /// Write what is new for every call (sent by the actor's own timer).
    Flush,
    /// A reservation asked for by [`BillingMsg::Lease`] came back (sent by the actor's task).
    Granted {
        /// Call id.
        call: String,
        /// Whose pool it was reserved from.
        org: String,
        /// Milliseconds reserved, or why not.
        answer: Result<u64, UsageError>,
        /// Where the call's answer goes.
        reply: LeaseReply,
    },
    /// A write came back (sent by the writer task).
    Written {
        /// What it wrote per call.
        rows: Vec<WrittenRow>,
        /// Whether it did.
        outcome: Result<(), UsageError>,
    },
}

/// One call's part of a write.
#[derive(Debug, Clone)]
pub struct WrittenRow {
    call: String,
    at_ms: i64,
    total: u64,
    due: u64,
    give_back: u64,
}

/// How long a call waits for the billing actor's answer to its end before it gives up on it.
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

/// Asks for another slice of the audio pool for `call_id` and waits for the answer (for
/// callers that have nothing else to do meanwhile; a call's supervisor asks by message).
pub async fn lease(
    billing: &ActorRef<BillingMsg>,
    call_id: &str,
    want_ms: u64,
) -> Result<u64, UsageError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    billing
        .cast(BillingMsg::Lease {
            call: call_id.to_owned(),
            want_ms,
            reply: LeaseReply::new(move |answer| {
                let _ = tx.send(answer);
            }),
        })
        .map_err(|e| UsageError::Store(format!("billing is not running: {e}")))?;
    rx.await
        .map_err(|_| UsageError::Store("billing did not answer".into()))?
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
    /// A write is in flight (one at a time, so rows are written in order).
    writing: bool,
    /// Something asked for a write while one was in flight: another follows it.
    again: bool,
    /// Ended calls waiting for their last write, with whoever waits for it.
    ends: Vec<(String, RpcReplyPort<Result<u64, UsageError>>)>,
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

    /// The running totals of the calls that grew, as ledger rows, and what each row gives
    /// back of its call's lease.
    fn due_rows(&self) -> (Vec<UsageEvent>, Vec<WrittenRow>) {
        let now = (self.args.now_ms)();
        let mut rows = Vec::new();
        let mut written = Vec::new();
        for (id, m) in &self.calls {
            if m.due_ms() == 0 {
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
            written.push(WrittenRow {
                call: id.clone(),
                at_ms,
                total: before + due,
                due,
                give_back: due.min(m.outstanding_ms()),
            });
        }
        (rows, written)
    }

    /// Writes `rows` (and gives back their leases) in one step.
    async fn write(
        sink: &dyn UsageSink,
        gate: &dyn QuotaGate,
        rows: &[UsageEvent],
        written: &[WrittenRow],
    ) -> Result<(), UsageError> {
        let release: Vec<(&str, u64)> = rows
            .iter()
            .zip(written)
            .filter(|(_, w)| w.give_back > 0)
            .map(|(row, w)| (row.org_id.as_str(), w.give_back))
            .collect();
        // The gate's store keeps its blocking writes (an fsync) off the async workers.
        gate.checkpoint(sink, rows, &release).await
    }

    /// Starts a write of what is due, on the writer task; after the one in flight, if any.
    fn flush(&mut self, myself: &ActorRef<BillingMsg>) {
        if self.writing {
            self.again = true;
            return;
        }
        self.again = false;
        let (rows, written) = self.due_rows();
        if rows.is_empty() {
            self.settled(&Ok(()));
            return;
        }
        self.writing = true;
        let sink = self.args.sink.clone();
        let gate = self.args.gate.clone();
        let me = myself.clone();
        tokio::spawn(async move {
            let outcome = Self::write(sink.as_ref(), gate.as_ref(), &rows, &written).await;
            if let Err(e) = me.cast(BillingMsg::Written {
                rows: written,
                outcome,
            }) {
                // The actor has stopped; it wrote what was left itself when it did.
                tracing::debug!(error = %e, "a usage write finished after billing stopped");
            }
        });
    }

    /// A write came back: what it wrote is billed and its leases given back.
    fn written(&mut self, rows: Vec<WrittenRow>, outcome: &Result<(), UsageError>) {
        match outcome {
            Ok(()) => {
                for w in rows {
                    if let Some(m) = self.calls.get_mut(&w.call) {
                        m.row_at_ms = w.at_ms;
                        m.row_ms = w.total;
                        m.billed_ms += w.due;
                        m.released_ms += w.give_back;
                    }
                }
            }
            Err(e) => {
                tracing::error!(calls = rows.len(), error = %e,
                    "live-call usage not written; kept for the next flush");
            }
        }
    }

    /// Answers the ends whose calls are written (or whose write failed), and forgets the ended
    /// calls that are: what is left of their lease goes back.
    fn settled(&mut self, outcome: &Result<(), UsageError>) {
        let calls = &self.calls;
        let mut waiting = Vec::new();
        for (call, reply) in self.ends.drain(..) {
            match calls.get(&call) {
                Some(m) if m.due_ms() > 0 => match outcome {
                    Err(e) => {
                        let _ = reply.send(Err(e.clone()));
                    }
                    Ok(()) => waiting.push((call, reply)),
                },
                Some(m) => {
                    let _ = reply.send(Ok(m.samples / SAMPLES_PER_MS));
                }
                None => {
                    let _ = reply.send(Ok(0));
                }
            }
        }
        if !waiting.is_empty() {
            // Audio counted after the write began: one more write covers it.
            self.again = true;
        }
        self.ends = waiting;
        let gate = self.args.gate.clone();
        self.calls.retain(|_, m| {
            let done = m.ended && m.due_ms() == 0;
            if done {
                Self::release(gate.as_ref(), m, u64::MAX);
            }
            !done
        });
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
            writing: false,
            again: false,
            ends: Vec::new(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
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
                    reply.send(Ok(0));
                    return Ok(());
                };
                let now = (state.args.now_ms)();
                let gate = state.args.gate.clone();
                let me = myself.clone();
                tokio::spawn(async move {
                    let answer = gate
                        .reserve(&org_id, UsageKind::AudioMs, want_ms, now)
                        .await;
                    let granted = answer.as_ref().ok().copied();
                    // The call is answered by the actor, once the grant is recorded.
                    if let Err(e) = me.cast(BillingMsg::Granted {
                        call,
                        org: org_id.clone(),
                        answer,
                        reply,
                    }) {
                        // Billing has stopped: nothing will serve this lease; give it back.
                        tracing::debug!(error = %e, "a lease came back after billing stopped");
                        if let Some(ms) = granted.filter(|ms| *ms > 0) {
                            gate.release(&org_id, UsageKind::AudioMs, ms);
                        }
                    }
                });
            }
            BillingMsg::Granted {
                call,
                org,
                answer,
                reply,
            } => match answer {
                Ok(granted) => match state.calls.get_mut(&call).filter(|m| !m.ended) {
                    Some(m) => {
                        m.leased_ms += granted;
                        reply.send(Ok(granted));
                    }
                    None => {
                        // The call ended meanwhile: the slice goes back at once.
                        if granted > 0 {
                            state.args.gate.release(&org, UsageKind::AudioMs, granted);
                        }
                        reply.send(Ok(0));
                    }
                },
                Err(e) => reply.send(Err(e)),
            },
            BillingMsg::End { call, reply } => match state.calls.get_mut(&call) {
                Some(m) => {
                    m.ended = true;
                    state.ends.push((call, reply));
                    state.flush(&myself);
                }
                // Not metered here: answered once the write in flight, if any, is done.
                None if state.writing => state.ends.push((call, reply)),
                None => {
                    let _ = reply.send(Ok(0));
                }
            },
            BillingMsg::Flush => state.flush(&myself),
            BillingMsg::Written { rows, outcome } => {
                state.writing = false;
                state.written(rows, &outcome);
                state.settled(&outcome);
                if state.again {
                    state.flush(&myself);
                }
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // What is due is written here, before the actor is gone (a write in flight covers the
        // rows it took; these are written again over them, as running totals are).
        let (rows, mut written) = state.due_rows();
        if state.writing {
            // The write in flight gives back its rows' leases; these give back nothing.
            for w in &mut written {
                w.give_back = 0;
            }
        }
        if !rows.is_empty() {
            let outcome = BillingState::write(
                state.args.sink.as_ref(),
                state.args.gate.as_ref(),
                &rows,
                &written,
            )
            .await;
            state.written(written, &outcome);
        }
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

    /// Waits for the write in flight, if any: the end of a call that does not exist is
    /// answered once nothing is being written.
    async fn written(billing: &ActorRef<BillingMsg>) {
        assert_eq!(end(billing, "no such call").await.unwrap(), 0);
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
        written(&billing).await;
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
        written(&billing).await;
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
        written(&billing).await;
        assert_eq!(ledger.billed(), 0, "not before the period");
        tokio::time::sleep(Duration::from_millis(101)).await;
        written(&billing).await;
        assert_eq!(ledger.billed(), 100);
        audio(&billing, "c", 800);
        tokio::time::sleep(Duration::from_secs(1)).await;
        written(&billing).await;
        assert_eq!(ledger.billed(), 200);
        billing.stop(None);
    }
}
