//! The call actor tree on the real speech engine, without a socket: what the supervisor sends
//! for a whole call, the call timeline with discarded audio, a failed child ending the call with
//! 1011 and its usage written, and what happens when the speech workers fall behind. The
//! ledger and the intent analysis are in-memory implementations of the engine's ports.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ractor::{Actor, ActorRef};
use serde_json::{json, Value};
use tokio::sync::{mpsc, Semaphore};

use callstream_actors::asr::pool::{AsrPool, PoolConfig};
use callstream_actors::asr::whisper::{WhisperEngine, WhisperSettings};
use callstream_actors::asr::AsrEngine;
use callstream_actors::audio::decode::decode;
use callstream_actors::audio::g711::encode_ulaw_into;
use callstream_actors::billing::{Account, Billing, BillingArgs};
use callstream_actors::call::{
    CallArgs, CallMsg, CallSettings, CallSupervisor, IntentClassifier, IntentFuture, LiveStats,
    Outbound,
};
use callstream_actors::usage::{
    Allowance, QuotaGate, UsageError, UsageEvent, UsageKind, UsageSink,
};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn pool(workers: usize, live_queue: usize) -> Arc<AsrPool> {
    let dir = root().join("models/whisper-tiny.en");
    assert!(
        dir.join("model.bin").exists(),
        "run scripts/setup.sh --test first"
    );
    Arc::new(
        AsrPool::start(
            PoolConfig {
                workers,
                live_queue,
                ..PoolConfig::default()
            },
            move |_| {
                Ok(
                    Box::new(WhisperEngine::load(&dir, WhisperSettings::default())?)
                        as Box<dyn AsrEngine>,
                )
            },
        )
        .unwrap(),
    )
}

/// The Genesys call as interleaved PCMU bytes, and its samples per channel.
fn genesys_pcmu() -> (Vec<u8>, usize) {
    let bytes =
        std::fs::read(root().join("fixtures/genesys-test-transcript-connector.wav")).unwrap();
    let audio = decode(bytes, Some("wav"), 8000).unwrap();
    let n = audio.channels[0].len();
    let mut pcm = Vec::with_capacity(2 * n);
    for i in 0..n {
        for c in &audio.channels {
            pcm.push((c[i] * 32768.0).round().clamp(-32768.0, 32767.0) as i16);
        }
    }
    let mut out = vec![0u8; pcm.len()];
    encode_ulaw_into(&pcm, &mut out);
    (out, n)
}

#[derive(Default)]
struct Ledger {
    events: Mutex<Vec<UsageEvent>>,
}

impl UsageSink for Ledger {
    fn record(&self, event: &UsageEvent) -> Result<(), UsageError> {
        self.events.lock().unwrap().push(event.clone());
        Ok(())
    }
}

impl QuotaGate for Ledger {
    fn allowance(&self, _: &str, _: UsageKind, _: i64) -> Result<Allowance, UsageError> {
        Ok(Allowance::Unlimited)
    }
}

