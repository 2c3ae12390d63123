//! Who is served next when the model has room: the waiting requests of every organisation, in
//! three classes, and the rules that share the model's places between them. No I/O and no
//! clock: [`FairQueue::push`] files a request, [`FairQueue::admit`] names the next one to run,
//! [`FairQueue::finish`] frees its place. `fair_provider.rs` drives it for a provider.
//!
//! The rules, in order:
//! - `live` (a call's `analyze`) goes first, and has one place of its own besides the
//!   `parallel` ones, so a live analysis never waits for a chat or a file to finish;
//! - `interactive` (REST and realtime chat) next, and `batch` (a file's analyses) last; but
//!   when both wait, every fourth place goes to batch, so batch work always finishes;
//! - batch never holds every place: at most `parallel - 1` (at least one);
//! - no organisation holds every place either: at most `parallel - 1` of its requests run at
//!   once (at least one), so another organisation always finds a place within one finished
//!   request, never behind all of the first one's;
//! - within a class, the organisation with the fewest requests running goes first, and among
//!   equals the one served least recently (round robin);
//! - an organisation may have at most `queue_per_org` interactive requests waiting (past that,
//!   [`Refused::Tenant`]: that organisation is told to retry, nobody else is), and at most
//!   `queue` interactive requests wait in all ([`Refused::Full`]). Live and batch requests are
//!   not refused here: how many can exist is bounded where they come from (calls take turns
//!   for their analyses, files are capped per organisation).

use std::collections::{BTreeMap, HashMap, VecDeque};

/// What a model request is for, which decides its turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Class {
    /// A live call's intent, asked for mid-call: first.
    Live,
    /// A chat turn someone waits for (REST and realtime).
    #[default]
    Interactive,
    /// A file's analyses: last, but never starved.
    Batch,
}

impl Class {
    /// Every class, in the order they are served.
    pub const ALL: [Class; 3] = [Class::Live, Class::Interactive, Class::Batch];

    fn index(self) -> usize {
        match self {
            Class::Live => 0,
            Class::Interactive => 1,
            Class::Batch => 2,
        }
    }

    /// The class's name, for metrics and logs.
    pub fn name(self) -> &'static str {
        match self {
            Class::Live => "live",
            Class::Interactive => "interactive",
            Class::Batch => "batch",
        }
    }
}

/// How the places are shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FairSettings {
    /// Requests served at once besides the live class's own place.
    pub parallel: usize,
    /// Interactive requests that may wait, in all.
    pub queue: usize,
    /// Interactive requests one organisation may have waiting.
    pub queue_per_org: usize,
}

/// Why a request was not filed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Every organisation's waiting room is full.
    Full,
    /// The requesting organisation has as many waiting as it may.
    Tenant,
}

/// Interactive places given in a row while batch work waits, before one goes to batch.
const BATCH_EVERY: u32 = 3;

/// A request let through: run it, then call [`FairQueue::finish`] with its organisation and
/// class.
#[derive(Debug, PartialEq, Eq)]
pub struct Admitted<T> {
    /// The id [`FairQueue::push`] gave it.
    pub id: u64,
    /// Its organisation.
    pub org: String,
    /// Its class.
    pub class: Class,
    /// What was filed.
    pub item: T,
}

/// The waiting requests and the places taken.
#[derive(Debug)]
pub struct FairQueue<T> {
    settings: FairSettings,
    /// Per class, per organisation, in arrival order.
    waiting: [BTreeMap<String, VecDeque<(u64, T)>>; 3],
    /// Interactive requests waiting, in all.
    interactive_waiting: usize,
    /// Requests running, per class and per organisation.
    running: [usize; 3],
    running_by_org: HashMap<String, usize>,
    /// When each organisation was last let through (a counter, not a clock).
    served_at: HashMap<String, u64>,
    turn: u64,
    next_id: u64,
    /// Interactive places given in a row while batch work waited.
    interactive_run: u32,
}

impl<T> FairQueue<T> {
    /// An empty queue sharing `settings.parallel` places (at least one).
    pub fn new(settings: FairSettings) -> Self {
        Self {
            settings: FairSettings {
                parallel: settings.parallel.max(1),
                ..settings
            },
            waiting: Default::default(),
            interactive_waiting: 0,
            running: [0; 3],
            running_by_org: HashMap::new(),
            served_at: HashMap::new(),
            turn: 0,
            next_id: 0,
            interactive_run: 0,
        }
    }

    /// Files `item` of `org` in `class`; its id, or why it is refused.
    pub fn push(&mut self, org: &str, class: Class, item: T) -> Result<u64, Refused> {
        if class == Class::Interactive {
            if self.interactive_waiting >= self.settings.queue {
                return Err(Refused::Full);
            }
            let mine = self.waiting[class.index()]
                .get(org)
                .map_or(0, VecDeque::len);
            if mine >= self.settings.queue_per_org {
                return Err(Refused::Tenant);
            }
            self.interactive_waiting += 1;
        }
        let id = self.next_id;
        self.next_id += 1;
        self.waiting[class.index()]
            .entry(org.to_owned())
            .or_default()
            .push_back((id, item));
        Ok(id)
    }

