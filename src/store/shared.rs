//! State that every instance of the service must see alike, besides the records of
//! [`Store`](super::Store): dashboard sessions, single-use sign-in form tokens, live-call
//! signature nonces (short-lived entries with an expiry), and rate limits (GCRA).
//!
//! [`Local`] keeps it in this process, which is right for the embedded sled store (one
//! instance per data directory); [`PgStore`](super::PgStore) keeps it in PostgreSQL, so a
//! nonce accepted by one instance is refused by the others and a key's requests per minute
//! are one budget whichever instance answers.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use callstream_actors::usage::{UsageError, UsageEvent, UsageKind, UsageSink};

use super::StoreError;
use crate::clock;
use crate::ratelimit::RateLimiter;

/// One organisation's pool in one month, as a reservation sees it.
#[derive(Debug, Clone, Copy)]
pub struct PoolRef<'a> {
    /// The organisation.
    pub org_id: &'a str,
    /// Which pool.
    pub kind: UsageKind,
    /// The plan's quota for the month; `None`: unlimited.
    pub quota: Option<u64>,
    /// The month's first day, `YYYY-MM-DD`.
    pub first_day: &'a str,
    /// The month's last day.
    pub last_day: &'a str,
}

/// Usage to write to the ledger.
#[derive(Debug, Clone, Copy)]
pub enum Write<'a> {
    /// One event, as [`UsageSink::record`].
    Event(&'a UsageEvent),
    /// Live calls' running totals, as [`UsageSink::checkpoint`].
    Totals(&'a [UsageEvent]),
}

impl Write<'_> {
    /// Writes to `ledger`.
    pub async fn to(self, ledger: &dyn UsageSink) -> Result<(), UsageError> {
        match self {
            Write::Event(event) => ledger.record(event).await,
            Write::Totals(totals) => ledger.checkpoint(totals).await,
        }
    }
}

/// What the ledger holds of a pool in the month: read by [`SharedState::reserve`] while it
/// holds the pool, when the state is kept beside the ledger rather than in it.
pub type Used<'a, 'f> =
    &'a (dyn Fn() -> futures_util::future::BoxFuture<'f, Result<u64, StoreError>> + Send + Sync);

/// A call in progress on another instance, for the dashboard.
#[derive(Debug, Clone)]
pub struct RemoteCall {
    /// The instance that runs it.
    pub instance: String,
    /// The call as the dashboard shows it, JSON.
    pub call: String,
}

/// What a short-lived entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Space {
    /// A dashboard session: its id → the session as JSON.
    Session = 1,
    /// A sign-in form token that was submitted (forms are single use); nothing is kept of a
    /// form that is only shown.
    SignInForm = 2,
    /// A live-call signature's `keyid` and nonce, refused again until it expires.
    Nonce = 3,
    /// Wrong passwords for an account from one address: how many in a row, and until when
    /// the next attempt waits.
    SignInFailures = 4,
}

impl Space {
    /// What the entries are, for messages.
    pub fn plural(self) -> &'static str {
        match self {
            Space::Session => "dashboard sessions",
            Space::SignInForm => "sign-in forms",
            Space::Nonce => "live-call signature nonces",
            Space::SignInFailures => "sign-in failure records",
        }
    }
}

/// Short-lived shared entries and rate limits. The async methods may wait on the database; the
/// others never wait.
#[async_trait::async_trait]
pub trait SharedState: Send + Sync {
    /// Counts one event of `key` against `per_minute` (GCRA: a burst of up to `per_minute`,
    /// then one every `60 s / per_minute`). `Ok(Err(wait))`: refused, and not counted; a
    /// request would be allowed after `wait`. `now` paces the in-process state; a database
    /// uses its own clock, which every instance shares.
    async fn rate(
        &self,
        key: &str,
        per_minute: u32,
        now: Instant,
    ) -> Result<Result<(), Duration>, StoreError>;

    /// Stores `value` under `key` until `expires_ms` (Unix ms) unless a live entry is there;
    /// `true` when stored.
    async fn insert_new(
        &self,
        space: Space,
        key: &str,
        value: &str,
        expires_ms: i64,
    ) -> Result<bool, StoreError>;

    /// The live entry under `key`.
    async fn get(&self, space: Space, key: &str) -> Result<Option<String>, StoreError>;

    /// Removes the entry under `key` and returns it if it was live: one caller gets it.
    async fn take(&self, space: Space, key: &str) -> Result<Option<String>, StoreError>;

