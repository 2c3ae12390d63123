//! Admission control for live calls: this instance takes a new call only while the calls it
//! already serves stay within their latency budget. Two measures decide:
//! - a ceiling on calls in progress here, whoever owns them, from what a call costs the speech
//!   workers on this machine: once the instance has served [`MEASURED_CALL_SECS`] of calls, as
//!   many calls as keep the workers' expected load within `calls.admit_max_load` (the engine
//!   time of live utterances per second of call, measured, times the calls, against the
//!   workers); before that, `calls.admit_unmeasured_calls`; never more than
//!   `calls.max_calls_per_instance`. Calls that start together are bounded by it before their
//!   first utterance is queued, and a faster CPU takes more calls without a setting changed;
//! - how far behind the speech workers are on live work: the longest recent wait of a live
//!   utterance for a worker, or the time the audio now waiting in the live queue will take to
//!   decode (its length times the measured decode time per second of audio, shared by the
//!   workers), whichever is longer, against `calls.admit_max_wait_ms`.
//!
//! A call over either is refused before the upgrade (`503` `at_capacity` with `Retry-After`),
//! so the platform retries it, on this instance later or on another now; the calls in progress
//! keep their workers. `/readyz` answers `503` `full` while a new call would be refused, so a
//! load balancer can send calls elsewhere. Refusals are counted for `/metrics` and per
//! organisation for the dashboard's live page.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use callstream_actors::asr::pool::AsrPool;

/// How far behind live speech work is, as measured by the pool.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LiveLag {
    /// The longest recent wait of a live utterance for a worker (decaying over seconds).
    pub recent_wait: Duration,
    /// Live calls in progress when that wait was seen.
    pub recent_wait_calls: usize,
    /// Live calls in progress now.
    pub calls: usize,
    /// Live audio waiting for a worker.
    pub queued: Duration,
    /// Decode time per second of audio, measured so far (0 before any decode).
    pub decode_per_audio: f64,
    /// Speech workers sharing the queue.
    pub workers: usize,
    /// What one live call costs the speech workers here: engine seconds of live utterances
    /// per second of call, averaged over the calls served so far (`None` until they add up to
    /// [`MEASURED_CALL_SECS`]).
    pub per_call: Option<f64>,
}

/// Seconds of live calls, summed over calls, after which what a call costs is taken as
/// measured: two calls of a minute each, or twelve of ten seconds.
pub const MEASURED_CALL_SECS: f64 = 120.0;

impl LiveLag {
    /// The pool's measures now.
    pub fn of(pool: &AsrPool) -> Self {
        let stats = pool.stats();
        let busy_ms = stats.busy_ms.load(Ordering::Relaxed);
        let audio_ms = stats.audio_ms.load(Ordering::Relaxed);
        let now = Instant::now();
        let (recent_wait, recent_wait_calls) = stats.live_load.recent_wait_under(now);
        let call_secs = stats.call_secs(now);
        let live_busy = stats.live_busy_ms.load(Ordering::Relaxed) as f64 / 1000.0;
        Self {
            recent_wait,
            recent_wait_calls,
            calls: stats.live_calls.load(Ordering::Acquire),
            queued: Duration::from_millis(stats.live_load.queued_ms()),
            decode_per_audio: if audio_ms == 0 {
                0.0
            } else {
                busy_ms as f64 / audio_ms as f64
            },
            workers: pool.workers(),
            per_call: (call_secs >= MEASURED_CALL_SECS).then(|| live_busy / call_secs),
        }
    }

    /// How long a live utterance queued now is expected to wait: the longer of the recent
    /// waits and the time the workers need for the audio ahead of it. A recent wait counts
    /// only while as many calls are in progress as when it was seen: after a burst of calls
    /// has ended, the wait it caused says nothing of the fewer calls left.
    pub fn expected_wait(&self) -> Duration {
        let drain = self
            .queued
            .mul_f64(self.decode_per_audio / self.workers.max(1) as f64);
        let recent = if self.calls >= self.recent_wait_calls {
            self.recent_wait
        } else {
            Duration::ZERO
        };
        recent.max(drain)
    }
}

/// Why a new call is refused.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
pub enum Full {
    /// As many calls as this instance takes are in progress.
    #[error("this instance is serving as many live calls as it takes ({ceiling})")]
    Ceiling {
        /// The ceiling in force ([`LiveCapacity::ceiling`]).
        ceiling: usize,
    },
    /// Live speech work is behind its budget.
    #[error("the live calls in progress are at their latency budget (live speech waits {} ms)", .waited.as_millis())]
    Behind {
        /// The expected wait of a live utterance.
        waited: Duration,
    },
}