    /// Takes back a request still waiting (its requester left); `None` once it was admitted.
    pub fn cancel(&mut self, id: u64) -> Option<T> {
        for class in Class::ALL {
            let queues = &mut self.waiting[class.index()];
            let found = queues.iter_mut().find_map(|(org, queue)| {
                let at = queue.iter().position(|(i, _)| *i == id)?;
                Some((org.clone(), queue.remove(at)?))
            });
            if let Some((org, (_, item))) = found {
                if queues.get(&org).is_some_and(VecDeque::is_empty) {
                    queues.remove(&org);
                }
                if class == Class::Interactive {
                    self.interactive_waiting -= 1;
                }
                return Some(item);
            }
        }
        None
    }

    fn running_total(&self) -> usize {
        self.running.iter().sum()
    }

    fn org_running(&self, org: &str) -> usize {
        self.running_by_org.get(org).copied().unwrap_or(0)
    }

    /// Most requests of one class or one organisation running at once (not live).
    fn share(&self) -> usize {
        self.settings.parallel.saturating_sub(1).max(1)
    }

    /// Whether a request of `class` fits the places now, whoever sends it.
    fn room_for(&self, class: Class) -> bool {
        let parallel = self.settings.parallel;
        let others = self.running[Class::Interactive.index()] + self.running[Class::Batch.index()];
        match class {
            Class::Live => self.running_total() < parallel + 1,
            Class::Interactive => others < parallel && self.running_total() < parallel + 1,
            Class::Batch => {
                others < parallel
                    && self.running_total() < parallel + 1
                    && self.running[Class::Batch.index()] < self.share()
            }
        }
    }

    /// The organisation of `class` to serve next, if any may run now.
    fn pick(&self, class: Class) -> Option<String> {
        if !self.room_for(class) {
            return None;
        }
        self.waiting[class.index()]
            .keys()
            .filter(|org| class == Class::Live || self.org_running(org) < self.share())
            .min_by_key(|org| {
                (
                    self.org_running(org),
                    self.served_at.get(*org).copied().unwrap_or(0),
                )
            })
            .cloned()
    }

    /// The next request to run, taking its place; `None` when none may run now.
    pub fn admit(&mut self) -> Option<Admitted<T>> {
        let (class, org) = match self.pick(Class::Live) {
            Some(org) => (Class::Live, org),
            None => {
                let interactive = self.pick(Class::Interactive);
                let batch = self.pick(Class::Batch);
                match (interactive, batch) {
                    (Some(_), Some(b)) if self.interactive_run >= BATCH_EVERY => (Class::Batch, b),
                    (Some(i), batch) => {
                        if batch.is_some() {
                            self.interactive_run += 1;
                        }
                        (Class::Interactive, i)
                    }
                    (None, Some(b)) => (Class::Batch, b),
                    (None, None) => return None,
                }
            }
        };
        if class == Class::Batch {
            self.interactive_run = 0;
        }
        let queues = &mut self.waiting[class.index()];
        let queue = queues
            .get_mut(&org)
            .expect("picked among the non-empty queues");
        let (id, item) = queue.pop_front().expect("queues are removed once empty");
        if queue.is_empty() {
            queues.remove(&org);
        }
        if class == Class::Interactive {
            self.interactive_waiting -= 1;
        }
        self.running[class.index()] += 1;
        *self.running_by_org.entry(org.clone()).or_default() += 1;
        self.turn += 1;
        self.served_at.insert(org.clone(), self.turn);
        Some(Admitted {
            id,
            org,
            class,
            item,
        })
    }

