//! A provider shared fairly between organisations: requests wait for their turn in a
//! [`FairQueue`] (per organisation, three classes) and at most `parallel` of them (and one
//! live analysis besides) reach the model at once; the embedded model runs those side by side
//! (continuous batching), an upstream server gets them as concurrent calls.
//!
//! A request whose requester leaves while it waits is taken out of the queue; one that runs
//! gives its place back however it ends. An organisation that has too many requests waiting
//! is answered [`LlmError::OrgBusy`] with a wait estimated from how long requests take, and
//! nobody else is held back by it.

use parking_lot::Mutex;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::fair::{Class, FairQueue, FairSettings, Refused};
use super::{Completion, Deltas, Generation, LlmError, Message, Provider};

/// A place to run, given by the queue; dropping it gives the place back.
struct Place {
    shared: Arc<Shared>,
    org: String,
    class: Class,
    since: Instant,
    /// Whether the request ran (a place whose requester had gone never did).
    ran: bool,
}

impl Drop for Place {
    fn drop(&mut self) {
        let took = self.ran.then(|| self.since.elapsed());
        self.shared.finished(&self.org, self.class, took);
    }
}

struct Shared {
    // A parking_lot Mutex: queue operations only, never held across an await.
    queue: Mutex<FairQueue<oneshot::Sender<Place>>>,
    /// How long a request takes to run, smoothed (seconds): what a refused organisation is
    /// told to wait.
    mean_s: Mutex<f64>,
    parallel: usize,
}

impl Shared {
    /// Lets through whatever may run now.
    fn dispatch(self: &Arc<Self>) {
        loop {
            let admitted = self.queue.lock().admit();
            let Some(admitted) = admitted else { return };
            let place = Place {
                shared: self.clone(),
                org: admitted.org,
                class: admitted.class,
                since: Instant::now(),
                ran: false,
            };
            // A requester gone since: dropping the place frees it again (and dispatches).
            let _ = admitted.item.send(place);
        }
    }

    fn finished(self: &Arc<Self>, org: &str, class: Class, took: Option<Duration>) {
        if let Some(took) = took {
            let mut mean = self.mean_s.lock();
            *mean = 0.8 * *mean + 0.2 * took.as_secs_f64();
        }
        self.queue.lock().finish(org, class);
        self.dispatch();
    }
}

/// Takes a request out of the queue when its requester leaves before its turn.
struct Waiting<'a> {
    shared: &'a Arc<Shared>,
    id: Option<u64>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            self.shared.queue.lock().cancel(id);
        }
    }
}

/// `inner`, shared fairly.
pub struct FairProvider {
    inner: Arc<dyn Provider>,
    shared: Arc<Shared>,
}

impl FairProvider {
    /// `inner` behind a fair queue with `settings`.
    pub fn new(inner: Arc<dyn Provider>, settings: FairSettings) -> Self {
        Self {
            inner,
            shared: Arc::new(Shared {
                queue: Mutex::new(FairQueue::new(settings)),
                mean_s: Mutex::new(2.0),
                parallel: settings.parallel.max(1),
            }),
        }
    }

    /// Requests waiting and running in each class, in [`Class::ALL`]'s order.
    pub fn load(&self) -> [(usize, usize); 3] {
        let q = self.shared.queue.lock();
        Class::ALL.map(|c| (q.waiting(c), q.running(c)))
    }

    /// What an organisation with `waiting` requests queued is told to wait.
    fn retry_after(&self, waiting: usize) -> Duration {
        let mean = *self.shared.mean_s.lock();
        let turns = (waiting as f64 / self.shared.parallel as f64).max(1.0);
        Duration::from_secs_f64((mean * turns).clamp(1.0, 60.0).ceil())
    }
}

