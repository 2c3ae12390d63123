//! The ASR worker pool: a fixed set of OS threads, each owning one engine, fed through two
//! bounded crossbeam queues.
//!
//! - Priority: a worker always takes live-call work before file work.
//! - Batching: a worker that picks up file work also takes whatever other file work is already
//!   queued for the same language and the same window ([`AsrEngine::window`]), up to
//!   `max_batch`, and decodes it in one engine call; the first job that does not fit starts the
//!   worker's next batch. Since batch mates never change a job's window, a file is transcribed
//!   the same way however its utterances were queued. On
//!   the telephone set that gained 4-6% throughput (`callstream bench asr`). Live work is
//!   batched the same way up to `live_batch` (each call's utterance its own item); since every
//!   utterance of a batch finishes when the whole batch does, the default is 1: one at a time,
//!   which kept p95 end-of-speech latency lower at 12 and 16 calls (docs/benchmarks.md).
//! - A worker kept for live work: while live calls are in progress ([`AsrPool::live_call`]),
//!   at most `workers - 1` workers decode file work at once, so a live utterance finds a free
//!   worker instead of waiting behind a batch of file windows. The file still finishes, on the
//!   other workers; with one worker nothing is kept (the file would never finish).
//! - Load: how much live audio waits and how long live utterances recently waited for a worker
//!   ([`LiveLoad`]), which admission control reads before it takes a new call.
//! - Backpressure: live work is never waited on: [`AsrPool::submit_live`] fails at once with
//!   [`AsrError::Unavailable`] when the live queue is full, and the caller decides (the call
//!   pipeline counts and logs the dropped utterance). File work waits for room
//!   ([`AsrPool::submit_file`] blocks), which slows the file reader instead of growing memory.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Select, Sender, TryRecvError, TrySendError};

use super::load::LiveLoad;
use super::{AsrEngine, AsrError, Transcript};

/// Pool settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolConfig {
    /// Worker threads, one engine each.
    pub workers: usize,
    /// Most file utterances decoded in one engine call.
    pub max_batch: usize,
    /// Most live utterances (of any calls) decoded in one engine call; 1 decodes each alone.
    pub live_batch: usize,
    /// Capacity of the live queue.
    pub live_queue: usize,
    /// Capacity of the file queue.
    pub file_queue: usize,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            workers: 2,
            max_batch: 4,
            live_batch: 1,
            live_queue: 64,
            file_queue: 16,
        }
    }
}

/// Where a job's result goes. Called on the worker thread, so it must be quick (send on a
/// channel, complete a oneshot).
pub type Reply = Box<dyn FnOnce(Result<Transcript, AsrError>) + Send>;

/// One utterance to recognise.
pub struct Job {
    /// 16 kHz mono, at most 30 s.
    pub audio: Vec<f32>,
    /// Language code.
    pub language: String,
    /// Receives the result.
    pub reply: Reply,
    /// Set when nobody wants the result any more (a file whose client went away): the job is
    /// skipped, answered with [`AsrError::Unavailable`].
    pub cancel: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
}

impl Job {
    /// Milliseconds of audio (16 kHz).
    fn audio_ms(&self) -> u64 {
        self.audio.len() as u64 / 16
    }

    fn cancelled(&self) -> bool {
        self.cancel
            .as_ref()
            .is_some_and(|c| c.load(Ordering::Relaxed))
    }
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("samples", &self.audio.len())
            .field("language", &self.language)
            .finish()
    }
}

/// A job in a queue, with when it was queued.
struct Queued {
    job: Job,
    at: Instant,
}

impl Queued {
    fn now(job: Job) -> Self {
        Self {
            job,
            at: Instant::now(),
        }
    }
}

/// A live job the pool did not take.
#[derive(Debug)]
pub struct LiveRefused {
    /// The job, untouched.
    pub job: Job,
    /// True when the pool has stopped (it will never take it); false when its queue is full.
    pub stopped: bool,
}

