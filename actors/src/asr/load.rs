//! How far behind the speech workers are on live work, as admission control reads it: the
//! audio waiting in the live queue, and how long live utterances have recently waited for a
//! worker. The pool updates it as jobs are queued and taken; readers never block it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// How fast a recent wait is forgotten: after this long it counts for 1/e of itself.
const WAIT_MEMORY: Duration = Duration::from_secs(5);

/// The live queue's backlog and recent waits.
#[derive(Debug)]
pub struct LiveLoad {
    /// Milliseconds of live audio queued and not yet taken by a worker.
    queued_ms: AtomicU64,
    /// The longest recent wait of a live utterance for a worker, decaying with time.
    wait: Mutex<Decaying>,
}

impl Default for LiveLoad {
    fn default() -> Self {
        Self {
            queued_ms: AtomicU64::new(0),
            wait: Mutex::new(Decaying::new(Instant::now())),
        }
    }
}

impl LiveLoad {
    /// `audio_ms` of live audio was queued.
    pub(super) fn queued(&self, audio_ms: u64) {
        self.queued_ms.fetch_add(audio_ms, Ordering::Relaxed);
    }

    /// `audio_ms` of live audio left the queue without being taken (refused, or the pool
    /// stopped).
    pub(super) fn unqueued(&self, audio_ms: u64) {
        let _ = self
            .queued_ms
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |q| {
                Some(q.saturating_sub(audio_ms))
            });
    }

    /// A worker took `audio_ms` of live audio that had waited `waited` in the queue, while
    /// `calls` live calls were in progress.
    pub(super) fn taken(&self, audio_ms: u64, waited: Duration, now: Instant, calls: usize) {
        self.unqueued(audio_ms);
        self.wait.lock().raise(waited, now, calls);
    }

    /// Milliseconds of live audio waiting for a worker now.
    pub fn queued_ms(&self) -> u64 {
        self.queued_ms.load(Ordering::Relaxed)
    }

    /// The longest recent wait of a live utterance for a worker, as of `now`: a wait of `w`
    /// seen `t` ago counts as `w * e^(-t / 5 s)`.
    pub fn recent_wait(&self, now: Instant) -> Duration {
        self.wait.lock().at(now)
    }

    /// [`LiveLoad::recent_wait`], and how many live calls were in progress when it was seen:
    /// a wait seen under more calls than are in progress now says little about now.
    pub fn recent_wait_under(&self, now: Instant) -> (Duration, usize) {
        let wait = self.wait.lock();
        (wait.at(now), wait.calls)
    }
}

/// A value that decays exponentially with time and is raised to any larger one seen.
#[derive(Debug, Clone, Copy)]
struct Decaying {
    value: Duration,
    at: Instant,
    /// Live calls in progress when the value was last raised to a wait seen.
    calls: usize,
}

impl Decaying {
    fn new(now: Instant) -> Self {
        Self {
            value: Duration::ZERO,
            at: now,
            calls: 0,
        }
    }

    fn at(&self, now: Instant) -> Duration {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.value
            .mul_f64((-elapsed / WAIT_MEMORY.as_secs_f64()).exp())
    }

    fn raise(&mut self, seen: Duration, now: Instant, calls: usize) {
        let current = self.at(now);
        if seen >= current {
            self.calls = calls;
        }
        self.value = current.max(seen);
        self.at = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backlog_follows_what_is_queued_and_taken() {
        let load = LiveLoad::default();
        load.queued(3_000);
        load.queued(2_000);
        assert_eq!(load.queued_ms(), 5_000);
        load.taken(3_000, Duration::ZERO, Instant::now(), 1);
        assert_eq!(load.queued_ms(), 2_000);
        load.unqueued(2_000);
        // Never below zero, whatever the order of updates.
        load.unqueued(1_000);
        assert_eq!(load.queued_ms(), 0);
    }

    #[test]
    fn a_long_wait_is_remembered_for_seconds_then_forgotten() {
        let load = LiveLoad::default();
        let t0 = Instant::now();
        load.taken(1_000, Duration::from_millis(3_000), t0, 4);
        // A shorter wait after it does not hide it.
        load.taken(
            1_000,
            Duration::from_millis(100),
            t0 + Duration::from_millis(10),
            2,
        );
        // It was seen under 4 calls.
        assert_eq!(load.recent_wait_under(t0 + Duration::from_millis(10)).1, 4);
        let soon = load.recent_wait(t0 + Duration::from_secs(1));
        assert!(soon > Duration::from_millis(2_400), "{soon:?}");
        let later = load.recent_wait(t0 + Duration::from_secs(20));
        assert!(later < Duration::from_millis(100), "{later:?}");
        // A longer one replaces it at once.
        load.taken(
            1_000,
            Duration::from_secs(9),
            t0 + Duration::from_secs(20),
            6,
        );
        assert_eq!(
            load.recent_wait_under(t0 + Duration::from_secs(20)),
            (Duration::from_secs(9), 6)
        );
    }
}
