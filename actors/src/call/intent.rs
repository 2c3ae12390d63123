//! The intent actor of a call: keeps the call's transcript and runs the intent analysis over
//! all of it when asked. One run at a time, and runs start at least
//! [`IntentArgs::min_interval`] apart; any number of requests during a run (or while the next
//! waits its turn) collapse into exactly one follow-up run, which reads the transcript as it
//! is when that run starts.
//!
//! Each final transcript is handed to the classifier to prepare ([`IntentClassifier::prefill`]),
//! so that the next request finds most of the transcript already read; the classifier is told
//! whether the call has asked for its intent yet (one that has is likely to ask again).

use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef, DerivedActorRef};
use serde_json::Value;

use super::ports::IntentClassifier;
use crate::transcript::dialogue;

/// Messages of the [`Intent`] actor.
#[derive(Debug)]
pub enum IntentMsg {
    /// A final transcript: seconds on the call timeline, speaker label, text.
    Line(f64, String, String),
    /// Classify the transcript so far.
    Analyze,
    /// A scheduled run's turn has come.
    Begin,
    /// A run finished.
    RunDone(Result<Value, String>),
}

/// The result of one intent run: the intent result, or why the run failed.
#[derive(Debug)]
pub struct IntentOutcome(pub Result<Value, String>);

/// Arguments of the [`Intent`] actor.
pub struct IntentArgs {
    /// The analysis.
    pub classifier: Arc<dyn IntentClassifier>,
    /// Where results go.
    pub report: DerivedActorRef<IntentOutcome>,
    /// The least time between the starts of two runs.
    pub min_interval: std::time::Duration,
}

/// The actor's state.
pub struct IntentState {
    args: IntentArgs,
    lines: Vec<(f64, String, String)>,
    running: bool,
    follow_up: bool,
    runs: u64,
    /// The client has asked for the intent at least once.
    asked: bool,
    /// When the last run started.
    last_start: Option<tokio::time::Instant>,
}

/// The intent actor.
#[derive(Debug, Default)]
pub struct Intent;

impl IntentState {
    /// The transcript as `Speaker: text` lines in time order.
    fn transcript(&self) -> String {
        let mut lines: Vec<&(f64, String, String)> = self.lines.iter().collect();
        lines.sort_by(|a, b| a.0.total_cmp(&b.0));
        dialogue(
            lines
                .iter()
                .map(|(_, who, text)| (who.as_str(), text.as_str())),
        )
    }

    fn start(&mut self, myself: &ActorRef<IntentMsg>) {
        self.running = true;
        let me = myself.clone();
        self.runs += 1;
        let now = tokio::time::Instant::now();
        let at = self
            .last_start
            .map_or(now, |last| (last + self.args.min_interval).max(now));
        self.last_start = Some(at);
        tokio::spawn(async move {
            // Requests that come while this run waits its turn are its follow-up.
            tokio::time::sleep_until(at).await;
            let _ = me.cast(IntentMsg::Begin);
        });
    }

    /// Starts the run [`IntentState::start`] scheduled, over the transcript as it is now.
    fn begin(&mut self, myself: &ActorRef<IntentMsg>) {
        // Requests that came while this run waited its turn are answered by it.
        self.follow_up = false;
        let run = self.args.classifier.classify(self.transcript());
        let me = myself.clone();
        tokio::spawn(async move {
            // A panic inside the analysis fails this run, not the actor.
            let result = match tokio::spawn(run).await {
                Ok(result) => result,
                Err(e) => Err(format!("intent analysis failed: {e}")),
            };
            let _ = me.cast(IntentMsg::RunDone(result));
        });
    }
}