#[async_trait::async_trait]
impl Provider for FairProvider {
    async fn generate(
        &self,
        generation: Generation,
        deltas: Deltas,
    ) -> Result<Completion, LlmError> {
        let org = generation.tenant.clone().unwrap_or_default();
        let (tx, rx) = oneshot::channel();
        let pushed = self.shared.queue.lock().push(&org, generation.class, tx);
        let id = match pushed {
            Ok(id) => id,
            Err(Refused::Full) => return Err(LlmError::Busy),
            Err(Refused::Tenant) => {
                let waiting = self.shared.queue.lock().waiting_of(&org);
                return Err(LlmError::OrgBusy {
                    waiting,
                    retry_after: self.retry_after(waiting),
                });
            }
        };
        let mut waiting = Waiting {
            shared: &self.shared,
            id: Some(id),
        };
        self.shared.dispatch();
        let mut place = rx
            .await
            .map_err(|_| LlmError::Engine("the model's queue was dropped".into()))?;
        waiting.id = None;
        place.ran = true;
        place.since = Instant::now();
        let result = self.inner.generate(generation, deltas).await;
        drop(place);
        result
    }

    fn name(&self) -> &str {
        self.inner.name()
    }

    fn keeps_to_any_schema(&self) -> bool {
        self.inner.keeps_to_any_schema()
    }

    fn gives_odds(&self) -> bool {
        self.inner.gives_odds()
    }

    fn prefill(&self, messages: Vec<Message>, tenant: Option<String>, class: Class) {
        self.inner.prefill(messages, tenant, class);
    }

    fn stop(&self, within: Duration) -> bool {
        self.inner.stop(within)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::{FinishReason, Usage};

    /// Answers after `ms` milliseconds per requested token, recording who ran when.
    struct Paced(Arc<Mutex<Vec<(String, &'static str)>>>);

    #[async_trait::async_trait]
    impl Provider for Paced {
        async fn generate(&self, g: Generation, _: Deltas) -> Result<Completion, LlmError> {
            let who = g.tenant.clone().unwrap_or_default();
            self.0.lock().push((who.clone(), "start"));
            tokio::time::sleep(Duration::from_millis(
                100 * u64::from(g.sampling.max_tokens),
            ))
            .await;
            self.0.lock().push((who, "end"));
            Ok(Completion {
                text: String::new(),
                tool_calls: Vec::new(),
                usage: Usage::default(),
                finish: FinishReason::Stop,
                odds: Vec::new(),
            })
        }

        fn name(&self) -> &str {
            "paced"
        }
    }

    fn ask(org: &str, class: Class, tokens: u32) -> Generation {
        Generation {
            messages: Vec::new(),
            tools: Vec::new(),
            sampling: crate::llm::Sampling {
                max_tokens: tokens,
                ..Default::default()
            },
            json_schema: None,
            response_format: None,
            odds: None,
            tenant: Some(org.to_owned()),
            class,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_short_request_runs_beside_a_flood_and_a_gone_requester_frees_its_turn() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let fair = Arc::new(FairProvider::new(
            Arc::new(Paced(log.clone())),
            FairSettings {
                parallel: 2,
                queue: 16,
                queue_per_org: 3,
            },
        ));
        // Organisation a floods with long requests: one runs (its share of two places), three
        // wait, the fourth is refused with a wait to retry after.
        let mut flood = Vec::new();
        for _ in 0..4 {
            let fair = fair.clone();
            flood.push(tokio::spawn(async move {
                fair.generate(ask("a", Class::Interactive, 100), None).await
            }));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        let refused = fair.generate(ask("a", Class::Interactive, 1), None).await;
        match refused {
            Err(LlmError::OrgBusy {
                waiting,
                retry_after,
            }) => {
                assert_eq!(waiting, 3);
                assert!(retry_after >= Duration::from_secs(1));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(fair.load()[1], (3, 1));
        // Organisation b is served at once, beside a's running request.
        fair.generate(ask("b", Class::Interactive, 2), None)
            .await
            .unwrap();
        let ran: Vec<_> = log.lock().clone();
        assert_eq!(
            ran,
            [
                ("a".to_owned(), "start"),
                ("b".to_owned(), "start"),
                ("b".to_owned(), "end")
            ]
        );
        // A waiting requester that leaves is taken out of the queue.
        for task in flood.drain(1..) {
            task.abort();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(fair.load()[1], (0, 1));
        flood.remove(0).await.unwrap().unwrap();
        assert_eq!(fair.load()[1], (0, 0));
    }
}
