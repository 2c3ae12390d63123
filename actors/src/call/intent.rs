//! The intent actor of a call: keeps the call's transcript and runs the intent analysis over
//! all of it when asked. One run at a time; any number of requests during a run collapse into
//! exactly one follow-up run, which reads the transcript as it is when that run starts.

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
}

/// The actor's state.
pub struct IntentState {
    args: IntentArgs,
    lines: Vec<(f64, String, String)>,
    running: bool,
    follow_up: bool,
    runs: u64,
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
        self.runs += 1;
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
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            IntentMsg::Line(at, who, text) => state.lines.push((at, who, text)),
            IntentMsg::Analyze if state.running => {
                if state.follow_up {
                    tracing::debug!("analyze coalesced into the pending follow-up run");
                }
                state.follow_up = true;
            }
            IntentMsg::Analyze => state.start(&myself),
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