impl Full {
    /// Whole seconds a platform should wait before it tries this instance again.
    pub fn retry_after_secs(&self) -> u64 {
        match self {
            // A place frees when any call ends; calls last minutes, so try again soon and
            // elsewhere meanwhile.
            Full::Ceiling { .. } => 5,
            // The backlog drains at about the rate it is measured in.
            Full::Behind { waited } => waited.as_secs().clamp(1, 30) + 1,
        }
    }

    /// The reason, for metrics and logs.
    pub fn reason(&self) -> &'static str {
        match self {
            Full::Ceiling { .. } => "ceiling",
            Full::Behind { .. } => "behind",
        }
    }
}

/// The places of live calls on this instance.
#[derive(Debug)]
pub struct LiveCapacity {
    limits: Limits,
    max_wait: Duration,
    taken: Arc<AtomicUsize>,
    refused_ceiling: AtomicU64,
    refused_behind: AtomicU64,
}

/// A call's place; dropping it frees the place.
#[derive(Debug)]
pub struct Place(Arc<AtomicUsize>);

impl Drop for Place {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How many calls an instance takes at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Never more (`calls.max_calls_per_instance`).
    pub most: usize,
    /// Until what a call costs is measured (`calls.admit_unmeasured_calls`).
    pub unmeasured: usize,
    /// Once it is: the share of the speech workers' time the calls may be expected to take
    /// (`calls.admit_max_load`).
    pub max_load: f64,
}

impl Limits {
    /// At most `most` calls, whatever they cost.
    pub fn fixed(most: usize) -> Self {
        Self {
            most,
            unmeasured: most,
            max_load: 1.0,
        }
    }
}

impl LiveCapacity {
    /// At most as many calls at once as `limits` allow under the measured cost of a call, and
    /// none taken while live speech is expected to wait more than `max_wait`.
    pub fn new(limits: Limits, max_wait: Duration) -> Self {
        Self {
            limits,
            max_wait,
            taken: Arc::new(AtomicUsize::new(0)),
            refused_ceiling: AtomicU64::new(0),
            refused_behind: AtomicU64::new(0),
        }
    }

    /// Whether a new call would be taken now, under `lag`.
    pub fn check(&self, lag: &LiveLag) -> Result<(), Full> {
        let ceiling = self.ceiling(lag);
        if self.taken.load(Ordering::Acquire) >= ceiling {
            return Err(Full::Ceiling { ceiling });
        }
        let waited = lag.expected_wait();
        if waited > self.max_wait {
            return Err(Full::Behind { waited });
        }
        Ok(())
    }

