//! The ASR worker pool's rules, on the scripted engine: live work before file work, file work
//! batched by language and window, a full live queue refusing at once and handing the job
//! back, load errors reported. A closed gate holds the worker in a decode, so what is queued
//! meanwhile is known exactly; nothing here depends on timing.

use parking_lot::Mutex;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use callstream_actors::asr::pool::{AsrPool, Job, PoolConfig};
use callstream_actors::asr::scripted::{Gate, ScriptedEngine};
use callstream_actors::asr::AsrError;

/// A pool of one worker on a scripted engine held at `gate`.
fn pool(gate: &Gate, config: PoolConfig) -> (AsrPool, ScriptedEngine) {
    let engine = ScriptedEngine::default().with_gate(gate.clone());
    (pool_of(&engine, config), engine)
}

/// A pool whose workers are clones of `engine`.
fn pool_of(engine: &ScriptedEngine, config: PoolConfig) -> AsrPool {
    let made = engine.clone();
    AsrPool::start(config, move |_| Ok(made.boxed())).unwrap()
}

fn one_worker(live_queue: usize) -> PoolConfig {
    PoolConfig {
        workers: 1,
        max_batch: 4,
        live_batch: 1,
        live_queue,
        file_queue: 16,
    }
}

/// An engine held by `gate` that reads utterances in 2 s windows, as Whisper pads them.
fn two_second_windows(gate: &Gate) -> ScriptedEngine {
    ScriptedEngine::default()
        .with_gate(gate.clone())
        .with_windows(32_000)
}

/// Records the order in which jobs finish.
#[derive(Clone)]
struct Order {
    done: Arc<Mutex<Vec<&'static str>>>,
    tx: mpsc::Sender<()>,
}

impl Order {
    fn new() -> (Self, mpsc::Receiver<()>) {
        let (tx, rx) = mpsc::channel();
        (
            Self {
                done: Arc::default(),
                tx,
            },
            rx,
        )
    }

    fn job(&self, name: &'static str, language: &str) -> Job {
        self.job_of(name, language, 1.0)
    }

    fn job_of(&self, name: &'static str, language: &str, secs: f64) -> Job {
        let this = self.clone();
        Job {
            audio: vec![0.1; (16_000.0 * secs) as usize],
            language: language.to_owned(),
            reply: Box::new(move |r| {
                r.unwrap();
                this.done.lock().push(name);
                this.tx.send(()).unwrap();
            }),
            cancel: None,
        }
    }
}

fn wait(rx: &mpsc::Receiver<()>, n: usize) {
    for _ in 0..n {
        rx.recv_timeout(Duration::from_secs(60)).unwrap();
    }
}

#[test]
fn live_work_is_served_before_file_work_and_file_work_is_batched() {
    let gate = Gate::closed();
    let (pool, engine) = pool(&gate, one_worker(4));
    let (order, rx) = Order::new();
    // The one worker takes the first file job and is held in it; meanwhile more file work and
    // then live work queue up.
    pool.submit_file(order.job("file-0", "en")).unwrap();
    assert!(gate.wait_arrived(1, Duration::from_secs(60)));
    pool.submit_file(order.job("file-1", "en")).unwrap();
    pool.submit_file(order.job("file-2", "en")).unwrap();
    pool.submit_live(order.job("live-0", "en")).unwrap();
    gate.open();
    wait(&rx, 4);
    assert_eq!(*order.done.lock(), ["file-0", "live-0", "file-1", "file-2"]);
    let snap = pool.snapshot();
    assert_eq!(snap.utterances, 4);
    assert_eq!(
        snap.batches, 3,
        "file-1 and file-2 share a decode: {snap:?}"
    );
    assert_eq!(engine.decoded(), 4);
}

#[test]
fn file_work_of_another_language_is_decoded_on_its_own() {
    let gate = Gate::closed();
    let (pool, _) = pool(&gate, one_worker(4));
    let (order, rx) = Order::new();
    pool.submit_file(order.job("en-0", "en")).unwrap();
    assert!(gate.wait_arrived(1, Duration::from_secs(60)));
    for (name, language) in [("en-1", "en"), ("de-0", "de"), ("en-2", "en")] {
        pool.submit_file(order.job(name, language)).unwrap();
    }
    gate.open();
    wait(&rx, 4);
    assert_eq!(*order.done.lock(), ["en-0", "en-1", "de-0", "en-2"]);
    assert_eq!(pool.snapshot().batches, 4);
}

