//! State that every instance of the service must see alike, besides the records of
//! [`Store`](super::Store): dashboard sessions, single-use sign-in form tokens, live-call
//! signature nonces (short-lived entries with an expiry), and rate limits (GCRA).
//!
//! [`Local`] keeps it in this process, which is right for the embedded sled store (one
//! instance per data directory); [`PgStore`](super::PgStore) keeps it in PostgreSQL, so a
//! nonce accepted by one instance is refused by the others and a key's requests per minute
//! are one budget whichever instance answers.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::StoreError;
use crate::auth::ratelimit::RateLimiter;
use crate::clock;

/// What a short-lived entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Space {
    /// A dashboard session: its id → the session as JSON.
    Session = 1,
    /// A sign-in form token, single use.
    SignInForm = 2,
    /// A live-call signature's `keyid` and nonce, refused again until it expires.
    Nonce = 3,
}

/// Short-lived shared entries and rate limits. Every method may block on the database.
pub trait SharedState: Send + Sync {
    /// Counts one event of `key` against `per_minute` (GCRA: a burst of up to `per_minute`,
    /// then one every `60 s / per_minute`). `Ok(Err(wait))`: refused, and not counted; a
    /// request would be allowed after `wait`. `now` paces the in-process state; a database
    /// uses its own clock, which every instance shares.
    fn rate(
        &self,
        key: &str,
        per_minute: u32,
        now: Instant,
    ) -> Result<Result<(), Duration>, StoreError>;

    /// Stores `value` under `key` until `expires_ms` (Unix ms) unless a live entry is there;
    /// `true` when stored.
    fn insert_new(
        &self,
        space: Space,
        key: &str,
        value: &str,
        expires_ms: i64,
    ) -> Result<bool, StoreError>;

    /// The live entry under `key`.
    fn get(&self, space: Space, key: &str) -> Result<Option<String>, StoreError>;

    /// Removes the entry under `key` and returns it if it was live: one caller gets it.
    fn take(&self, space: Space, key: &str) -> Result<Option<String>, StoreError>;
}

/// Entries kept in one process at most; past this the soonest to expire go first.
const LOCAL_MAX_ENTRIES: usize = 100_000;

/// [`SharedState`] in this process.
#[derive(Debug, Default)]
pub struct Local {
    limiter: RateLimiter,
    // A std Mutex: a map operation per call, never held across an await.
    entries: Mutex<HashMap<(Space, String), (String, i64)>>,
}

impl Local {
    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<(Space, String), (String, i64)>> {
        self.entries
            .lock()
            .expect("shared-entries lock is never poisoned: no panics inside")
    }
}

impl SharedState for Local {
    fn rate(
        &self,
        key: &str,
        per_minute: u32,
        now: Instant,
    ) -> Result<Result<(), Duration>, StoreError> {
        Ok(self.limiter.check(key, per_minute, now))
    }

    fn insert_new(
        &self,
        space: Space,
        key: &str,
        value: &str,
        expires_ms: i64,
    ) -> Result<bool, StoreError> {
        let now = clock::now_ms();
        let mut entries = self.entries();
        let id = (space, key.to_owned());
        if entries.get(&id).is_some_and(|(_, expires)| *expires > now) {
            return Ok(false);
        }
        if entries.len() >= LOCAL_MAX_ENTRIES {
            entries.retain(|_, (_, expires)| *expires > now);
        }
        if entries.len() >= LOCAL_MAX_ENTRIES {
            if let Some(soonest) = entries
                .iter()
                .min_by_key(|(_, (_, expires))| *expires)
                .map(|(k, _)| k.clone())
            {
                entries.remove(&soonest);
            }
        }
        entries.insert(id, (value.to_owned(), expires_ms));
        Ok(true)
    }

    fn get(&self, space: Space, key: &str) -> Result<Option<String>, StoreError> {
        let now = clock::now_ms();
        Ok(self
            .entries()
            .get(&(space, key.to_owned()))
            .filter(|(_, expires)| *expires > now)
            .map(|(value, _)| value.clone()))
    }

    fn take(&self, space: Space, key: &str) -> Result<Option<String>, StoreError> {
        let now = clock::now_ms();
        Ok(self
            .entries()
            .remove(&(space, key.to_owned()))
            .filter(|(_, expires)| *expires > now)
            .map(|(value, _)| value))
    }
}
