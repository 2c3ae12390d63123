//! Writing the history of live calls without holding them up, and purging what has expired.
//!
//! A call's actor tells [`Recorder`] (a [`CallObserver`]) what happens: it turns each report
//! into an [`Op`] and queues it for one writer task per process, never waiting. The writer
//! takes what is queued, merges consecutive lines of one record into one write, and writes in
//! order; each write is durable when it returns (sled flushes, PostgreSQL commits), so a
//! kill -9 loses what was queued in the last moment, about one write's time. A write the store
//! refuses is tried again (three times, a second apart) and then dropped and counted. The
//! queue is bounded ([`QUEUE`]); when the store is too slow to keep up, reports are dropped and
//! counted rather than held in memory without end.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use callstream_actors::call::{CallEnded, CallInfo, CallObserver, FinalLine};
use parking_lot::Mutex;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::history::{call_record_id, IntentEntry, Line, RecordHead, RecordKind};
use crate::store::{Store, StoreError};

/// Reports queued for the writer at most.
pub const QUEUE: usize = 16_384;
/// Most reports one write pass takes.
const BATCH: usize = 512;
/// Longest text kept per line, bytes (a transcript line is far shorter).
const MAX_LINE_BYTES: usize = 8192;

/// A change to the history.
#[derive(Debug)]
pub enum Op {
    /// A call started (or resumed).
    Begin(Box<RecordHead>),
    /// Final lines of a record.
    Lines {
        /// Owner.
        org_id: String,
        /// Record.
        id: String,
        /// In order.
        lines: Vec<Line>,
    },
    /// An intent update.
    Intent {
        /// Owner.
        org_id: String,
        /// Record.
        id: String,
        /// The update.
        entry: IntentEntry,
    },
    /// A call ended.
    End {
        /// Owner.
        org_id: String,
        /// Record.
        id: String,
        /// Unix ms.
        ended_ms: i64,
        /// How.
        reason: String,
        /// Audio billed by this session, ms.
        billed_ms: u64,
    },
    /// Answered once everything queued before it is written.
    Flush(tokio::sync::oneshot::Sender<()>),
}

/// Counters of the writer, for `/metrics`.
#[derive(Debug, Default)]
pub struct WriterStats {
    /// Reports written.
    pub written: AtomicU64,
    /// Reports dropped: the queue was full, or the store refused them.
    pub dropped: AtomicU64,
}

/// The queue to the writer task.
#[derive(Clone)]
pub struct Writer {
    tx: mpsc::Sender<Op>,
    /// Its counters.
    pub stats: Arc<WriterStats>,
}

impl Writer {
    /// Starts the writer task on the current runtime.
    pub fn spawn(store: Arc<dyn Store>) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        let stats = Arc::new(WriterStats::default());
        tokio::spawn(write(store, rx, stats.clone()));
        Self { tx, stats }
    }

    /// Queues a change; never waits.
    pub fn send(&self, op: Op) {
        if self.tx.try_send(op).is_err() {
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("call history: the writer is behind; a change was dropped");
        }
    }

    /// Waits until everything queued before this call is written (tests, shutdown).
    pub async fn flush(&self) {
        let (done, wait) = tokio::sync::oneshot::channel();
        if self.tx.send(Op::Flush(done)).await.is_ok() {
            let _ = wait.await;
        }
    }
}

async fn apply(store: &dyn Store, op: &Op) -> Result<(), StoreError> {
    match op {
        Op::Begin(head) => store.begin_record(head).await,
        Op::Lines { org_id, id, lines } => store.add_lines(org_id, id, lines).await,
        Op::Intent { org_id, id, entry } => store.add_intent(org_id, id, entry).await,
        Op::End {
            org_id,
            id,
            ended_ms,
            reason,
            billed_ms,
        } => {
            store
                .end_record(org_id, id, *ended_ms, reason, *billed_ms)
                .await
        }
        Op::Flush(_) => Ok(()),
    }
}

/// Merges consecutive lines of one record into one op.
fn merge(batch: Vec<Op>) -> Vec<Op> {
    let mut out: Vec<Op> = Vec::with_capacity(batch.len());
    for op in batch {
        if let (
            Some(Op::Lines {
                org_id: o1,
                id: i1,
                lines: l1,
            }),
            Op::Lines { org_id, id, lines },
        ) = (out.last_mut(), &op)
        {
            if o1 == org_id && i1 == id {
                l1.extend(lines.iter().cloned());
                continue;
            }
        }
        out.push(op);
    }
    out
}