#[test]
fn only_file_work_of_one_window_shares_a_decode() {
    // An engine that reads utterances in 2 s windows (as Whisper pads them): batched with a
    // longer one, an utterance would be read in the longer window, so it never is.
    let gate = Gate::closed();
    let engine = two_second_windows(&gate);
    let pool = pool_of(&engine, one_worker(4));
    let (order, rx) = Order::new();
    pool.submit_file(order.job_of("short-0", "en", 1.0))
        .unwrap();
    assert!(gate.wait_arrived(1, Duration::from_secs(60)));
    for (name, secs) in [
        ("short-1", 1.5),
        ("short-2", 2.0),
        ("long-0", 3.0),
        ("long-1", 4.0),
        ("short-3", 0.5),
    ] {
        pool.submit_file(order.job_of(name, "en", secs)).unwrap();
    }
    gate.open();
    // A refused batch would fail its jobs (the replies unwrap) and leave this waiting.
    wait(&rx, 6);
    assert_eq!(
        *order.done.lock(),
        ["short-0", "short-1", "short-2", "long-0", "long-1", "short-3"]
    );
    // The job that did not fit started the next batch: [short-0], [short-1, short-2],
    // [long-0, long-1], [short-3].
    assert_eq!(pool.snapshot().batches, 4);
    assert_eq!(engine.decoded(), 6);
}

#[test]
fn waiting_live_work_of_one_window_is_decoded_together_and_still_before_file_work() {
    let gate = Gate::closed();
    let engine = two_second_windows(&gate);
    let pool = pool_of(
        &engine,
        PoolConfig {
            live_batch: 2,
            ..one_worker(8)
        },
    );
    let (order, rx) = Order::new();
    pool.submit_file(order.job("file-0", "en")).unwrap();
    assert!(gate.wait_arrived(1, Duration::from_secs(60)));
    pool.submit_file(order.job("file-1", "en")).unwrap();
    for (name, secs) in [
        ("live-0", 1.0),
        ("live-1", 1.5),
        ("live-long", 3.0),
        ("live-2", 1.0),
    ] {
        pool.submit_live(order.job_of(name, "en", secs)).unwrap();
    }
    assert_eq!(pool.snapshot().live_queued, 4);
    gate.open();
    wait(&rx, 6);
    // The live job that did not fit a batch is still live work: it goes next, before the
    // file job, and the live jobs keep their order.
    assert_eq!(
        *order.done.lock(),
        [
            "file-0",
            "live-0",
            "live-1",
            "live-long",
            "live-2",
            "file-1"
        ]
    );
    // [file-0], [live-0, live-1], [live-long], [live-2], [file-1].
    assert_eq!(pool.snapshot().batches, 5);
    assert_eq!(engine.decoded(), 6);
    // Every live job, batched or not, left the measured backlog.
    assert_eq!(pool.stats().live_load.queued_ms(), 0);
}

#[test]
fn a_full_live_queue_refuses_at_once_and_hands_the_job_back() {
    let gate = Gate::closed();
    let (pool, _) = pool(&gate, one_worker(2));
    let (order, rx) = Order::new();
    pool.submit_live(order.job("taken", "en")).unwrap();
    assert!(gate.wait_arrived(1, Duration::from_secs(60)));
    pool.submit_live(order.job("queued-0", "en")).unwrap();
    pool.submit_live(order.job("queued-1", "en")).unwrap();
    let refused = pool
        .submit_live(order.job("refused", "en"))
        .expect_err("the live queue is full");
    assert!(!refused.stopped);
    assert_eq!(
        refused.job.audio.len(),
        16_000,
        "the job comes back untouched"
    );
    assert_eq!(pool.snapshot().live_rejected, 1);
    assert_eq!(pool.snapshot().live_queued, 2);
    gate.open();
    wait(&rx, 3);
    // Offered again once there is room, it is taken.
    pool.submit_live(refused.job).unwrap();
    wait(&rx, 1);
    assert_eq!(order.done.lock().last(), Some(&"refused"));
}