    /// Takes a place for a new call under `lag`, or says why not (and counts the refusal).
    pub fn admit(&self, lag: &LiveLag) -> Result<Place, Full> {
        let refused = |full: Full| {
            match full {
                Full::Ceiling { .. } => &self.refused_ceiling,
                Full::Behind { .. } => &self.refused_behind,
            }
            .fetch_add(1, Ordering::Relaxed);
            full
        };
        self.check(lag).map_err(refused)?;
        // The ceiling again, atomically: two upgrades at once cannot both take the last place.
        let ceiling = self.ceiling(lag);
        self.taken
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < ceiling).then_some(n + 1)
            })
            .map_err(|_| refused(Full::Ceiling { ceiling }))?;
        Ok(Place(self.taken.clone()))
    }

    /// Places taken now.
    pub fn taken(&self) -> usize {
        self.taken.load(Ordering::Acquire)
    }

    /// Calls this instance takes at most under `lag`: as many as keep the speech workers'
    /// expected load within the limit at the measured cost of a call (at least one), or the
    /// unmeasured number before it is measured; never more than the most.
    pub fn ceiling(&self, lag: &LiveLag) -> usize {
        let Limits {
            most,
            unmeasured,
            max_load,
        } = self.limits;
        let measured = lag
            .per_call
            .filter(|c| *c > 0.0)
            .map(|c| (lag.workers.max(1) as f64 * max_load / c).floor() as usize);
        measured.unwrap_or(unmeasured).clamp(1, most.max(1))
    }

    /// Calls refused so far, by reason: (ceiling, behind).
    pub fn refused(&self) -> (u64, u64) {
        (
            self.refused_ceiling.load(Ordering::Relaxed),
            self.refused_behind.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idle() -> LiveLag {
        LiveLag {
            recent_wait: Duration::ZERO,
            recent_wait_calls: 0,
            calls: 0,
            queued: Duration::ZERO,
            decode_per_audio: 0.1,
            workers: 2,
            per_call: None,
        }
    }

    #[test]
    fn the_ceiling_follows_what_a_call_costs_once_it_is_measured() {
        let limits = Limits {
            most: 48,
            unmeasured: 12,
            max_load: 0.6,
        };
        let capacity = LiveCapacity::new(limits, Duration::from_millis(1500));
        // Not measured yet: the start number.
        assert_eq!(capacity.ceiling(&idle()), 12);
        // A call takes 0.04 s of engine time a second: 2 workers at 0.6 carry 30.
        let fast = LiveLag {
            per_call: Some(0.04),
            ..idle()
        };
        assert_eq!(capacity.ceiling(&fast), 30);
        // Slower, 0.12 s a second: 10, fewer than before it was measured.
        let slow = LiveLag {
            per_call: Some(0.12),
            ..idle()
        };
        assert_eq!(capacity.ceiling(&slow), 10);
        // Never past the most, never under one.
        let idle_calls = LiveLag {
            per_call: Some(0.001),
            ..idle()
        };
        assert_eq!(capacity.ceiling(&idle_calls), 48);
        let dear = LiveLag {
            per_call: Some(5.0),
            ..idle()
        };
        assert_eq!(capacity.ceiling(&dear), 1);
        // Admission refuses at the measured ceiling, naming it.
        let places: Vec<Place> = (0..10).map(|_| capacity.admit(&slow).unwrap()).collect();
        assert_eq!(
            capacity.admit(&slow).unwrap_err(),
            Full::Ceiling { ceiling: 10 }
        );
        assert!(capacity.admit(&fast).is_ok());
        drop(places);
    }

    #[test]
    fn a_wait_seen_under_more_calls_than_now_in_progress_does_not_refuse() {
        let capacity = LiveCapacity::new(Limits::fixed(100), Duration::from_millis(1500));
        // A burst of 12 calls left a 2.4 s wait; 3 calls are in progress now.
        let after_burst = LiveLag {
            recent_wait: Duration::from_millis(2400),
            recent_wait_calls: 12,
            calls: 3,
            ..idle()
        };
        assert_eq!(after_burst.expected_wait(), Duration::ZERO);
        assert!(capacity.admit(&after_burst).is_ok());
        // As many calls as then, or more: it counts.
        let as_many = LiveLag {
            calls: 12,
            ..after_burst
        };
        assert_eq!(as_many.expected_wait(), Duration::from_millis(2400));
        assert!(capacity.admit(&as_many).is_err());
    }

    #[test]
    fn the_ceiling_holds_and_a_place_is_freed_when_its_call_ends() {
        let capacity = LiveCapacity::new(Limits::fixed(2), Duration::from_secs(1));
        let a = capacity.admit(&idle()).unwrap();
        let _b = capacity.admit(&idle()).unwrap();
        assert_eq!(
            capacity.admit(&idle()).unwrap_err(),
            Full::Ceiling { ceiling: 2 }
        );
        assert!(capacity.check(&idle()).is_err());
        drop(a);
        assert_eq!(capacity.taken(), 1);
        let _c = capacity.admit(&idle()).unwrap();
        assert_eq!(capacity.refused(), (1, 0));
    }

    #[test]
    fn calls_are_refused_while_live_speech_is_behind_its_budget() {
        let capacity = LiveCapacity::new(Limits::fixed(100), Duration::from_millis(1500));
        // A recent long wait.
        let waited = LiveLag {
            recent_wait: Duration::from_secs(3),
            ..idle()
        };
        let full = capacity.admit(&waited).unwrap_err();
        assert_eq!(
            full,
            Full::Behind {
                waited: Duration::from_secs(3)
            }
        );
        assert_eq!(full.retry_after_secs(), 4);
        // A backlog that will take 2 s to decode: 40 s of audio at 0.1 s per second of audio
        // on two workers.
        let backlog = LiveLag {
            queued: Duration::from_secs(40),
            ..idle()
        };
        assert_eq!(backlog.expected_wait(), Duration::from_secs(2));
        assert!(capacity.admit(&backlog).is_err());
        // Within budget: taken, and nothing was held by the refusals.
        let within = LiveLag {
            queued: Duration::from_secs(20),
            recent_wait: Duration::from_millis(900),
            ..idle()
        };
        let _place = capacity.admit(&within).unwrap();
        assert_eq!(capacity.taken(), 1);
        assert_eq!(capacity.refused(), (0, 2));
    }

    #[test]
    fn before_any_decode_a_backlog_is_not_taken_for_a_delay() {
        let lag = LiveLag {
            queued: Duration::from_secs(60),
            decode_per_audio: 0.0,
            ..idle()
        };
        assert_eq!(lag.expected_wait(), Duration::ZERO);
    }
}
