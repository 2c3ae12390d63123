//! Who is calling, and may they: API key resolution, per-key rate limits and quota gates.
//!
//! These checks are independent of the transport: the REST filters and the realtime chat
//! session (once per turn) call the same functions, so the RPM budget of a key is one budget.

pub mod keys;
pub mod password;
pub mod rfc9421;
pub mod sessions;
pub mod slots;

use std::sync::Arc;
use std::time::{Duration, Instant};

use callstream_actors::usage::{Account, Allowance, UsageError, UsageKind};

use crate::config::{Config, Plan};
use crate::store::{ApiKey, Org, SharedState, Store, StoreError};
use crate::usage::Quotas;

/// An authenticated caller: the key, its organisation and the organisation's plan.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The organisation, not deleted.
    pub org: Org,
    /// The key used, not revoked.
    pub key: ApiKey,
    /// The organisation's plan.
    pub plan: Plan,
}

impl Caller {
    /// Who pays for what this caller asks.
    pub fn account(&self) -> Account {
        Account {
            org_id: self.org.id.clone(),
            key_id: self.key.id.clone(),
        }
    }
}

/// Why a request is refused before it does any work.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// No `X-API-Key` header.
    #[error("missing X-API-Key header")]
    MissingKey,
    /// The key is unknown or revoked.
    #[error("invalid or revoked API key")]
    InvalidKey,
    /// The key's organisation has been deleted.
    #[error("the organisation of this API key no longer exists")]
    OrgDeleted,
    /// The key used up its requests-per-minute budget.
    #[error("rate limit of {rpm} requests per minute exceeded for this API key")]
    RateLimited {
        /// The plan's limit.
        rpm: u32,
        /// How long until a request would be allowed.
        retry_after: Duration,
    },
    /// The organisation's monthly quota of this pool is used up.
    #[error("monthly {} quota exhausted for this plan", pool_name(*.0))]
    QuotaExhausted(UsageKind),
    /// The organisation's plan is not in the configuration.
    #[error("plan {0:?} of this organisation is not configured")]
    PlanMissing(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<UsageError> for AuthError {
    fn from(e: UsageError) -> Self {
        match e {
            UsageError::UnknownPlan(plan) => AuthError::PlanMissing(plan),
            UsageError::UnknownOrg(_) => AuthError::OrgDeleted,
            UsageError::Store(message) => AuthError::Store(StoreError::Backend(message)),
        }
    }
}

/// Human name of a quota pool.
pub fn pool_name(kind: UsageKind) -> &'static str {
    match kind {
        UsageKind::Tokens => "chat-token",
        UsageKind::AudioMs => "transcription-minute",
    }
}

/// Keys resolved lately, when the store is shared: valid until any instance announces a
/// change (a revocation, an organisation changed or deleted), and for [`KEY_CACHE_TTL`] at most.
struct KeyCache {
    changes: tokio::sync::watch::Receiver<u64>,
    // A parking_lot Mutex: a map lookup per request, never held across an await.
    entries: parking_lot::Mutex<KeyCacheEntries>,
}

#[derive(Default)]
struct KeyCacheEntries {
    /// The change count the entries were read under.
    generation: u64,
    map: std::collections::HashMap<[u8; 32], (ApiKey, Org, Instant)>,
}

/// How long a resolved key is trusted without asking the database again, even when no change
/// is announced (a notification lost while the connection was being re-made).
const KEY_CACHE_TTL: Duration = Duration::from_secs(5);

/// Most keys cached; past this the cache starts over.
const KEY_CACHE_MAX: usize = 10_000;

impl KeyCache {
    fn get(&self, hash: &[u8; 32]) -> Option<(ApiKey, Org)> {
        let generation = *self.changes.borrow();
        let mut entries = self.entries.lock();
        if entries.generation != generation {
            entries.map.clear();
            entries.generation = generation;
            return None;
        }
        entries
            .map
            .get(hash)
            .filter(|(_, _, at)| at.elapsed() < KEY_CACHE_TTL)
            .map(|(key, org, _)| (key.clone(), org.clone()))
    }

    /// Keeps what was read while the change count was `generation`.
    fn put(&self, generation: u64, hash: [u8; 32], key: ApiKey, org: Org) {
        let mut entries = self.entries.lock();
        if entries.generation != generation {
            return;
        }
        if entries.map.len() >= KEY_CACHE_MAX {
            entries.map.clear();
        }
        entries.map.insert(hash, (key, org, Instant::now()));
    }
}

