//! Calls in progress, as the dashboard's live page shows them: the engine's [`CallObserver`]
//! port kept as a map per call and a broadcast feed of what happens to them.
//!
//! With instances sharing a database, each lists its calls there and sends its events to the
//! others ([`SharedState::publish_live`]); the page of any instance shows the organisation's
//! calls on all of them. A call on another instance shows the lines heard since the page
//! opened (its snapshot holds none).

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

use crate::store::SharedState;

use callstream_actors::call::{CallEnded, CallInfo, CallObserver, FinalLine};
use callstream_actors::transcript::round3;
use tokio::sync::broadcast;

/// Most transcript lines kept per call for the dashboard.
const MAX_LINES: usize = 500;

/// A call in progress, as the dashboard shows it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct LiveCall {
    /// Call id.
    pub call_id: String,
    /// Owner (not sent to browsers).
    #[serde(skip)]
    pub org_id: String,
    /// The platform's conversation id.
    pub conversation_id: String,
    /// Channel names in order.
    pub channels: Vec<String>,
    /// Language tag.
    pub language: Option<String>,
    /// Its record in the call history (`/dashboard/history/{id}`).
    #[serde(default)]
    pub record_id: String,
    /// RFC 3339.
    pub started_at: String,
    /// Final transcripts so far (the last 500).
    pub lines: Vec<LiveLine>,
}

/// A final transcript of a call in progress.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct LiveLine {
    /// Channel index.
    pub channel: usize,
    /// Seconds on the call timeline.
    pub offset: f64,
    /// Text.
    pub text: String,
}

/// What the live page is told.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum LiveEvent {
    /// A call opened.
    Opened {
        /// The call.
        call: LiveCall,
    },
    /// A final transcript.
    Transcript {
        /// Call id.
        call_id: String,
        /// The line.
        line: LiveLine,
    },
    /// A call ended.
    Ended {
        /// Call id.
        call_id: String,
    },
    /// A new call of the organisation was refused: the instance was at its live-call
    /// capacity (see [`crate::capacity`]).
    Refused {
        /// RFC 3339.
        at: String,
    },
}

/// An organisation's calls refused at capacity on this instance since it started.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Refusals {
    /// How many.
    pub count: u64,
    /// When the last one was, RFC 3339.
    pub last_at: Option<String>,
}

/// The calls in progress, per organisation, and a feed of what happens to them: (organisation
/// id, the event as JSON).
pub struct LiveCalls {
    // A parking_lot Mutex: a map update per transcript, never held across an await.
    calls: Mutex<HashMap<String, LiveCall>>,
    // One entry per organisation that had a call refused (bounded by the organisations).
    refusals: Mutex<HashMap<String, Refusals>>,
    feed: broadcast::Sender<(String, String)>,
    shared: Arc<dyn SharedState>,
}

impl LiveCalls {
    /// The calls of this instance, shared with the others through `shared`, whose events
    /// join this instance's feed.
    pub fn new(shared: Arc<dyn SharedState>) -> Self {
        let feed = broadcast::channel(1024).0;
        if let Some(mut remote) = shared.remote_live() {
            let local = feed.clone();
            let relay = std::thread::Builder::new()
                .name("live-relay".into())
                .spawn(move || loop {
                    match remote.blocking_recv() {
                        Ok(event) => {
                            let _ = local.send(event);
                        }
                        Err(broadcast::error::RecvError::Lagged(_)) => continue,
                        Err(broadcast::error::RecvError::Closed) => return,
                    }
                });
            if let Err(e) = relay {
                tracing::error!(error = %e, "cannot relay other instances' live events");
            }
        }
        Self {
            calls: Default::default(),
            refusals: Default::default(),
            feed,
            shared,
        }
    }

    /// The organisation's calls in progress, here and on the other instances, oldest first.
    pub async fn of_org(&self, org_id: &str) -> Vec<LiveCall> {
        let mut list: Vec<LiveCall> = {
            let calls = self.calls.lock();
            calls
                .values()
                .filter(|c| c.org_id == org_id)
                .cloned()
                .collect()
        };
        for remote in self.shared.remote_calls(org_id).await {
            match serde_json::from_str::<LiveCall>(&remote.call) {
                Ok(mut call) => {
                    call.org_id = org_id.to_owned();
                    list.push(call);
                }
                Err(e) => {
                    tracing::warn!(instance = %remote.instance, error = %e, "unreadable shared call")
                }
            }
        }
        list.sort_by(|a, b| a.started_at.cmp(&b.started_at));
        list
    }

    /// A call of `org_id` was refused at capacity: counted for its live page, which is told.
    pub fn refused(&self, org_id: &str) {
        let at = crate::clock::rfc3339(crate::clock::now_ms());
        {
            let mut refusals = self.refusals.lock();
            let entry = refusals.entry(org_id.to_owned()).or_default();
            entry.count += 1;
            entry.last_at = Some(at.clone());
        }
        self.publish(org_id.to_owned(), LiveEvent::Refused { at });
    }

    /// `org_id`'s calls refused at capacity on this instance since it started.
    pub fn refusals_of(&self, org_id: &str) -> Refusals {
        self.refusals
            .lock()
            .get(org_id)
            .cloned()
            .unwrap_or_default()
    }

    /// Everything that happens from now on: (organisation id, event JSON).
    pub fn subscribe(&self) -> broadcast::Receiver<(String, String)> {
        self.feed.subscribe()
    }

    fn publish(&self, org_id: String, event: LiveEvent) {
        let json = serde_json::to_string(&event).expect("live events serialize");
        self.shared.publish_live(&org_id, &json);
        // Nobody watching is fine.
        let _ = self.feed.send((org_id, json));
    }
}

impl CallObserver for LiveCalls {
    fn opened(&self, call: &CallInfo) {
        let live = LiveCall {
            call_id: call.call_id.clone(),
            org_id: call.org_id.clone(),
            conversation_id: call.conversation_id.clone(),
            channels: call.channels.clone(),
            language: call.language.clone(),
            record_id: crate::history::call_record_id(&call.org_id, &call.first_session),
            started_at: crate::clock::rfc3339(crate::clock::now_ms()),
            lines: Vec::new(),
        };
        self.calls.lock().insert(call.call_id.clone(), live.clone());
        self.shared.call_opened(
            &call.call_id,
            &call.org_id,
            &serde_json::to_string(&live).expect("a live call serializes"),
        );
        self.publish(call.org_id.clone(), LiveEvent::Opened { call: live });
    }

    fn transcript(&self, call_id: &str, line: &FinalLine) {
        let line = LiveLine {
            channel: line.channel,
            offset: round3(line.offset),
            text: line.text.clone(),
        };
        let org = {
            let mut calls = self.calls.lock();
            let Some(call) = calls.get_mut(call_id) else {
                return;
            };
            if call.lines.len() == MAX_LINES {
                call.lines.remove(0);
            }
            call.lines.push(line.clone());
            call.org_id.clone()
        };
        self.publish(
            org,
            LiveEvent::Transcript {
                call_id: call_id.to_owned(),
                line,
            },
        );
    }

    fn ended(&self, call_id: &str, _end: &CallEnded) {
        let removed = self.calls.lock().remove(call_id);
        if let Some(call) = removed {
            self.shared.call_ended(call_id);
            self.publish(
                call.org_id,
                LiveEvent::Ended {
                    call_id: call_id.to_owned(),
                },
            );
        }
    }
}