    /// A request [`FairQueue::admit`] let through has finished: its place is free.
    pub fn finish(&mut self, org: &str, class: Class) {
        let running = &mut self.running[class.index()];
        *running = running.saturating_sub(1);
        if let Some(n) = self.running_by_org.get_mut(org) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.running_by_org.remove(org);
                // Nothing of it runs or waits: forget when it was served, so the map stays
                // as small as the organisations present.
                if self.waiting.iter().all(|w| !w.contains_key(org)) {
                    self.served_at.remove(org);
                }
            }
        }
    }

    /// Requests waiting in `class`.
    pub fn waiting(&self, class: Class) -> usize {
        self.waiting[class.index()]
            .values()
            .map(VecDeque::len)
            .sum()
    }

    /// Requests running in `class`.
    pub fn running(&self, class: Class) -> usize {
        self.running[class.index()]
    }

    /// `org`'s interactive requests waiting.
    pub fn waiting_of(&self, org: &str) -> usize {
        self.waiting[Class::Interactive.index()]
            .get(org)
            .map_or(0, VecDeque::len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(parallel: usize) -> FairQueue<&'static str> {
        FairQueue::new(FairSettings {
            parallel,
            queue: 16,
            queue_per_org: 4,
        })
    }

    fn admit_all<T>(q: &mut FairQueue<T>) -> Vec<T> {
        std::iter::from_fn(|| q.admit().map(|a| a.item)).collect()
    }

    #[test]
    fn another_organisation_gets_a_place_while_one_floods() {
        let mut q = queue(4);
        for name in ["a1", "a2", "a3", "a4"] {
            q.push("a", Class::Interactive, name).unwrap();
        }
        // One organisation alone gets every place but one.
        assert_eq!(admit_all(&mut q), ["a1", "a2", "a3"]);
        q.push("b", Class::Interactive, "b1").unwrap();
        // The place left goes to the newcomer, not to the flood's fourth request.
        assert_eq!(admit_all(&mut q), ["b1"]);
        q.finish("a", Class::Interactive);
        assert_eq!(admit_all(&mut q), ["a4"]);
    }

    #[test]
    fn among_equals_organisations_take_turns() {
        let mut q = queue(1);
        for (org, name) in [
            ("a", "a1"),
            ("a", "a2"),
            ("b", "b1"),
            ("c", "c1"),
            ("b", "b2"),
        ] {
            q.push(org, Class::Interactive, name).unwrap();
        }
        let mut order = Vec::new();
        while let Some(a) = q.admit() {
            order.push(a.item);
            q.finish(&a.org, a.class);
        }
        assert_eq!(order, ["a1", "b1", "c1", "a2", "b2"]);
    }

    #[test]
    fn live_goes_first_and_has_a_place_of_its_own() {
        let mut q = queue(2);
        q.push("a", Class::Interactive, "chat").unwrap();
        q.push("b", Class::Interactive, "chat2").unwrap();
        q.push("c", Class::Batch, "file").unwrap();
        q.push("d", Class::Live, "analyze").unwrap();
        assert_eq!(admit_all(&mut q), ["analyze", "chat", "chat2"]);
        // Every place is taken; a second live request waits for any of them.
        q.push("e", Class::Live, "analyze2").unwrap();
        assert!(q.admit().is_none());
        q.finish("a", Class::Interactive);
        // Live before the batch work that waited longer.
        assert_eq!(admit_all(&mut q), ["analyze2"]);
        q.finish("d", Class::Live);
        assert_eq!(admit_all(&mut q), ["file"]);
    }

    #[test]
    fn batch_never_holds_every_place_and_is_never_starved() {
        let mut q = queue(3);
        for name in ["f1", "f2", "f3"] {
            q.push("a", Class::Batch, name).unwrap();
        }
        for name in ["g1", "g2"] {
            q.push("b", Class::Batch, name).unwrap();
        }
        // Batch takes at most parallel - 1 places: one is left for chat.
        assert_eq!(admit_all(&mut q), ["f1", "g1"]);
        q.push("c", Class::Interactive, "chat").unwrap();
        assert_eq!(admit_all(&mut q), ["chat"]);
        let mut running = vec![
            ("a".to_owned(), Class::Batch),
            ("b".to_owned(), Class::Batch),
            ("c".to_owned(), Class::Interactive),
        ];
        // Chats keep coming while batch waits; the oldest running request finishes each
        // round. Batch still gets about a place in four.
        let mut batch_served = 0;
        for _ in 0..16 {
            for org in ["x", "y"] {
                if q.waiting_of(org) < 2 {
                    q.push(org, Class::Interactive, "chat").unwrap();
                }
            }
            let (org, class) = running.remove(0);
            q.finish(&org, class);
            while let Some(a) = q.admit() {
                if a.class == Class::Batch {
                    batch_served += 1;
                }
                running.push((a.org, a.class));
            }
        }
        assert_eq!(q.waiting(Class::Batch), 0, "the batch work finished");
        assert_eq!(batch_served, 3);
    }

    #[test]
    fn waiting_rooms_are_bounded_per_organisation_and_in_all() {
        let mut q = FairQueue::new(FairSettings {
            parallel: 1,
            queue: 5,
            queue_per_org: 2,
        });
        q.push("a", Class::Interactive, ()).unwrap();
        q.push("a", Class::Interactive, ()).unwrap();
        assert_eq!(q.push("a", Class::Interactive, ()), Err(Refused::Tenant));
        // Others are not held back by it.
        q.push("b", Class::Interactive, ()).unwrap();
        q.push("b", Class::Interactive, ()).unwrap();
        q.push("c", Class::Interactive, ()).unwrap();
        assert_eq!(q.push("d", Class::Interactive, ()), Err(Refused::Full));
        // Live and batch are bounded where they come from, never refused here.
        q.push("a", Class::Live, ()).unwrap();
        q.push("a", Class::Batch, ()).unwrap();
        // A request taken back frees its room.
        let id = q.push("c", Class::Interactive, ());
        assert_eq!(id, Err(Refused::Full));
        // Live first (its own place), then a chat: one waiting room freed.
        assert_eq!(q.admit().unwrap().class, Class::Live);
        assert_eq!(q.admit().unwrap().class, Class::Interactive);
        let id = q.push("d", Class::Interactive, ()).unwrap();
        assert_eq!(q.cancel(id), Some(()));
        assert_eq!(q.cancel(id), None);
        assert_eq!(q.waiting(Class::Interactive), 4);
    }
}