/// Resolves keys and applies limits.
pub struct Authenticator {
    config: Arc<Config>,
    store: Arc<dyn Store>,
    quotas: Quotas,
    shared: Arc<dyn SharedState>,
    cache: Option<KeyCache>,
}

impl Authenticator {
    /// An authenticator over `store` with the plans of `config`, answering quotas (and taking
    /// reservations) with `quotas`, and counting each key's requests in `shared` (one budget
    /// per key across the instances that share it).
    pub fn new(
        config: Arc<Config>,
        store: Arc<dyn Store>,
        quotas: Quotas,
        shared: Arc<dyn SharedState>,
    ) -> Self {
        let cache = shared.changes().map(|changes| {
            let generation = *changes.borrow();
            KeyCache {
                entries: parking_lot::Mutex::new(KeyCacheEntries {
                    generation,
                    map: Default::default(),
                }),
                changes,
            }
        });
        Self {
            quotas,
            config,
            store,
            shared,
            cache,
        }
    }

    /// Resolves an API key secret to its caller: unknown or revoked keys are
    /// [`AuthError::InvalidKey`], keys of a deleted organisation [`AuthError::OrgDeleted`].
    pub async fn authenticate(&self, secret: Option<&str>) -> Result<Caller, AuthError> {
        let secret = secret
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .ok_or(AuthError::MissingKey)?;
        let hash = keys::hash_secret(secret);
        let (key, org) = match self.cache.as_ref().and_then(|c| c.get(&hash)) {
            Some(hit) => hit,
            None => {
                let generation = self.cache.as_ref().map(|c| *c.changes.borrow());
                let key = self
                    .store
                    .api_key_by_hash(&hash)
                    .await?
                    .filter(|k| k.revoked_at_ms.is_none())
                    .ok_or(AuthError::InvalidKey)?;
                let org = self
                    .store
                    .org(&key.org_id)
                    .await?
                    .filter(|o| !o.deleted)
                    .ok_or(AuthError::OrgDeleted)?;
                if let (Some(cache), Some(generation)) = (&self.cache, generation) {
                    cache.put(generation, hash, key.clone(), org.clone());
                }
                (key, org)
            }
        };
        let plan = self
            .config
            .plan(&org.plan)
            .cloned()
            .ok_or_else(|| AuthError::PlanMissing(org.plan.clone()))?;
        Ok(Caller { org, key, plan })
    }

    /// Counts one request against the caller's key budget.
    pub async fn check_rate(&self, caller: &Caller, now: Instant) -> Result<(), AuthError> {
        self.shared
            .rate(&format!("key:{}", caller.key.id), caller.plan.rpm, now)
            .await?
            .map_err(|retry_after| AuthError::RateLimited {
                rpm: caller.plan.rpm,
                retry_after,
            })
    }

    /// Refuses when the caller's organisation has nothing left of `kind`'s pool.
    pub async fn check_quota(
        &self,
        caller: &Caller,
        kind: UsageKind,
        now_ms: i64,
    ) -> Result<(), AuthError> {
        if self.allowance(caller, kind, now_ms).await?.is_exhausted() {
            return Err(AuthError::QuotaExhausted(kind));
        }
        Ok(())
    }

    /// What is left of the caller's `kind` pool this month.
    pub async fn allowance(
        &self,
        caller: &Caller,
        kind: UsageKind,
        now_ms: i64,
    ) -> Result<Allowance, AuthError> {
        Ok(self
            .quotas
            .allowance_for(&caller.org.id, &caller.plan, kind, now_ms)
            .await?)
    }

    /// Reserves up to `want` of the caller's `kind` pool, at least `min`: refused as
    /// [`AuthError::QuotaExhausted`] when less than `min` is left.
    pub async fn reserve(
        &self,
        caller: &Caller,
        kind: UsageKind,
        want: u64,
        min: u64,
        now_ms: i64,
    ) -> Result<crate::usage::Reservation, AuthError> {
        self.quotas
            .reserve_for(&caller.org.id, &caller.plan, kind, want, min, now_ms)
            .await?
            .ok_or(AuthError::QuotaExhausted(kind))
    }

    /// The quota view used by this authenticator.
    pub fn quotas(&self) -> &Quotas {
        &self.quotas
    }
}