impl From<LiveRefused> for AsrError {
    fn from(r: LiveRefused) -> Self {
        AsrError::Unavailable(if r.stopped {
            "pool stopped".into()
        } else {
            "live transcription queue is full".into()
        })
    }
}

/// Counters of the pool, for logs and metrics.
#[derive(Debug, Default)]
pub struct PoolStats {
    /// Utterances recognised.
    pub utterances: AtomicU64,
    /// Engine calls made.
    pub batches: AtomicU64,
    /// Live jobs refused because the live queue was full.
    pub live_rejected: AtomicU64,
    /// Audio recognised, in milliseconds.
    pub audio_ms: AtomicU64,
    /// Time spent in engine calls, in milliseconds.
    pub busy_ms: AtomicU64,
    /// Workers currently in an engine call.
    pub busy_workers: AtomicUsize,
    /// The live queue's backlog and recent waits.
    pub live_load: LiveLoad,
    /// Live calls in progress (see [`AsrPool::live_call`]).
    pub live_calls: AtomicUsize,
    /// Time spent in engine calls on live utterances, in milliseconds.
    pub live_busy_ms: AtomicU64,
    /// Seconds of live calls served, summed over calls (see [`PoolStats::call_secs`]).
    call_clock: parking_lot::Mutex<CallClock>,
    /// Workers decoding file work now.
    file_busy: AtomicUsize,
}

impl PoolStats {
    /// Seconds of live calls served until `now`, summed over calls: with the engine time of
    /// live utterances, what one call costs the speech workers here.
    pub fn call_secs(&self, now: Instant) -> f64 {
        self.call_clock.lock().secs(now)
    }

    fn calls_changed(&self, by: isize) {
        self.call_clock.lock().change(Instant::now(), by);
    }
}

/// Live calls in progress over time, summed.
#[derive(Debug)]
struct CallClock {
    /// When `calls` last changed.
    since: Instant,
    calls: usize,
    /// Call seconds until `since`.
    secs: f64,
}

impl Default for CallClock {
    fn default() -> Self {
        Self {
            since: Instant::now(),
            calls: 0,
            secs: 0.0,
        }
    }
}

impl CallClock {
    fn secs(&self, now: Instant) -> f64 {
        self.secs + self.calls as f64 * now.saturating_duration_since(self.since).as_secs_f64()
    }

    fn change(&mut self, now: Instant, by: isize) {
        self.secs = self.secs(now);
        self.since = now;
        self.calls = self.calls.saturating_add_signed(by);
    }
}

/// A live call in progress, as the pool counts it; dropping it ends the count.
#[derive(Debug)]
pub struct LiveCallMark(Arc<PoolStats>);

impl Drop for LiveCallMark {
    fn drop(&mut self) {
        self.0.live_calls.fetch_sub(1, Ordering::AcqRel);
        self.0.calls_changed(-1);
    }
}

/// How often a worker kept for live work looks again whether it may take file work (a call
/// ended, or another worker's file batch finished).
const KEPT_RECHECK: Duration = Duration::from_millis(50);

/// Which workers may take file work now.
#[derive(Debug, Clone, Copy)]
struct FileRule {
    /// Workers in the pool.
    workers: usize,
}

impl FileRule {
    /// How many workers may decode file work at once now.
    fn limit(self, stats: &PoolStats) -> usize {
        if self.workers > 1 && stats.live_calls.load(Ordering::Acquire) > 0 {
            self.workers - 1
        } else {
            self.workers
        }
    }

    /// Claims a place for file work, if the rule leaves one.
    fn claim(self, stats: &PoolStats) -> bool {
        let limit = self.limit(stats);
        stats
            .file_busy
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |busy| {
                (busy < limit).then_some(busy + 1)
            })
            .is_ok()
    }

    fn release(self, stats: &PoolStats) {
        stats.file_busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A snapshot of the pool's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSnapshot {
    /// Live jobs waiting.
    pub live_queued: usize,
    /// File jobs waiting.
    pub file_queued: usize,
    /// Workers in an engine call.
    pub busy_workers: usize,
    /// Utterances recognised.
    pub utterances: u64,
    /// Engine calls made.
    pub batches: u64,
    /// Live jobs refused.
    pub live_rejected: u64,
}