async fn write(store: Arc<dyn Store>, mut rx: mpsc::Receiver<Op>, stats: Arc<WriterStats>) {
    let mut batch = Vec::with_capacity(BATCH);
    while rx.recv_many(&mut batch, BATCH).await > 0 {
        for op in merge(std::mem::take(&mut batch)) {
            if let Op::Flush(done) = op {
                let _ = done.send(());
                continue;
            }
            let mut tries = 0;
            loop {
                match apply(store.as_ref(), &op).await {
                    Ok(()) => {
                        stats.written.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                    Err(e) if tries < 3 => {
                        tries += 1;
                        tracing::warn!(error = %e, "call history: a write failed; trying again");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    Err(e) => {
                        stats.dropped.fetch_add(1, Ordering::Relaxed);
                        tracing::error!(error = %e, "call history: a write failed; dropped");
                        break;
                    }
                }
            }
        }
    }
}

/// Watches live calls for the history, and passes every report on to `next` (the live page).
pub struct Recorder {
    writer: Writer,
    next: Option<Arc<dyn CallObserver>>,
    /// Call id -> (organisation, record id).
    calls: Mutex<HashMap<String, (String, String)>>,
}

impl Recorder {
    /// A recorder writing through `writer`.
    pub fn new(writer: Writer, next: Option<Arc<dyn CallObserver>>) -> Self {
        Self {
            writer,
            next,
            calls: Mutex::new(HashMap::new()),
        }
    }

    fn record_of(&self, call_id: &str) -> Option<(String, String)> {
        self.calls.lock().get(call_id).cloned()
    }
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.chars().take(256).collect())
}

impl CallObserver for Recorder {
    fn opened(&self, call: &CallInfo) {
        let id = call_record_id(&call.org_id, &call.first_session);
        self.calls
            .lock()
            .insert(call.call_id.clone(), (call.org_id.clone(), id.clone()));
        self.writer.send(Op::Begin(Box::new(RecordHead {
            id,
            org_id: call.org_id.clone(),
            kind: RecordKind::Call,
            started_ms: crate::clock::now_ms(),
            ended_ms: None,
            connector: call.connector.clone(),
            conversation_id: non_empty(&call.conversation_id),
            ani: non_empty(&call.ani),
            dnis: non_empty(&call.dnis),
            close_reason: None,
            language: call.language.clone(),
            channels: call.labels.clone(),
            billed_ms: 0,
            file_name: None,
            duration: None,
            intent: None,
            analyses: None,
        })));
        if let Some(n) = &self.next {
            n.opened(call);
        }
    }

    fn transcript(&self, call_id: &str, line: &FinalLine) {
        if let Some((org_id, id)) = self.record_of(call_id) {
            let mut text = line.text.clone();
            if text.len() > MAX_LINE_BYTES {
                let mut end = MAX_LINE_BYTES;
                while !text.is_char_boundary(end) {
                    end -= 1;
                }
                text.truncate(end);
            }
            self.writer.send(Op::Lines {
                org_id,
                id,
                lines: vec![Line {
                    channel: line.channel,
                    offset: line.offset,
                    duration: line.duration,
                    confidence: line.confidence,
                    text,
                }],
            });
        }
        if let Some(n) = &self.next {
            n.transcript(call_id, line);
        }
    }

    fn intent(&self, call_id: &str, result: &Value) {
        if let Some((org_id, id)) = self.record_of(call_id) {
            self.writer.send(Op::Intent {
                org_id,
                id,
                entry: IntentEntry {
                    at_ms: crate::clock::now_ms(),
                    result: result.clone(),
                },
            });
        }
        if let Some(n) = &self.next {
            n.intent(call_id, result);
        }
    }

    fn ended(&self, call_id: &str, end: &CallEnded) {
        if let Some((org_id, id)) = self.calls.lock().remove(call_id) {
            self.writer.send(Op::End {
                org_id,
                id,
                ended_ms: crate::clock::now_ms(),
                reason: end.reason.clone(),
                billed_ms: end.billed_ms,
            });
        }
        if let Some(n) = &self.next {
            n.ended(call_id, end);
        }
    }
}

/// Runs [`purge_expired`](crate::store::archive::purge_expired) every `every`, from the current runtime, for as long as it runs.
pub fn spawn_purge(
    store: Arc<dyn Store>,
    plans: std::collections::BTreeMap<String, crate::config::Plan>,
    every: Duration,
) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match crate::store::archive::purge_expired(
                store.as_ref(),
                &plans,
                crate::clock::now_ms(),
            )
            .await
            {
                Ok(0) => {}
                Ok(n) => tracing::info!(erased = n, "call history: expired records purged"),
                Err(e) => tracing::warn!(error = %e, "call history: purge failed"),
            }
        }
    });
}