impl Ledger {
    fn billed_ms(&self) -> u64 {
        self.events.lock().unwrap().iter().map(|e| e.amount).sum()
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
    out: mpsc::Receiver<Outbound>,
    credits: Arc<Semaphore>,
    ledger: Arc<Ledger>,
    stats: Arc<LiveStats>,
    seq: u64,
}

impl Call {
    async fn start(pool: Arc<AsrPool>, settings: CallSettings) -> Self {
        let ledger = Arc::new(Ledger::default());
        let (billing, _) = Actor::spawn(
            None,
            Billing,
            BillingArgs {
                sink: ledger.clone(),
                gate: ledger.clone(),
                flush_every: Duration::from_secs(3600),
                now_ms: || 1_700_000_000_000,
            },
        )
        .await
        .unwrap();
        let (tx, out) = mpsc::channel(64);
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
            billing: billing.clone(),
            classifier: Arc::new(LineCount),
            settings,
            stats: stats.clone(),
            observer: None,
        };
        let (supervisor, _) = Actor::spawn(None, CallSupervisor, args).await.unwrap();
        Self {
            supervisor,
            out,
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
        for frame in bytes.chunks(3200) {
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
        let opened = self.next().await;
        assert_eq!(opened, Outbound::Text(opened_text(&opened)), "{opened:?}");
    }

    async fn next(&mut self) -> Outbound {
        tokio::time::timeout(Duration::from_secs(120), self.out.recv())
            .await
            .expect("the call answers")
            .expect("the call is alive")
    }

    /// Everything until the socket is closed.
    async fn rest(&mut self) -> (Vec<Value>, (u16, String)) {
        let mut messages = Vec::new();
        loop {
            match self.next().await {
                Outbound::Text(t) => messages.push(serde_json::from_str(&t).unwrap()),
                Outbound::Close(code, reason) => return (messages, (code, reason)),
            }
        }
    }
}

fn opened_text(o: &Outbound) -> String {
    match o {
        Outbound::Text(t) if t.contains("\"opened\"") => t.clone(),
        other => panic!("expected opened, got {other:?}"),
    }
}

fn secs(v: &Value) -> f64 {
    let s = v.as_str().unwrap();
    s[2..s.len() - 1].parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_call_with_discarded_audio_on_the_timeline() {
    let (pcmu, samples) = genesys_pcmu();
    let mut call = Call::start(pool(2, 64), CallSettings::default()).await;
    call.open().await;
    // The client skipped 5 s before its first frame: every offset moves by 5 s.
    call.text("discarded", json!({"start":"PT0S","discarded":"PT5S"}))
        .await;
    call.audio(&pcmu).await;
    call.text("close", json!({"reason":"end"})).await;
    let (messages, close) = call.rest().await;
    assert_eq!(close, (1000, String::new()));
    assert_eq!(messages.last().unwrap()["type"], "closed");
    let events: Vec<&Value> = messages.iter().filter(|m| m["type"] == "event").collect();
    let first = &events[0]["parameters"]["entities"][0]["data"];
    assert!(secs(&first["offset"]) >= 5.0, "{first}");
    let channels: Vec<u64> = events
        .iter()
        .map(|e| {
            e["parameters"]["entities"][0]["data"]["channelId"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert!(channels.contains(&0) && channels.contains(&1));
    let last = &events.last().unwrap()["parameters"]["entities"][0]["data"];
    assert!(secs(&last["offset"]) + secs(&last["duration"]) <= 5.0 + 70.9);
    assert_eq!(call.ledger.billed_ms(), samples as u64 / 8);
    assert_eq!(call.stats.utterances_dropped.load(Ordering::Relaxed), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_child_ends_the_call_with_1011_and_its_usage_is_written() {
    let (pcmu, _) = genesys_pcmu();
    let mut call = Call::start(pool(1, 64), CallSettings::default()).await;
    call.open().await;
    call.audio(&pcmu[..16_000 * 2]).await; // 2 s of stereo audio
                                           // Let the frames reach the transcribers, then stop one of them.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let children = call.supervisor.get_children();
    assert_eq!(
        children.len(),
        4,
        "two transcribers, a deinterleaver and an intent actor"
    );
    // The intent actor is started again; the call goes on and says the run was lost.
    let intent = children.iter().find(|c| c.get_name().is_none()).unwrap();
    intent.kill();
    call.text("ping", json!({})).await;
    let mut seen = Vec::new();
    while seen.len() < 2 {
        match call.next().await {
            Outbound::Text(t) => {
                let v: Value = serde_json::from_str(&t).unwrap();
                if v["type"] != "event" {
                    seen.push(v);
                }
            }
            close => panic!("the call ended: {close:?}"),
        }
    }
    let kinds: Vec<&Value> = seen.iter().map(|v| &v["type"]).collect();
    assert!(
        kinds.contains(&&json!("pong")) && kinds.contains(&&json!("intent_update")),
        "{seen:?}"
    );
    // A transcriber that dies ends the call.
    let transcriber = children
        .iter()
        .find(|c| c.get_name().is_some_and(|n| n.ends_with(":transcriber:1")))
        .unwrap();
    transcriber.kill();
    loop {
        match call.next().await {
            Outbound::Close(code, reason) => {
                assert_eq!((code, reason.as_str()), (1011, "internal error"));
                break;
            }
            Outbound::Text(_) => {}
        }
    }
    assert_eq!(call.ledger.billed_ms(), 2000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_speech_workers_fall_behind_utterances_are_held_then_dropped_and_counted() {
    let (pcmu, _) = genesys_pcmu();
    // One worker, a live queue of one, and no hold: a whole call sent at once overruns it.
    let settings = CallSettings {
        max_held_utterances: 0,
        ..CallSettings::default()
    };
    let mut call = Call::start(pool(1, 1), settings).await;
    call.open().await;
    call.audio(&pcmu).await;
    call.text("close", json!({"reason":"end"})).await;
    let (messages, close) = call.rest().await;
    assert_eq!(close, (1000, String::new()));
    assert_eq!(messages.last().unwrap()["type"], "closed");
    let dropped = call.stats.utterances_dropped.load(Ordering::Relaxed);
    let sent = messages.iter().filter(|m| m["type"] == "event").count();
    assert!(dropped > 0, "nothing dropped; {sent} transcripts");
    assert!(
        sent > 0,
        "the call still gets the utterances the workers took"
    );
}