/// The running pool. Dropping it lets the workers finish queued work and joins them.
pub struct AsrPool {
    live: Option<Sender<Queued>>,
    file: Option<Sender<Queued>>,
    live_rx: Receiver<Queued>,
    file_rx: Receiver<Queued>,
    workers: Vec<JoinHandle<()>>,
    stats: Arc<PoolStats>,
}

impl std::fmt::Debug for AsrPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsrPool")
            .field("workers", &self.workers.len())
            .finish()
    }
}

impl AsrPool {
    /// Starts `config.workers` threads, each with an engine made by `make_engine(worker index)`
    /// on that thread. Returns once every engine has loaded, or the first load error.
    pub fn start<F>(config: PoolConfig, make_engine: F) -> Result<Self, AsrError>
    where
        F: Fn(usize) -> Result<Box<dyn AsrEngine>, AsrError> + Send + Sync + 'static,
    {
        let (live_tx, live_rx) = bounded::<Queued>(config.live_queue.max(1));
        let (file_tx, file_rx) = bounded::<Queued>(config.file_queue.max(1));
        let stats = Arc::new(PoolStats::default());
        let make_engine = Arc::new(make_engine);
        let (ready_tx, ready_rx) = bounded::<Result<(), AsrError>>(config.workers.max(1));
        let mut workers = Vec::new();
        for index in 0..config.workers.max(1) {
            let (live_rx, file_rx, stats) = (live_rx.clone(), file_rx.clone(), stats.clone());
            let (make_engine, ready_tx) = (make_engine.clone(), ready_tx.clone());
            let max_batch = config.max_batch.max(1);
            let live_batch = config.live_batch.max(1);
            let rule = FileRule {
                workers: config.workers.max(1),
            };
            let handle = std::thread::Builder::new()
                .name(format!("asr-{index}"))
                .spawn(move || match make_engine(index) {
                    Ok(engine) => {
                        let _ = ready_tx.send(Ok(()));
                        drop(ready_tx);
                        work(
                            engine, &live_rx, &file_rx, max_batch, live_batch, rule, &stats,
                        );
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                })
                .map_err(|e| AsrError::Unavailable(format!("cannot start a worker thread: {e}")))?;
            workers.push(handle);
        }
        drop(ready_tx);
        let pool = Self {
            live: Some(live_tx),
            file: Some(file_tx),
            live_rx,
            file_rx,
            workers,
            stats,
        };
        for _ in 0..pool.workers.len() {
            match ready_rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(AsrError::Unavailable("a worker died while loading".into())),
            }
        }
        Ok(pool)
    }

    /// Queues live-call work; when the live queue is full (or the pool stopped) it fails at
    /// once and hands the job back, so the caller decides whether to hold, retry or drop it.
    pub fn submit_live(&self, job: Job) -> Result<(), LiveRefused> {
        let sender = self.live.as_ref().expect("senders live until drop");
        let load = &self.stats.live_load;
        let audio_ms = job.audio_ms();
        // Counted before it is sent, so a worker never takes what was not counted.
        load.queued(audio_ms);
        let refused = match sender.try_send(Queued::now(job)) {
            Ok(()) => return Ok(()),
            Err(TrySendError::Full(queued)) => {
                self.stats.live_rejected.fetch_add(1, Ordering::Relaxed);
                LiveRefused {
                    job: queued.job,
                    stopped: false,
                }
            }
            Err(TrySendError::Disconnected(queued)) => LiveRefused {
                job: queued.job,
                stopped: true,
            },
        };
        load.unqueued(audio_ms);
        Err(refused)
    }