    /// Reserves up to `want` of `pool`, at least `min` (else nothing): what is left is the
    /// quota minus `used` (the ledger's total of the month) minus what every instance holds
    /// reserved, checked and taken in one step. `None`: less than `min` (or nothing) is left.
    /// An unlimited pool grants `want` and holds nothing (its release finds nothing to give
    /// back).
    async fn reserve(
        &self,
        pool: PoolRef<'_>,
        want: u64,
        min: u64,
        used: Used<'_, '_>,
    ) -> Result<Option<u64>, StoreError>;

    /// What every instance holds reserved of `org_id`'s `kind` pool, as it stands once the
    /// settlements in flight have given theirs back: a quota check that reads the ledger
    /// first never sees work both there and still reserved.
    async fn reserved(&self, org_id: &str, kind: UsageKind) -> Result<u64, StoreError>;

    /// Gives back `amount` of this instance's reservations of the pool. Never waits: a database
    /// is written from a task of its own, in order, and this instance's next `reserve` or
    /// `reserved` sees it; a failure is logged (what stays held goes with the instance's rows).
    fn release(&self, org_id: &str, kind: UsageKind, amount: u64);

    /// Writes `usage` to `ledger` and gives back `release` (organisation, pool, amount) of this
    /// instance's reservations, as one step to [`SharedState::reserve`]: no reservation sees
    /// the usage twice (in the ledger and still reserved), which would refuse work that fits,
    /// nor not at all, which would let the pool be passed. When the write fails nothing is
    /// given back. A database that is also the ledger writes there itself, in the same
    /// transaction.
    async fn settle(
        &self,
        ledger: &dyn UsageSink,
        usage: Write<'_>,
        release: &[(&str, UsageKind, u64)],
    ) -> Result<(), UsageError>;

    /// Takes one of `cap` places under `name` (a cap: an organisation's live calls, realtime
    /// sessions or file transcriptions) for `holder`, counted over every live instance; `false`
    /// when all are taken. [`SharedState::leave_place`] gives it back; an instance that stops
    /// beating gives back all of its places with it.
    async fn take_place(&self, name: &str, holder: &str, cap: usize) -> Result<bool, StoreError>;

    /// Gives back a place taken with [`SharedState::take_place`]. Never waits: this instance's
    /// next [`SharedState::take_place`] sees it.
    fn leave_place(&self, name: &str, holder: &str);

    /// Announces this process as a running instance (heartbeat, its reservations and calls
    /// counted by the others). Services call it; one-off commands do not.
    async fn start_instance(&self) {}

    /// Says this instance is draining: it takes no new calls or sessions.
    async fn set_draining(&self) {}

    /// Withdraws this instance at a graceful exit: what it held reserved and listed is
    /// given back at once rather than when its heartbeat is found stale.
    async fn stop_instance(&self) {}

    /// A counter that moves when a key or connector is revoked or an organisation changes
    /// on any instance; `None` when only this process makes such changes (then watchers
    /// check on a timer instead).
    fn changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }

    /// Tells every instance that a key, connector or organisation changed.
    async fn announce_change(&self) {}

    /// Lists a call in progress here for the other instances' dashboards. Never waits.
    fn call_opened(&self, _call_id: &str, _org_id: &str, _call: &str) {}

    /// Removes a call listed with [`SharedState::call_opened`]. Never waits.
    fn call_ended(&self, _call_id: &str) {}

    /// The organisation's calls in progress on the other live instances.
    async fn remote_calls(&self, _org_id: &str) -> Vec<RemoteCall> {
        Vec::new()
    }

    /// Sends a live-page event (JSON) of `org_id` to the other instances. Never waits.
    fn publish_live(&self, _org_id: &str, _event: &str) {}

    /// Live-page events from the other instances: (organisation id, event JSON).
    fn remote_live(&self) -> Option<tokio::sync::broadcast::Receiver<(String, String)>> {
        None
    }
}

/// Entries of one [`Space`] kept in one process at most. A live entry is never dropped to make
/// room (a dropped nonce would let a captured handshake be replayed): past this, once expired
/// entries are cleared, a new entry is refused with [`StoreError::Full`]. Each space has its own
/// budget, so sign-in forms cannot crowd out nonces.
const LOCAL_MAX_ENTRIES: usize = 100_000;

/// The shortest time between two sweeps of a full space for expired entries, in ms: a flood
/// against a full space costs a lookup per request, not a sweep.
const SWEEP_EVERY_MS: i64 = 1_000;

/// The short-lived entries of one [`Space`].
#[derive(Debug, Default)]
struct Entries {
    map: HashMap<String, (String, i64)>,
    swept_ms: i64,
}

