//! The call actor tree without a socket, on the scripted speech engine and tokio's paused
//! clock: what the supervisor sends for a whole call, the call timeline with discarded audio,
//! failed children, the speech workers falling behind, the idle timeout and the quota running
//! out mid-call. The ledger and the intent analysis are in-memory implementations of the
//! engine's ports; the real Whisper model runs end to end in the service's `tests/callstream.rs`.
//!
//! Time: every test starts with the clock paused. Waiting for the call's next message happens on
//! a blocking thread, during which tokio does not move the paused clock, so time passes only when
//! a test sleeps: timers fire exactly when the test says.

use parking_lot::Mutex;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorRef};
use serde_json::{json, Value};
use tokio::sync::{mpsc, Semaphore};

use callstream_actors::asr::pool::{AsrPool, PoolConfig};
use callstream_actors::asr::scripted::{Gate, ScriptedEngine};
use callstream_actors::audio::decode::decode;
use callstream_actors::audio::g711::{encode_ulaw_into, ULAW};
use callstream_actors::audio::vad::{Segmenter, VadConfig};
use callstream_actors::billing::{Billing, BillingArgs};
use callstream_actors::call::{
    CallArgs, CallEnd, CallMsg, CallSettings, CallSupervisor, Child, DisconnectReason,
    IntentClassifier, IntentFuture, LiveStats, Outbound, QUOTA_INFO, REVOKED_INFO,
};
use callstream_actors::usage::{
    Account, Allowance, QuotaGate, UsageError, UsageEvent, UsageKind, UsageSink,
};

/// Bytes of one frame: 200 ms of stereo PCMU.
const FRAME_BYTES: usize = 3200;