impl Actor for Intent {
    type Msg = IntentMsg;
    type State = IntentState;
    type Arguments = IntentArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: IntentArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(IntentState {
            args,
            lines: Vec::new(),
            running: false,
            follow_up: false,
            runs: 0,
            asked: false,
            last_start: None,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            IntentMsg::Line(at, who, text) => {
                state.lines.push((at, who, text));
                state
                    .args
                    .classifier
                    .prefill(state.transcript(), state.asked);
            }
            IntentMsg::Analyze if state.running => {
                if state.follow_up {
                    tracing::debug!("analyze coalesced into the pending follow-up run");
                }
                state.follow_up = true;
            }
            IntentMsg::Analyze => {
                state.asked = true;
                state.start(&myself);
            }
            IntentMsg::Begin => state.begin(&myself),
            IntentMsg::RunDone(result) => {
                state.running = false;
                tracing::info!(
                    run = state.runs,
                    ok = result.is_ok(),
                    "intent analysis done"
                );
                state.args.report.send_message(IntentOutcome(result))?;
                if std::mem::take(&mut state.follow_up) {
                    state.start(&myself);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use parking_lot::Mutex;

    use tokio::sync::mpsc;

    use super::*;
    use crate::call::IntentFuture;

    /// Answers at once with the lines it was given and records what it is asked to prepare
    /// (and whether the call had asked by then).
    struct Recorder(Arc<Mutex<Vec<(String, bool)>>>);

    impl IntentClassifier for Recorder {
        fn classify(&self, transcript: String) -> IntentFuture {
            Box::pin(async move { Ok(Value::from(transcript.lines().count())) })
        }

        fn prefill(&self, transcript: String, asked: bool) {
            self.0.lock().push((transcript, asked));
        }
    }

    /// Forwards outcomes to the test.
    struct Sink;

    impl Actor for Sink {
        type Msg = IntentOutcome;
        type State = mpsc::UnboundedSender<IntentOutcome>;
        type Arguments = mpsc::UnboundedSender<IntentOutcome>;

        async fn pre_start(
            &self,
            _: ActorRef<Self::Msg>,
            tx: Self::Arguments,
        ) -> Result<Self::State, ActorProcessingErr> {
            Ok(tx)
        }

        async fn handle(
            &self,
            _: ActorRef<Self::Msg>,
            message: Self::Msg,
            tx: &mut Self::State,
        ) -> Result<(), ActorProcessingErr> {
            let _ = tx.send(message);
            Ok(())
        }
    }

    #[tokio::test]
    async fn each_line_is_handed_over_to_prepare_saying_whether_the_call_asked() {
        let (tx, mut outcomes) = mpsc::unbounded_channel();
        let (sink, _) = Actor::spawn(None, Sink, tx).await.unwrap();
        let prefills = Arc::new(Mutex::new(Vec::new()));
        let (intent, _) = Actor::spawn(
            None,
            Intent,
            IntentArgs {
                classifier: Arc::new(Recorder(prefills.clone())),
                report: sink.get_derived(),
                min_interval: std::time::Duration::ZERO,
            },
        )
        .await
        .unwrap();
        let line = |at: f64, who: &str, text: &str| {
            intent
                .cast(IntentMsg::Line(at, who.into(), text.into()))
                .unwrap();
        };
        line(0.5, "Customer", "my router keeps dropping.");
        line(2.0, "Agent", "let me check.");
        intent.cast(IntentMsg::Analyze).unwrap();
        let first = outcomes.recv().await.unwrap().0.unwrap();
        assert_eq!(first, Value::from(2));
        // Each line so far was handed over as the transcript up to it, before anyone asked.
        assert_eq!(
            *prefills.lock(),
            [
                ("Customer: my router keeps dropping.\n".to_owned(), false),
                (
                    "Customer: my router keeps dropping.\nAgent: let me check.\n".to_owned(),
                    false
                ),
            ]
        );
        // A line that belongs before the last one (another channel, later) goes in time order.
        line(4.0, "Customer", "since Monday.");
        line(3.0, "Agent", "is the light green?");
        intent.cast(IntentMsg::Analyze).unwrap();
        assert_eq!(outcomes.recv().await.unwrap().0.unwrap(), Value::from(4));
        let prefills = prefills.lock().clone();
        assert_eq!(prefills.len(), 4);
        assert!(prefills[2].1 && prefills[3].1, "asked by then");
        assert_eq!(
            prefills[3].0,
            "Customer: my router keeps dropping.\nAgent: let me check.\n\
             Agent: is the light green?\nCustomer: since Monday.\n"
        );
        intent.stop(None);
        sink.stop(None);
    }

    /// Records when each run started.
    struct Clocked(Arc<Mutex<Vec<tokio::time::Instant>>>);

    impl IntentClassifier for Clocked {
        fn classify(&self, _transcript: String) -> IntentFuture {
            self.0.lock().push(tokio::time::Instant::now());
            Box::pin(async move { Ok(Value::Null) })
        }
    }

    // On tokio's paused clock: time moves only when every task waits, so the spacing checked
    // below is the actor's own, not the test machine's scheduling.
    #[tokio::test(start_paused = true)]
    async fn runs_are_spaced_and_requests_between_them_coalesce() {
        let (tx, mut outcomes) = mpsc::unbounded_channel();
        let (sink, _) = Actor::spawn(None, Sink, tx).await.unwrap();
        let starts = Arc::new(Mutex::new(Vec::new()));
        let gap = std::time::Duration::from_millis(300);
        let (intent, _) = Actor::spawn(
            None,
            Intent,
            IntentArgs {
                classifier: Arc::new(Clocked(starts.clone())),
                report: sink.get_derived(),
                min_interval: gap,
            },
        )
        .await
        .unwrap();
        intent
            .cast(IntentMsg::Line(0.5, "Customer".into(), "hello".into()))
            .unwrap();
        // Twenty requests 20 ms apart: a run now, then a follow-up a gap later, and so on.
        let asking = tokio::time::Instant::now();
        for _ in 0..20 {
            intent.cast(IntentMsg::Analyze).unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let asked_for = asking.elapsed();
        let mut answered = 0;
        while let Ok(Some(_)) =
            tokio::time::timeout(std::time::Duration::from_secs(2), outcomes.recv()).await
        {
            answered += 1;
        }
        let starts = starts.lock().clone();
        // At most a run per gap while requests came, and one follow-up after the last.
        let most = (asked_for.as_millis() / gap.as_millis()) as usize + 2;
        assert!(
            (2..=most).contains(&starts.len()),
            "{} runs for requests over {asked_for:?}",
            starts.len()
        );
        assert_eq!(answered, starts.len());
        for pair in starts.windows(2) {
            assert!(pair[1] - pair[0] >= gap, "{:?}", pair[1] - pair[0]);
        }
        intent.stop(None);
        sink.stop(None);
    }
}