#[test]
fn the_live_backlog_and_the_wait_for_a_worker_are_measured() {
    let gate = Gate::closed();
    let (pool, _) = pool(&gate, one_worker(4));
    let (order, rx) = Order::new();
    let load = &pool.stats().live_load;
    // The worker is held in a decode; 2.5 s and 1.5 s of live audio wait behind it.
    pool.submit_live(order.job_of("taken", "en", 1.0)).unwrap();
    assert!(gate.wait_arrived(1, Duration::from_secs(60)));
    assert_eq!(load.queued_ms(), 0, "a job taken is no longer waiting");
    pool.submit_live(order.job_of("queued-0", "en", 2.5))
        .unwrap();
    pool.submit_live(order.job_of("queued-1", "en", 1.5))
        .unwrap();
    assert_eq!(load.queued_ms(), 4_000);
    // A refused job was never counted as waiting.
    pool.submit_live(order.job_of("queued-2", "en", 1.0))
        .unwrap();
    pool.submit_live(order.job_of("queued-3", "en", 1.0))
        .unwrap();
    assert!(pool
        .submit_live(order.job_of("refused", "en", 7.0))
        .is_err());
    assert_eq!(load.queued_ms(), 6_000);
    let held = Duration::from_millis(200);
    std::thread::sleep(held);
    gate.open();
    wait(&rx, 5);
    assert_eq!(load.queued_ms(), 0);
    // The queued jobs waited at least as long as the worker was held.
    let waited = load.recent_wait(std::time::Instant::now());
    assert!(waited >= held.mul_f64(0.5), "{waited:?}");
}

fn two_workers() -> PoolConfig {
    PoolConfig {
        workers: 2,
        max_batch: 1,
        live_batch: 1,
        live_queue: 4,
        file_queue: 16,
    }
}

#[test]
fn while_a_call_is_in_progress_one_worker_is_kept_for_live_work() {
    let gate = Gate::closed();
    let (pool, engine) = pool(&gate, two_workers());
    let (order, rx) = Order::new();
    let call = pool.live_call();
    for name in ["file-0", "file-1", "file-2"] {
        pool.submit_file(order.job(name, "en")).unwrap();
    }
    // One worker takes file work; the other is kept. A live utterance goes to it at once,
    // while two file jobs still wait.
    assert!(gate.wait_arrived(1, Duration::from_secs(60)));
    pool.submit_live(order.job("live", "en")).unwrap();
    assert!(gate.wait_arrived(2, Duration::from_secs(60)));
    let snap = pool.snapshot();
    assert_eq!((snap.live_queued, snap.file_queued), (0, 2), "{snap:?}");
    // The file still finishes, on one worker, while the call goes on.
    gate.open();
    wait(&rx, 4);
    assert_eq!(engine.decoded(), 4);
    assert_eq!(order.done.lock().len(), 4);
    drop(call);
}

#[test]
fn without_calls_every_worker_takes_file_work() {
    let gate = Gate::closed();
    let (pool, _) = pool(&gate, two_workers());
    let (order, rx) = Order::new();
    let call = pool.live_call();
    drop(call);
    for name in ["file-0", "file-1", "file-2"] {
        pool.submit_file(order.job(name, "en")).unwrap();
    }
    assert!(gate.wait_arrived(2, Duration::from_secs(60)));
    assert_eq!(pool.snapshot().file_queued, 1);
    gate.open();
    wait(&rx, 3);
}

#[test]
fn an_unknown_language_fails_its_job_and_the_worker_carries_on() {
    let gate = Gate::default();
    let (pool, _) = pool(&gate, one_worker(4));
    let (tx, rx) = mpsc::channel();
    pool.submit_live(Job {
        audio: vec![0.1; 1600],
        language: "xx".into(),
        reply: Box::new(move |r| tx.send(r.map(|t| t.text)).unwrap()),
        cancel: None,
    })
    .unwrap();
    let result = rx.recv_timeout(Duration::from_secs(60)).unwrap();
    assert!(matches!(result, Err(AsrError::Engine(_))), "{result:?}");
    let (order, rx) = Order::new();
    pool.submit_live(order.job("after", "en")).unwrap();
    wait(&rx, 1);
}

#[test]
fn a_failed_engine_load_is_reported() {
    let err = AsrPool::start(one_worker(4), |i| {
        Err(AsrError::Load {
            path: format!("worker {i}"),
            message: "no model here".into(),
        })
    })
    .unwrap_err();
    assert!(matches!(err, AsrError::Load { .. }), "{err}");
}