    /// Queues file work, waiting while the file queue is full. Call it from a blocking context.
    pub fn submit_file(&self, job: Job) -> Result<(), AsrError> {
        let sender = self.file.as_ref().expect("senders live until drop");
        sender
            .send(Queued::now(job))
            .map_err(|_| AsrError::Unavailable("pool stopped".into()))
    }

    /// Counts a live call in progress until the mark is dropped: while any is, one worker is
    /// kept for live work.
    pub fn live_call(&self) -> LiveCallMark {
        self.stats.live_calls.fetch_add(1, Ordering::AcqRel);
        self.stats.calls_changed(1);
        LiveCallMark(self.stats.clone())
    }

    /// Worker threads.
    pub fn workers(&self) -> usize {
        self.workers.len()
    }

    /// The counters.
    pub fn stats(&self) -> &PoolStats {
        &self.stats
    }

    /// A snapshot of queues and counters.
    pub fn snapshot(&self) -> PoolSnapshot {
        PoolSnapshot {
            live_queued: self.live_rx.len(),
            file_queued: self.file_rx.len(),
            busy_workers: self.stats.busy_workers.load(Ordering::Relaxed),
            utterances: self.stats.utterances.load(Ordering::Relaxed),
            batches: self.stats.batches.load(Ordering::Relaxed),
            live_rejected: self.stats.live_rejected.load(Ordering::Relaxed),
        }
    }
}