fn root() -> PathBuf {
    callstream_actors::package_dir(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn pool(engine: &ScriptedEngine, workers: usize, live_queue: usize) -> Arc<AsrPool> {
    let engine = engine.clone();
    Arc::new(
        AsrPool::start(
            PoolConfig {
                workers,
                live_queue,
                ..PoolConfig::default()
            },
            move |_| Ok(engine.boxed()),
        )
        .unwrap(),
    )
}

/// The Genesys call: interleaved PCMU bytes, and its 8 kHz samples per channel.
fn genesys() -> (Vec<u8>, Vec<Vec<i16>>) {
    let bytes =
        std::fs::read(root().join("fixtures/genesys-test-transcript-connector.wav")).unwrap();
    let audio = decode(bytes, Some("wav"), 8000).unwrap();
    let channels: Vec<Vec<i16>> = audio
        .channels
        .iter()
        .map(|c| {
            c.iter()
                .map(|v| (v * 32768.0).round().clamp(-32768.0, 32767.0) as i16)
                .collect()
        })
        .collect();
    let n = channels[0].len();
    let pcm: Vec<i16> = (0..n)
        .flat_map(|i| channels.iter().map(move |c| c[i]))
        .collect();
    let mut out = vec![0u8; pcm.len()];
    encode_ulaw_into(&pcm, &mut out);
    // What the call hears is the mu-law audio: decode it back for the expectations.
    let heard = channels
        .iter()
        .enumerate()
        .map(|(c, _)| (0..n).map(|i| ULAW[usize::from(out[2 * i + c])]).collect())
        .collect();
    (out, heard)
}

/// The utterances (start sample, samples) the VAD cuts from `samples` streamed frame by frame.
fn utterances(samples: &[i16]) -> Vec<(u64, usize)> {
    let mut found = Vec::new();
    let mut seg = Segmenter::new(VadConfig::default());
    let mut push =
        |u: callstream_actors::audio::vad::Utterance| found.push((u.start, u.samples.len()));
    for block in samples.chunks(FRAME_BYTES / 2) {
        seg.push(block, &mut push);
    }
    seg.finish(&mut push);
    found
}

/// The ledger (running totals per call and row) and the quota, in memory. Leases are taken
/// out of `allowance` for good: the tests only need to see when the pool runs dry.
struct Ledger {
    rows: Mutex<std::collections::BTreeMap<(String, i64), u64>>,
    allowance: Mutex<Allowance>,
    /// How long each write and each reservation takes (a slow disk or database).
    delay: Mutex<Duration>,
}

impl Default for Ledger {
    fn default() -> Self {
        Self {
            rows: Mutex::default(),
            allowance: Mutex::new(Allowance::Unlimited),
            delay: Mutex::new(Duration::ZERO),
        }
    }
}

impl Ledger {
    async fn slow(&self) {
        let delay = *self.delay.lock();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
    }
}

#[async_trait::async_trait]
impl UsageSink for Ledger {
    async fn record(&self, _: &UsageEvent) -> Result<(), UsageError> {
        unreachable!("live calls write running totals")
    }

    async fn checkpoint(&self, totals: &[UsageEvent]) -> Result<(), UsageError> {
        self.slow().await;
        let mut rows = self.rows.lock();
        for t in totals {
            rows.insert((t.call_id.clone().unwrap(), t.at_ms), t.amount);
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl QuotaGate for Ledger {
    async fn allowance(&self, _: &str, _: UsageKind, _: i64) -> Result<Allowance, UsageError> {
        Ok(*self.allowance.lock())
    }

    async fn reserve(&self, _: &str, _: UsageKind, want: u64, _: i64) -> Result<u64, UsageError> {
        self.slow().await;
        let mut allowance = self.allowance.lock();
        Ok(match *allowance {
            Allowance::Unlimited => want,
            Allowance::Remaining(left) => {
                let granted = want.min(left);
                *allowance = Allowance::Remaining(left - granted);
                granted
            }
        })
    }

    fn release(&self, _: &str, _: UsageKind, _: u64) {}

    async fn checkpoint(
        &self,
        sink: &dyn UsageSink,
        totals: &[UsageEvent],
        _: &[(&str, u64)],
    ) -> Result<(), UsageError> {
        sink.checkpoint(totals).await
    }
}

impl Ledger {
    fn billed_ms(&self) -> u64 {
        self.rows.lock().values().sum()
    }
}

/// Answers with the number of transcript lines it was given.
struct LineCount;

impl IntentClassifier for LineCount {
    fn classify(&self, transcript: String) -> IntentFuture {
        Box::pin(async move {
            let lines = transcript.lines().filter(|l| l.contains(": ")).count();
            Ok(json!({"lines": lines}))
        })
    }
}

struct Call {
    supervisor: ActorRef<CallMsg>,
    out: Arc<Mutex<std::sync::mpsc::Receiver<Outbound>>>,
    credits: Arc<Semaphore>,
    ledger: Arc<Ledger>,
    stats: Arc<LiveStats>,
    seq: u64,
}

impl Call {
    async fn start(pool: Arc<AsrPool>, settings: CallSettings) -> Self {
        Self::start_with(
            pool,
            settings,
            Arc::new(Ledger::default()),
            Duration::from_secs(3600),
        )
        .await
    }

    /// A call whose billing writes to `ledger` every `flush_every`.
    async fn start_with(
        pool: Arc<AsrPool>,
        settings: CallSettings,
        ledger: Arc<Ledger>,
        flush_every: Duration,
    ) -> Self {
        let (billing, _) = Actor::spawn(
            None,
            Billing,
            BillingArgs {
                sink: ledger.clone(),
                gate: ledger.clone(),
                flush_every,
                now_ms: || 1_700_000_000_000,
            },
        )
        .await
        .unwrap();
        let (tx, mut rx) = mpsc::channel(64);
        // The test reads on a blocking thread (see the module docs).
        let (sync_tx, sync_rx) = std::sync::mpsc::channel();
        tokio::spawn(async move {
            while let Some(m) = rx.recv().await {
                if sync_tx.send(m).is_err() {
                    break;
                }
            }
        });
        let stats = Arc::new(LiveStats::default());
        let args = CallArgs {
            // Children are registered under the call id: unique per call.
            call_id: uuid::Uuid::new_v4().to_string(),
            session_header: None,
            account: Account {
                org_id: "org_a".into(),
                key_id: "cc_a".into(),
            },
            outbound: tx,
            pool,
            billing,
            classifier: Arc::new(LineCount),
            settings,
            stats: stats.clone(),
            observer: None,
            redact: false,
        };
        let (supervisor, _) = Actor::spawn(None, CallSupervisor, args).await.unwrap();
        Self {
            supervisor,
            out: Arc::new(Mutex::new(sync_rx)),
            credits: Arc::new(Semaphore::new(16)),
            ledger,
            stats,
            seq: 0,
        }
    }

    async fn credit(&self) -> Arc<tokio::sync::OwnedSemaphorePermit> {
        Arc::new(self.credits.clone().acquire_owned().await.unwrap())
    }

    async fn text(&mut self, kind: &str, parameters: Value) {
        self.seq += 1;
        let m = json!({"version":"2","id":"e160e428-53e2-487c-977d-96989bf5c99d","type":kind,
            "seq":self.seq,"serverseq":0,"position":"PT0S","parameters":parameters});
        let credit = self.credit().await;
        self.supervisor
            .cast(CallMsg::Text(m.to_string(), credit))
            .unwrap();
    }

    async fn audio(&mut self, bytes: &[u8]) {
        for frame in bytes.chunks(FRAME_BYTES) {
            let credit = self.credit().await;
            self.supervisor
                .cast(CallMsg::Audio(frame.to_vec(), credit))
                .unwrap();
        }
    }

    async fn open(&mut self) {
        self.text(
            "open",
            json!({"organizationId":"d7934305-0972-4844-938e-9060eef73d05",
                "conversationId":"090eaa2f-72fa-480a-83e0-8667ff89c0ec",
                "participant":{"id":"883efee8-3d6c-4537-b500-6d7ca4b92fa0","ani":"","aniName":"","dnis":""},
                "media":[{"type":"audio","format":"PCMU","channels":["external","internal"],"rate":8000}],
                "language":"en-US"}),
        )
        .await;
        let opened = self.message().await;
        assert_eq!(opened["type"], "opened", "{opened}");
    }

    /// The call's next output. Waits on a blocking thread, so the paused clock stands still.
    async fn next(&mut self) -> Outbound {
        let out = self.out.clone();
        tokio::task::spawn_blocking(move || {
            out.lock()
                .recv_timeout(Duration::from_secs(60))
                .expect("the call answers within a minute of real time")
        })
        .await
        .unwrap()
    }

    /// The next output, which must be a text message.
    async fn message(&mut self) -> Value {
        match self.next().await {
            Outbound::Text(t) => serde_json::from_str(&t).unwrap(),
            close => panic!("expected a message, got {close:?}"),
        }
    }

    /// Everything until the socket is closed.
    async fn rest(&mut self) -> (Vec<Value>, CallEnd) {
        let mut messages = Vec::new();
        loop {
            match self.next().await {
                Outbound::Text(t) => messages.push(serde_json::from_str(&t).unwrap()),
                Outbound::Close(end) => return (messages, end),
            }
        }
    }

    /// Waits until the supervisor has handled everything sent so far (it answers a ping).
    async fn sync(&mut self) {
        self.text("ping", json!({})).await;
        loop {
            if self.message().await["type"] == "pong" {
                return;
            }
        }
    }
}

/// Waits until `done` holds, polling on a blocking thread (so the paused clock stands still)
/// for at most a minute of real time.
async fn until(done: impl Fn() -> bool + Send + 'static) {
    tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !done() {
            assert!(std::time::Instant::now() < deadline, "timed out waiting");
            std::thread::sleep(Duration::from_millis(1));
        }
    })
    .await
    .unwrap();
}

fn secs(v: &Value) -> f64 {
    let s = v.as_str().unwrap();
    s[2..s.len() - 1].parse().unwrap()
}

fn transcript_data(event: &Value) -> &Value {
    &event["parameters"]["entities"][0]["data"]
}

#[tokio::test(start_paused = true)]
async fn a_whole_call_transcribes_every_utterance_on_the_call_timeline() {
    let (pcmu, heard) = genesys();
    let engine = ScriptedEngine::default();
    let mut call = Call::start(pool(&engine, 2, 64), CallSettings::default()).await;
    call.open().await;
    // The client skipped 5 s before its first frame: every offset moves by 5 s.
    call.text("discarded", json!({"start":"PT0S","discarded":"PT5S"}))
        .await;
    call.audio(&pcmu).await;
    call.text("close", json!({"reason":"end"})).await;
    let (messages, end) = call.rest().await;
    assert_eq!(end, CallEnd::Closed);
    assert_eq!(messages.last().unwrap()["type"], "closed");
    let events: Vec<&Value> = messages.iter().filter(|m| m["type"] == "event").collect();
    for (channel, samples) in heard.iter().enumerate() {
        let expected = utterances(samples);
        let got: Vec<&Value> = events
            .iter()
            .map(|e| transcript_data(e))
            .filter(|d| d["channelId"] == channel)
            .collect();
        // One final transcript per utterance, in the order spoken, each within its utterance.
        assert_eq!(got.len(), expected.len(), "channel {channel}");
        for (data, (start, len)) in got.iter().zip(&expected) {
            let from = 5.0 + *start as f64 / 8000.0;
            let to = from + *len as f64 / 8000.0;
            let offset = secs(&data["offset"]);
            let end = offset + secs(&data["duration"]);
            assert!(
                offset >= from - 1e-3 && end <= to + 1e-3,
                "channel {channel}: {offset}..{end} outside {from}..{to}"
            );
            assert!(data["alternatives"][0]["interpretations"][0]["transcript"]
                .as_str()
                .unwrap()
                .starts_with("speech "));
        }
    }
    assert_eq!(engine.decoded() as usize, events.len());
    assert_eq!(call.ledger.billed_ms(), heard[0].len() as u64 / 8);
    assert_eq!(call.stats.utterances_dropped.load(Ordering::Relaxed), 0);
}

#[tokio::test(start_paused = true)]
async fn failed_children_restart_the_intent_actor_or_end_the_call_with_its_usage_written() {
    let (pcmu, _) = genesys();
    let engine = ScriptedEngine::default();
    let mut call = Call::start(pool(&engine, 1, 64), CallSettings::default()).await;
    call.open().await;
    call.audio(&pcmu[..FRAME_BYTES * 10]).await; // 2 s of stereo audio
    call.sync().await;
    let children = call.supervisor.get_children();
    assert_eq!(
        children.len(),
        4,
        "two transcribers, a deinterleaver and an intent actor"
    );
    // The intent actor is started again; the call goes on and says the run was lost.
    let intent = children.iter().find(|c| c.get_name().is_none()).unwrap();
    intent.kill();
    let lost = loop {
        let m = call.message().await;
        if m["type"] == "intent_update" {
            break m;
        }
    };
    assert_eq!(lost["parameters"]["error"], "intent analysis failed");
    // The new actor is given the transcript so far and answers the next analyze.
    call.text("analyze", json!({})).await;
    let update = loop {
        let m = call.message().await;
        if m["type"] == "intent_update" {
            break m;
        }
    };
    assert!(update["parameters"]["intent"]["lines"].is_u64(), "{update}");
    // A transcriber that dies ends the call.
    let transcriber = children
        .iter()
        .find(|c| c.get_name().is_some_and(|n| n.ends_with(":transcriber:1")))
        .unwrap();
    transcriber.kill();
    let (_, end) = call.rest().await;
    assert_eq!(end, CallEnd::ChildFailed(Child::Transcriber(1)));
    assert_eq!(call.ledger.billed_ms(), 2000);
}

#[tokio::test(start_paused = true)]
async fn when_the_speech_workers_fall_behind_utterances_are_dropped_and_counted() {
    let (pcmu, heard) = genesys();
    let gate = Gate::closed();
    let engine = ScriptedEngine::default().with_gate(gate.clone());
    // One stuck worker, a live queue of one, and no hold: a whole call overruns it.
    let settings = CallSettings {
        max_held_utterances: 0,
        ..CallSettings::default()
    };
    let mut call = Call::start(pool(&engine, 1, 1), settings).await;
    call.open().await;
    call.audio(&pcmu).await;
    call.text("close", json!({"reason":"end"})).await;
    let total: usize = heard.iter().map(|c| utterances(c).len()).sum();
    assert!(total > 2);
    // The worker holds one utterance at the gate and the live queue one more; every other
    // utterance is dropped as it is cut.
    let stats = call.stats.clone();
    until(move || stats.utterances_dropped.load(Ordering::Relaxed) as usize == total - 2).await;
    gate.open();
    let (messages, end) = call.rest().await;
    assert_eq!(end, CallEnd::Closed);
    assert_eq!(messages.last().unwrap()["type"], "closed");
    let sent = messages.iter().filter(|m| m["type"] == "event").count();
    assert_eq!(sent, 2, "the call still gets what the workers took");
    assert_eq!(
        call.stats.utterances_dropped.load(Ordering::Relaxed) as usize,
        total - 2
    );
}

#[tokio::test(start_paused = true)]
async fn a_silent_client_is_ended_after_the_idle_timeout() {
    let engine = ScriptedEngine::default();
    let settings = CallSettings {
        idle_timeout: Duration::from_secs(30),
        ..CallSettings::default()
    };
    let mut call = Call::start(pool(&engine, 1, 8), settings).await;
    call.open().await;
    call.audio(&[0xFF; FRAME_BYTES]).await;
    call.sync().await;
    // 29 s of silence is not enough...
    tokio::time::sleep(Duration::from_secs(29)).await;
    call.sync().await;
    // ...and a ping restarts the count: 29 s more, and the call is still there.
    tokio::time::sleep(Duration::from_secs(29)).await;
    call.sync().await;
    // The silence is noticed at the next check (every quarter of the timeout).
    tokio::time::sleep(Duration::from_secs(30 + 8)).await;
    let (_, end) = call.rest().await;
    assert_eq!(end, CallEnd::IdleTimeout);
    assert_eq!(call.ledger.billed_ms(), 200);
}

#[tokio::test(start_paused = true)]
async fn audio_is_served_only_under_a_lease_and_a_dry_pool_disconnects_with_or_without_close() {
    for client_answers in [true, false] {
        let engine = ScriptedEngine::default();
        let settings = CallSettings {
            quota_slice: Duration::from_millis(400),
            ..CallSettings::default()
        };
        let mut call = Call::start(pool(&engine, 1, 8), settings).await;
        *call.ledger.allowance.lock() = Allowance::Remaining(1000);
        call.open().await;
        // Two seconds of audio at once, far faster than real time: one second is leased
        // (400 + 400 + 200 ms), then the pool is dry.
        call.audio(&[0xFF; FRAME_BYTES * 10]).await;
        let disconnect = loop {
            let m = call.message().await;
            if m["type"] == "disconnect" {
                break m;
            }
        };
        assert_eq!(disconnect["parameters"]["reason"], "error");
        assert_eq!(disconnect["parameters"]["info"], QUOTA_INFO);
        if client_answers {
            call.text("close", json!({"reason":"disconnect"})).await;
            let (messages, end) = call.rest().await;
            assert_eq!(messages.last().unwrap()["type"], "closed");
            assert_eq!(end, CallEnd::Disconnected(DisconnectReason::QuotaExhausted));
        } else {
            // No close within the grace period: the call ends anyway.
            tokio::time::sleep(CallSettings::default().disconnect_grace).await;
            let (_, end) = call.rest().await;
            assert_eq!(end, CallEnd::Disconnected(DisconnectReason::QuotaExhausted));
        }
        assert_eq!(
            call.ledger.billed_ms(),
            1000,
            "served and billed: the lease, no more"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_call_ended_from_outside_is_disconnected_as_unauthorized_and_billed() {
    let engine = ScriptedEngine::default();
    let mut call = Call::start(pool(&engine, 1, 8), CallSettings::default()).await;
    call.open().await;
    call.audio(&[0xFF; FRAME_BYTES * 5]).await;
    call.supervisor
        .cast(CallMsg::Disconnect(DisconnectReason::Revoked))
        .unwrap();
    let disconnect = loop {
        let m = call.message().await;
        if m["type"] == "disconnect" {
            break m;
        }
    };
    assert_eq!(disconnect["parameters"]["reason"], "unauthorized");
    assert_eq!(disconnect["parameters"]["info"], REVOKED_INFO);
    call.text("close", json!({"reason":"disconnect"})).await;
    let (_, end) = call.rest().await;
    assert_eq!(end, CallEnd::Disconnected(DisconnectReason::Revoked));
    assert_eq!(call.ledger.billed_ms(), 1000);
}

#[tokio::test(start_paused = true)]
async fn a_store_that_takes_two_seconds_per_write_delays_no_frame_and_every_second_is_billed() {
    let engine = ScriptedEngine::default();
    let ledger = Arc::new(Ledger::default());
    *ledger.allowance.lock() = Allowance::Remaining(3_600_000);
    // Billing writes every second, each write taking two; leases come in 30 s slices.
    let mut call = Call::start_with(
        pool(&engine, 1, 64),
        CallSettings::default(),
        ledger.clone(),
        Duration::from_secs(1),
    )
    .await;
    call.open().await;
    // From now on every write and every reservation takes two seconds (set after `open`: the
    // test waits for `opened` on a thread, during which the paused clock stands still).
    *ledger.delay.lock() = Duration::from_secs(2);
    // Two minutes of audio in real time, 200 ms a frame: each frame must have reached its
    // transcriber (which gives its credit back) before the next is due.
    let frames = 600;
    for i in 0..frames {
        assert_eq!(
            call.credits.available_permits(),
            16,
            "frame {i} of {frames} was held back"
        );
        let credit = call.credit().await;
        call.supervisor
            .cast(CallMsg::Audio(vec![0xFF; FRAME_BYTES], credit))
            .unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    call.text("close", json!({"reason": "end"})).await;
    // The last writes take their two seconds each on the paused clock, which stands still
    // while the test waits for the call's messages: let it run first.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (messages, end) = call.rest().await;
    assert_eq!(messages.last().unwrap()["type"], "closed");
    assert_eq!(end, CallEnd::Closed);
    // 600 frames of 200 ms, each second of them in the ledger.
    assert_eq!(ledger.billed_ms(), 120_000);
}
