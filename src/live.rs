//! Calls in progress, as the dashboard's live page shows them: the engine's [`CallObserver`]
//! port kept as a map per call and a broadcast feed of what happens to them.

use std::collections::HashMap;
use std::sync::Mutex;

use callstream_actors::call::{CallInfo, CallObserver};
use callstream_actors::transcript::round3;
use tokio::sync::broadcast;

/// Most transcript lines kept per call for the dashboard.
const MAX_LINES: usize = 500;

/// A call in progress, as the dashboard shows it.
#[derive(Debug, Clone, serde::Serialize)]
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
    /// RFC 3339.
    pub started_at: String,
    /// Final transcripts so far (the last 500).
    pub lines: Vec<LiveLine>,
}

/// A final transcript of a call in progress.
#[derive(Debug, Clone, serde::Serialize)]
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
}

/// The calls in progress, per organisation, and a feed of what happens to them.
pub struct LiveCalls {
    // A std Mutex: a map update per transcript, never held across an await.
    calls: Mutex<HashMap<String, LiveCall>>,
    feed: broadcast::Sender<(String, LiveEvent)>,
}

impl Default for LiveCalls {
    fn default() -> Self {
        Self {
            calls: Default::default(),
            feed: broadcast::channel(1024).0,
        }
    }
}

impl LiveCalls {
    /// The organisation's calls in progress, oldest first.
    pub fn of_org(&self, org_id: &str) -> Vec<LiveCall> {
        let calls = self
            .calls
            .lock()
            .expect("live call map lock is never poisoned");
        let mut list: Vec<LiveCall> = calls
            .values()
            .filter(|c| c.org_id == org_id)
            .cloned()
            .collect();
        list.sort_by(|a, b| a.started_at.cmp(&b.started_at));
        list
    }

    /// Everything that happens from now on: (organisation id, event).
    pub fn subscribe(&self) -> broadcast::Receiver<(String, LiveEvent)> {
        self.feed.subscribe()
    }

    fn publish(&self, org_id: String, event: LiveEvent) {
        // Nobody watching is fine.
        let _ = self.feed.send((org_id, event));
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
            started_at: crate::clock::rfc3339(crate::clock::now_ms()),
            lines: Vec::new(),
        };
        self.calls
            .lock()
            .expect("live call map lock is never poisoned")
            .insert(call.call_id.clone(), live.clone());
        self.publish(call.org_id.clone(), LiveEvent::Opened { call: live });
    }

    fn transcript(&self, call_id: &str, channel: usize, offset_secs: f64, text: &str) {
        let line = LiveLine {
            channel,
            offset: round3(offset_secs),
            text: text.to_owned(),
        };
        let org = {
            let mut calls = self
                .calls
                .lock()
                .expect("live call map lock is never poisoned");
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

    fn ended(&self, call_id: &str) {
        let removed = self
            .calls
            .lock()
            .expect("live call map lock is never poisoned")
            .remove(call_id);
        if let Some(call) = removed {
            self.publish(
                call.org_id,
                LiveEvent::Ended {
                    call_id: call_id.to_owned(),
                },
            );
        }
    }
}