impl Drop for AsrPool {
    fn drop(&mut self) {
        self.live.take();
        self.file.take();
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}

/// Takes the next job: live first, then file work when `rule` leaves this worker a place for
/// it (claimed for it: the caller releases it after the decode); when there is neither, waits.
/// `None` once both queues are closed and empty.
fn next_job(
    live: &Receiver<Queued>,
    file: &Receiver<Queued>,
    rule: FileRule,
    stats: &PoolStats,
) -> Option<(Queued, bool)> {
    loop {
        let from_live = live.try_recv();
        if let Ok(job) = from_live {
            return Some((job, true));
        }
        let may_file = rule.claim(stats);
        if may_file {
            match file.try_recv() {
                Ok(job) => return Some((job, false)),
                Err(e) => {
                    rule.release(stats);
                    if matches!(from_live, Err(TryRecvError::Disconnected))
                        && e == TryRecvError::Disconnected
                    {
                        return None;
                    }
                }
            }
        }
        let mut select = Select::new();
        select.recv(live);
        if may_file {
            select.recv(file);
            select.ready();
        } else {
            kept_for_live(live);
        }
    }
}

/// A worker kept for live work waits for it, and looks again soon whether it may take file
/// work (a call ended, or another worker's file batch finished).
fn kept_for_live(live: &Receiver<Queued>) {
    let mut select = Select::new();
    select.recv(live);
    if select.ready_timeout(KEPT_RECHECK).is_ok() && live.is_empty() {
        // Ready yet empty: closed (the pool is stopping), or another worker took the job.
        // Either way, not a reason to spin.
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn work(
    mut engine: Box<dyn AsrEngine>,
    live: &Receiver<Queued>,
    file: &Receiver<Queued>,
    max_batch: usize,
    live_batch: usize,
    rule: FileRule,
    stats: &PoolStats,
) {
    // A job taken while filling a batch that it cannot join (and whether it is live): it
    // starts the next one.
    let mut carried: Option<(Queued, bool)> = None;
    loop {
        let (first, is_live) = match carried.take() {
            // A live job taken from the live queue is that queue's next.
            Some((job, true)) => (job, true),
            // Live work still goes first, and the carried file job needs a file place too.
            Some((job, false)) => match live.try_recv() {
                Ok(urgent) => {
                    carried = Some((job, false));
                    (urgent, true)
                }
                Err(_) if rule.claim(stats) => (job, false),
                Err(_) => {
                    carried = Some((job, false));
                    kept_for_live(live);
                    continue;
                }
            },
            None => match next_job(live, file, rule, stats) {
                Some(next) => next,
                None => break,
            },
        };
        let (queue, limit) = if is_live {
            (live, live_batch)
        } else {
            (file, max_batch)
        };
        let taken = |queued: &Queued| {
            if is_live {
                let now = Instant::now();
                let waited = now.saturating_duration_since(queued.at);
                let calls = stats.live_calls.load(Ordering::Acquire);
                stats
                    .live_load
                    .taken(queued.job.audio_ms(), waited, now, calls);
            }
        };
        taken(&first);
        let first = first.job;
        // Only jobs of one language and one window share a decode, so a job is read the same
        // whatever it was queued with.
        let window = engine.window(first.audio.len());
        let mut batch = vec![first];
        while batch.len() < limit {
            match queue.try_recv() {
                Ok(queued)
                    if queued.job.language == batch[0].language
                        && engine.window(queued.job.audio.len()) == window =>
                {
                    taken(&queued);
                    batch.push(queued.job)
                }
                Ok(queued) => {
                    carried = Some((queued, is_live));
                    break;
                }
                Err(_) => break,
            }
        }
        run(&mut *engine, batch, stats, is_live);
        if !is_live {
            rule.release(stats);
        }
    }
}

fn run(engine: &mut dyn AsrEngine, jobs: Vec<Job>, stats: &PoolStats, live: bool) {
    let (cancelled, jobs): (Vec<Job>, Vec<Job>) = jobs.into_iter().partition(Job::cancelled);
    for job in cancelled {
        (job.reply)(Err(AsrError::Unavailable("cancelled".into())));
    }
    let Some(language) = jobs.first().map(|j| j.language.clone()) else {
        return;
    };
    stats.busy_workers.fetch_add(1, Ordering::Relaxed);
    let started = Instant::now();
    let audio: Vec<&[f32]> = jobs.iter().map(|j| j.audio.as_slice()).collect();
    let result = engine.transcribe(&audio, &language);
    let audio_ms: u64 = jobs.iter().map(Job::audio_ms).sum();
    let busy = started.elapsed().as_millis() as u64;
    stats.busy_ms.fetch_add(busy, Ordering::Relaxed);
    if live {
        stats.live_busy_ms.fetch_add(busy, Ordering::Relaxed);
    }
    stats.busy_workers.fetch_sub(1, Ordering::Relaxed);
    stats.batches.fetch_add(1, Ordering::Relaxed);
    stats
        .utterances
        .fetch_add(jobs.len() as u64, Ordering::Relaxed);
    stats.audio_ms.fetch_add(audio_ms, Ordering::Relaxed);
    match result {
        Ok(transcripts) if transcripts.len() == jobs.len() => {
            for (job, t) in jobs.into_iter().zip(transcripts) {
                (job.reply)(Ok(t));
            }
        }
        Ok(transcripts) => {
            let message = format!(
                "engine returned {} transcripts for {} utterances",
                transcripts.len(),
                jobs.len()
            );
            for job in jobs {
                (job.reply)(Err(AsrError::Engine(message.clone())));
            }
        }
        Err(e) => {
            let message = e.to_string();
            for job in jobs {
                (job.reply)(Err(AsrError::Engine(message.clone())));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_seconds_sum_the_calls_in_progress_over_time() {
        let t0 = Instant::now();
        let s = |secs: u64| t0 + Duration::from_secs(secs);
        let mut clock = CallClock {
            since: t0,
            calls: 0,
            secs: 0.0,
        };
        // One call from 0 s, a second from 10 s, the first ends at 30 s.
        clock.change(s(0), 1);
        clock.change(s(10), 1);
        assert_eq!(clock.secs(s(20)), 30.0);
        clock.change(s(30), -1);
        assert_eq!(clock.secs(s(30)), 50.0);
        assert_eq!(clock.secs(s(40)), 60.0);
        // None in progress: nothing more is counted, and never fewer than none.
        clock.change(s(40), -1);
        clock.change(s(45), -1);
        assert_eq!(clock.calls, 0);
        assert_eq!(clock.secs(s(100)), 60.0);
    }
}