/// Locks over the pools, each pool hashed to one: see [`Local`].
const POOL_LOCKS: usize = 64;

/// [`SharedState`] in this process.
#[derive(Debug)]
pub struct Local {
    limiter: RateLimiter,
    // A parking_lot Mutex: a map operation per call, never held across an await.
    entries: Mutex<HashMap<Space, Entries>>,
    // A parking_lot Mutex: a map operation per call, never held across an await.
    reserved: Mutex<HashMap<(String, UsageKind), u64>>,
    // A parking_lot Mutex: a set operation per call, never held across an await.
    places: Mutex<HashMap<String, std::collections::HashSet<String>>>,
    // Per pool (hashed): a reservation takes it alone, to read the ledger and the
    // reservations as they stand; settlements take it together, so they share their fsyncs,
    // and a reservation waits for those in flight. Held across the ledger's read or write,
    // so an async lock.
    pools: Vec<tokio::sync::RwLock<()>>,
}

impl Default for Local {
    fn default() -> Self {
        Self {
            limiter: RateLimiter::default(),
            entries: Mutex::default(),
            reserved: Mutex::default(),
            places: Mutex::default(),
            pools: (0..POOL_LOCKS)
                .map(|_| tokio::sync::RwLock::new(()))
                .collect(),
        }
    }
}

impl Local {
    /// Which of the pool locks `org_id`'s `kind` pool takes.
    fn pool_lock(&self, org_id: &str, kind: UsageKind) -> usize {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (org_id, kind.tag()).hash(&mut hasher);
        (hasher.finish() % POOL_LOCKS as u64) as usize
    }

    fn reserved(&self) -> parking_lot::MutexGuard<'_, HashMap<(String, UsageKind), u64>> {
        self.reserved.lock()
    }

    fn entries(&self) -> parking_lot::MutexGuard<'_, HashMap<Space, Entries>> {
        self.entries.lock()
    }
}

#[async_trait::async_trait]
impl SharedState for Local {
    async fn rate(
        &self,
        key: &str,
        per_minute: u32,
        now: Instant,
    ) -> Result<Result<(), Duration>, StoreError> {
        Ok(self.limiter.check(key, per_minute, now))
    }

    async fn insert_new(
        &self,
        space: Space,
        key: &str,
        value: &str,
        expires_ms: i64,
    ) -> Result<bool, StoreError> {
        let now = clock::now_ms();
        let mut all = self.entries();
        let entries = all.entry(space).or_default();
        if entries
            .map
            .get(key)
            .is_some_and(|(_, expires)| *expires > now)
        {
            return Ok(false);
        }
        if entries.map.len() >= LOCAL_MAX_ENTRIES && now - entries.swept_ms >= SWEEP_EVERY_MS {
            entries.map.retain(|_, (_, expires)| *expires > now);
            entries.swept_ms = now;
        }
        if entries.map.len() >= LOCAL_MAX_ENTRIES && !entries.map.contains_key(key) {
            return Err(StoreError::Full(space.plural()));
        }
        entries
            .map
            .insert(key.to_owned(), (value.to_owned(), expires_ms));
        Ok(true)
    }

    async fn get(&self, space: Space, key: &str) -> Result<Option<String>, StoreError> {
        let now = clock::now_ms();
        Ok(self
            .entries()
            .get(&space)
            .and_then(|e| e.map.get(key))
            .filter(|(_, expires)| *expires > now)
            .map(|(value, _)| value.clone()))
    }

    async fn take(&self, space: Space, key: &str) -> Result<Option<String>, StoreError> {
        let now = clock::now_ms();
        Ok(self
            .entries()
            .get_mut(&space)
            .and_then(|e| e.map.remove(key))
            .filter(|(_, expires)| *expires > now)
            .map(|(value, _)| value))
    }

    async fn reserve(
        &self,
        pool: PoolRef<'_>,
        want: u64,
        min: u64,
        used: Used<'_, '_>,
    ) -> Result<Option<u64>, StoreError> {
        // An unlimited pool has nothing to hold back.
        let Some(quota) = pool.quota else {
            return Ok(Some(want));
        };
        let _alone = self.pools[self.pool_lock(pool.org_id, pool.kind)]
            .write()
            .await;
        let used = used().await?;
        let mut reserved = self.reserved();
        let key = (pool.org_id.to_owned(), pool.kind);
        let held = reserved.get(&key).copied().unwrap_or(0);
        let granted = want.min(quota.saturating_sub(used).saturating_sub(held));
        if granted < min.max(1) && want > 0 {
            return Ok(None);
        }
        *reserved.entry(key).or_insert(0) += granted;
        Ok(Some(granted))
    }

