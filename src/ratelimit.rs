//! Per-key request rate limiting with GCRA (the generic cell rate algorithm).
//!
//! Each key keeps one number, its theoretical arrival time (TAT). A plan of `rpm` requests per
//! minute spaces requests by `T = 60 s / rpm` and tolerates a burst of up to `rpm` requests, so
//! a client never gets more than `rpm` in any minute yet is not forced to pace them evenly.
//! Time is passed in, so the algorithm is tested without sleeping.
//!
//! This is the in-process state (`store::shared::Local`, with the embedded store); instances
//! sharing PostgreSQL keep the same algorithm in a row per key, on the database's clock
//! (`store::postgres`).

use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Entries are pruned when the table grows past this many keys.
const PRUNE_AT: usize = 10_000;

/// Shared GCRA state of every key.
#[derive(Debug)]
pub struct RateLimiter {
    epoch: Instant,
    // A parking_lot Mutex: the critical section is a hash lookup and two additions, never held across
    // an await, so an async mutex would only add cost.
    tats: Mutex<HashMap<String, Duration>>,
}

impl Default for RateLimiter {
    fn default() -> Self {
        Self::new(Instant::now())
    }
}

impl RateLimiter {
    /// An empty limiter whose clock starts at `epoch`.
    pub fn new(epoch: Instant) -> Self {
        Self {
            epoch,
            tats: Mutex::new(HashMap::new()),
        }
    }

    /// Counts one request of `key` at `now` against `rpm`. `Err` carries how long to wait
    /// before a request would be allowed; a refused request is not counted.
    pub fn check(&self, key: &str, rpm: u32, now: Instant) -> Result<(), Duration> {
        let interval = Duration::from_secs(60) / rpm.max(1);
        let tolerance = Duration::from_secs(60).saturating_sub(interval);
        let now = now.saturating_duration_since(self.epoch);
        let mut tats = self.tats.lock();
        if tats.len() >= PRUNE_AT {
            tats.retain(|_, tat| *tat > now);
        }
        let tat = tats.get(key).copied().unwrap_or(now).max(now);
        let ahead = tat - now;
        if ahead > tolerance {
            return Err(ahead - tolerance);
        }
        tats.insert(key.to_owned(), tat + interval);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allows_a_burst_of_rpm_then_paces() {
        let t0 = Instant::now();
        let rl = RateLimiter::new(t0);
        for _ in 0..6 {
            rl.check("k", 6, t0).unwrap();
        }
        let wait = rl.check("k", 6, t0).unwrap_err();
        assert_eq!(wait, Duration::from_secs(10));
        // Just before the wait is over: still refused; at it: allowed once.
        assert!(rl.check("k", 6, t0 + Duration::from_millis(9_999)).is_err());
        rl.check("k", 6, t0 + Duration::from_secs(10)).unwrap();
        assert!(rl.check("k", 6, t0 + Duration::from_secs(10)).is_err());
    }

    #[test]
    fn keys_are_independent_and_idle_keys_refill() {
        let t0 = Instant::now();
        let rl = RateLimiter::new(t0);
        rl.check("a", 1, t0).unwrap();
        assert!(rl.check("a", 1, t0).is_err());
        rl.check("b", 1, t0).unwrap();
        rl.check("a", 1, t0 + Duration::from_secs(60)).unwrap();
    }

    #[test]
    fn long_run_rate_is_rpm_after_the_burst() {
        let t0 = Instant::now();
        let rl = RateLimiter::new(t0);
        let mut allowed = Vec::new();
        // A greedy client: every 250 ms it sends until it is refused.
        for ms in (0..180_000u64).step_by(250) {
            while rl.check("k", 20, t0 + Duration::from_millis(ms)).is_ok() {
                allowed.push(ms);
            }
        }
        // A burst of 20 at once, then one every 60 s / 20 = 3 s.
        assert!(allowed[..20].iter().all(|&t| t == 0));
        let paced: Vec<u64> = allowed[20..].to_vec();
        assert_eq!(paced, (1..60).map(|i| i * 3_000).collect::<Vec<_>>());
    }
}