    async fn reserved(&self, org_id: &str, kind: UsageKind) -> Result<u64, StoreError> {
        // Alone on the pool, as `reserve` is: a settlement in flight (its usage already
        // readable in the ledger, its reservation not yet given back) is waited for, so a
        // quota check that read the ledger first never counts that work twice.
        let _alone = self.pools[self.pool_lock(org_id, kind)].write().await;
        Ok(self
            .reserved()
            .get(&(org_id.to_owned(), kind))
            .copied()
            .unwrap_or(0))
    }

    fn release(&self, org_id: &str, kind: UsageKind, amount: u64) {
        give_back(&mut self.reserved(), org_id, kind, amount);
    }

    async fn take_place(&self, name: &str, holder: &str, cap: usize) -> Result<bool, StoreError> {
        let mut places = self.places.lock();
        let taken = places.entry(name.to_owned()).or_default();
        if taken.contains(holder) {
            return Ok(true);
        }
        if taken.len() >= cap {
            if taken.is_empty() {
                places.remove(name);
            }
            return Ok(false);
        }
        taken.insert(holder.to_owned());
        Ok(true)
    }

    fn leave_place(&self, name: &str, holder: &str) {
        let mut places = self.places.lock();
        if let Some(taken) = places.get_mut(name) {
            taken.remove(holder);
            if taken.is_empty() {
                places.remove(name);
            }
        }
    }

    async fn settle(
        &self,
        ledger: &dyn UsageSink,
        usage: Write<'_>,
        release: &[(&str, UsageKind, u64)],
    ) -> Result<(), UsageError> {
        // `reserve` reads the ledger holding its pool's lock alone: it sees the write and
        // the release together or neither. Locks are taken in one order, each once.
        let mut locks: Vec<usize> = release
            .iter()
            .filter(|(_, _, amount)| *amount > 0)
            .map(|(org_id, kind, _)| self.pool_lock(org_id, *kind))
            .collect();
        locks.sort_unstable();
        locks.dedup();
        let mut _shared = Vec::with_capacity(locks.len());
        for i in locks {
            _shared.push(self.pools[i].read().await);
        }
        usage.to(ledger).await?;
        let mut reserved = self.reserved();
        for (org_id, kind, amount) in release {
            give_back(&mut reserved, org_id, *kind, *amount);
        }
        Ok(())
    }
}

/// Takes `amount` off the pool's reservation in `reserved`.
fn give_back(
    reserved: &mut HashMap<(String, UsageKind), u64>,
    org_id: &str,
    kind: UsageKind,
    amount: u64,
) {
    let key = (org_id.to_owned(), kind);
    if let Some(held) = reserved.get_mut(&key) {
        *held = held.saturating_sub(amount);
        if *held == 0 {
            reserved.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_full_space_refuses_rather_than_forgets_and_spares_the_others() {
        let local = Local::default();
        let later = clock::now_ms() + 60_000;
        for i in 0..LOCAL_MAX_ENTRIES {
            assert!(local
                .insert_new(Space::SignInForm, &i.to_string(), "", later)
                .await
                .unwrap());
        }
        // Sign-in forms fill their own space only.
        assert!(matches!(
            local
                .insert_new(Space::SignInForm, "one more", "", later)
                .await,
            Err(StoreError::Full(_))
        ));
        assert!(local
            .insert_new(Space::Nonce, "n", "", later)
            .await
            .unwrap());
        for i in 1..LOCAL_MAX_ENTRIES {
            assert!(local
                .insert_new(Space::Nonce, &i.to_string(), "", later)
                .await
                .unwrap());
        }
        // A full nonce space refuses a new nonce, and still knows every one it holds.
        assert!(matches!(
            local.insert_new(Space::Nonce, "fresh", "", later).await,
            Err(StoreError::Full(_))
        ));
        assert!(!local
            .insert_new(Space::Nonce, "n", "", later)
            .await
            .unwrap());
        assert!(!local
            .insert_new(Space::Nonce, "7", "", later)
            .await
            .unwrap());
        // Once entries expire, room is made again.
        {
            let now = clock::now_ms();
            let mut all = local.entries();
            let nonces = all.get_mut(&Space::Nonce).unwrap();
            nonces.map.get_mut("7").unwrap().1 = now - 1;
            nonces.swept_ms = 0;
        }
        assert!(local
            .insert_new(Space::Nonce, "fresh", "", later)
            .await
            .unwrap());
    }
}
