//! Live calls, the service side: connector authentication of the AudioHook upgrade request,
//! the process-wide billing actor's lifecycle, the settings every call starts with, and the
//! registry of calls in progress through which revocations and a shutdown reach them. The
//! intent analysis behind the engine's port is [`crate::call_intent::CallIntent`], one per
//! call; calls in progress for the dashboard are [`crate::live`].

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorRef};
use tokio::sync::OnceCell;

use callstream_actors::asr::Language;
use callstream_actors::billing::{Billing, BillingArgs, BillingMsg};
use callstream_actors::call::{
    CallMsg, CallSettings, DisconnectReason, IntentClassifier, LiveStats,
};
use callstream_actors::usage::Account;

use crate::auth::rfc9421::{self, NonceCache, Policy, RequestParts, SignatureError};
use crate::call_intent::CallIntent;
use crate::config::Config;
use crate::live::LiveCalls;
use crate::llm::Provider;
use crate::store::{Store, StoreError};
use crate::usage::Quotas;

/// Why an upgrade request is refused (all are refused alike; the reason is only logged).
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// No `X-API-Key`.
    #[error("missing X-API-Key header")]
    MissingKey,
    /// No `Signature` or `Signature-Input`.
    #[error("missing Signature or Signature-Input header")]
    Unsigned,
    /// The signature does not verify (or the connector is unknown or revoked).
    #[error("signature refused: {0}")]
    Signature(#[from] SignatureError),
    /// The connector is unknown, revoked, or its organisation is gone.
    #[error("unknown or revoked connector")]
    UnknownConnector,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A call in progress.
struct Running {
    account: Account,
    supervisor: ActorRef<CallMsg>,
}

/// A call's place in the registry; dropping it removes the call.
pub struct Registered {
    calls: Arc<Calls>,
    call_id: String,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.calls.running_calls().remove(&self.call_id);
    }
}

/// When a watcher is told of changes, it still checks this often: a notification lost while
/// the database connection was being re-made is caught by then.
pub const FALLBACK_CHECK: Duration = Duration::from_secs(30);

/// Waits for the next moment to check revocations: a tick of `tick`, or a change announced by
/// any instance when `changes` is given (a closed channel falls back to the ticks).
pub async fn next_check(
    tick: &mut tokio::time::Interval,
    changes: &mut Option<tokio::sync::watch::Receiver<u64>>,
) {
    let Some(rx) = changes.as_mut() else {
        tick.tick().await;
        return;
    };
    tokio::select! {
        _ = tick.tick() => {}
        changed = rx.changed() => if changed.is_err() { *changes = None },
    }
}

/// Ends the calls whose connector or organisation is no longer valid: every `every`, or, when
/// the instances share a database, whenever any of them announces a change (and every
/// [`FALLBACK_CHECK`]). Stops when the calls are gone.
async fn watch_revocations(
    calls: std::sync::Weak<Calls>,
    every: Duration,
    mut changes: Option<tokio::sync::watch::Receiver<u64>>,
) {
    let period = if changes.is_some() {
        FALLBACK_CHECK
    } else {
        every
    };
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        next_check(&mut tick, &mut changes).await;
        let Some(calls) = calls.upgrade() else { return };
        if calls.running() == 0 {
            continue;
        }
        let revoked = calls.revoked().await;
        for (id, supervisor) in revoked {
            tracing::info!(call = %id, "connector revoked or organisation deleted: ending the call");
            let _ = supervisor.cast(CallMsg::Disconnect(DisconnectReason::Revoked));
        }
    }
}

/// What live calls share.
pub struct Calls {
    config: Arc<Config>,
    store: Arc<dyn Store>,
    quotas: Arc<Quotas>,
    nonces: NonceCache,
    shared: Arc<dyn crate::store::SharedState>,
    billing: OnceCell<ActorRef<BillingMsg>>,
    // A parking_lot Mutex: held to add, remove or list entries, never across an await.
    running: Mutex<HashMap<String, Running>>,
    watching: std::sync::Once,
    provider: Arc<dyn Provider>,
    /// Turns of live intent analyses on the model (`calls.max_live_analyses`).
    analysis_turns: Arc<tokio::sync::Semaphore>,
    /// Places for calls read ahead before they ask (`calls.ready_before_analyze`).
    ready_places: Arc<crate::call_intent::ReadyPlaces>,
    /// Counters across calls.
    pub stats: Arc<LiveStats>,
    /// Calls in progress, for the dashboard.
    pub live: Arc<LiveCalls>,
}

impl Calls {
    /// The live-call services over `store`, analysing with `provider`, remembering signature
    /// nonces in `shared`.
    pub fn new(
        config: Arc<Config>,
        store: Arc<dyn Store>,
        provider: Arc<dyn Provider>,
        quotas: Quotas,
        shared: Arc<dyn crate::store::SharedState>,
    ) -> Self {
        let analysis_turns = Arc::new(tokio::sync::Semaphore::new(
            config.calls.max_live_analyses.max(1),
        ));
        let ready_places = crate::call_intent::ReadyPlaces::new(config.calls.ready_before_analyze);
        Self {
            quotas: Arc::new(quotas),
            config,
            store,
            nonces: NonceCache::new(shared.clone()),
            live: Arc::new(LiveCalls::new(shared.clone())),
            shared,
            billing: OnceCell::new(),
            running: Mutex::default(),
            watching: std::sync::Once::new(),
            analysis_turns,
            ready_places,
            provider,
            stats: Arc::new(LiveStats::default()),
        }
    }

    /// The intent analysis of a call `account` pays for.
    pub fn classifier(&self, account: &Account) -> Arc<dyn IntentClassifier> {
        Arc::new(CallIntent::new(
            self.provider.clone(),
            self.quotas.clone(),
            account.clone(),
            self.analysis_turns.clone(),
            self.ready_places.clone(),
        ))
    }

    /// The settings a call starts with.
    pub fn settings(&self, languages: &[Language]) -> CallSettings {
        let c = &self.config.calls;
        CallSettings {
            vad: self.config.vad.config(),
            languages: languages.to_vec(),
            default_language: c.default_language.clone(),
            quota_slice: Duration::from_millis(c.quota_check_ms),
            disconnect_grace: Duration::from_millis(c.disconnect_grace_ms),
            idle_timeout: Duration::from_millis(c.idle_timeout_ms),
            probe_timeout: Duration::from_millis(c.probe_timeout_ms),
            max_held_utterances: c.max_held_utterances,
            external_label: c.external_label.clone(),
            internal_label: c.internal_label.clone(),
            analyze_interval: Duration::from_millis(c.analyze_interval_ms),
        }
    }

    /// The billing actor, started on first use.
    pub async fn billing(&self) -> Result<ActorRef<BillingMsg>, ractor::SpawnErr> {
        self.billing
            .get_or_try_init(|| async {
                let args = BillingArgs {
                    sink: self.store.clone() as Arc<dyn callstream_actors::usage::UsageSink>,
                    gate: self.quotas.clone(),
                    flush_every: Duration::from_millis(self.config.calls.billing_flush_ms),
                    now_ms: crate::clock::now_ms,
                };
                let (billing, _) = Actor::spawn(None, Billing, args).await?;
                Ok(billing)
            })
            .await
            .cloned()
    }

    /// Registers a call in progress until the returned guard is dropped. The first call
    /// starts the revocation watch.
    pub fn register(
        self: &Arc<Self>,
        call_id: &str,
        account: Account,
        supervisor: ActorRef<CallMsg>,
    ) -> Registered {
        self.watching.call_once(|| {
            tokio::spawn(watch_revocations(
                Arc::downgrade(self),
                Duration::from_millis(self.config.calls.revocation_check_ms),
                self.shared.changes(),
            ));
        });
        self.running_calls().insert(
            call_id.to_owned(),
            Running {
                account,
                supervisor,
            },
        );
        Registered {
            calls: self.clone(),
            call_id: call_id.to_owned(),
        }
    }

    fn running_calls(&self) -> parking_lot::MutexGuard<'_, HashMap<String, Running>> {
        self.running.lock()
    }

    /// Calls in progress.
    pub fn running(&self) -> usize {
        self.running_calls().len()
    }

    /// Tells every call in progress to end for `reason`.
    pub fn disconnect_all(&self, reason: DisconnectReason) {
        for call in self.running_calls().values() {
            let _ = call.supervisor.cast(CallMsg::Disconnect(reason));
        }
    }

    /// Disconnects the calls in progress and waits, up to `within`, for them to end (their
    /// usage written); then writes what is left and stops the billing actor.
    pub async fn shutdown(&self, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        self.disconnect_all(DisconnectReason::ServerStopping);
        while self.running() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if self.running() > 0 {
            tracing::warn!(
                calls = self.running(),
                "calls still open at shutdown; their usage is written now"
            );
        }
        if let Some(billing) = self.billing.get() {
            let _ = billing
                .stop_and_wait(None, Some(Duration::from_secs(10)))
                .await;
        }
    }

    /// The calls whose connector is revoked or gone, or whose organisation is deleted or gone.
    async fn revoked(&self) -> Vec<(String, ActorRef<CallMsg>)> {
        let calls: Vec<(String, Account, ActorRef<CallMsg>)> = self
            .running_calls()
            .iter()
            .map(|(id, c)| (id.clone(), c.account.clone(), c.supervisor.clone()))
            .collect();
        let mut connectors: HashMap<String, bool> = HashMap::new();
        let mut orgs: HashMap<String, bool> = HashMap::new();
        let mut ended = Vec::new();
        for (id, account, supervisor) in calls {
            // A store error is not a revocation: the call goes on and the next check retries.
            let connector_live = match connectors.get(&account.key_id) {
                Some(live) => *live,
                None => {
                    let live = self
                        .store
                        .connector(&account.key_id)
                        .await
                        .map(|c| c.is_some_and(|(c, _)| c.revoked_at_ms.is_none()))
                        .unwrap_or(true);
                    connectors.insert(account.key_id.clone(), live);
                    live
                }
            };
            let org_live = match orgs.get(&account.org_id) {
                Some(live) => *live,
                None => {
                    let live = self
                        .store
                        .org(&account.org_id)
                        .await
                        .map(|o| o.is_some_and(|o| !o.deleted))
                        .unwrap_or(true);
                    orgs.insert(account.org_id.clone(), live);
                    live
                }
            };
            if !(connector_live && org_live) {
                ended.push((id, supervisor));
            }
        }
        ended
    }

    /// Authenticates an AudioHook upgrade request: the connector named by `X-API-Key` must
    /// exist, be live and belong to a live organisation, and the RFC 9421 signature must
    /// verify with its client secret. An unknown connector is verified with a random key, so
    /// it fails the same way and takes the same time as a bad signature.
    pub async fn authenticate(
        &self,
        request: &RequestParts<'_>,
        now: i64,
    ) -> Result<Account, HandshakeError> {
        let header = |name: &str| {
            request
                .headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let client_id = header("x-api-key").ok_or(HandshakeError::MissingKey)?;
        let (Some(input), Some(signature)) = (header("signature-input"), header("signature"))
        else {
            return Err(HandshakeError::Unsigned);
        };
        let found = self
            .store
            .connector(&client_id)
            .await?
            .filter(|(c, _)| c.revoked_at_ms.is_none());
        let live_org = match &found {
            Some((c, _)) => self.store.org(&c.org_id).await?.is_some_and(|o| !o.deleted),
            None => false,
        };
        let decoy;
        let key: &[u8] = match &found {
            Some((_, secret)) => secret,
            None => {
                decoy = rand::random::<[u8; 32]>();
                &decoy
            }
        };
        let policy = Policy::audiohook();
        // The signature covers the authority the client connected to: this request's Host, or
        // the public one when a proxy rewrote Host.
        let public = self.config.public_authority();
        let verify = |authority: &str| {
            let parts = RequestParts {
                authority,
                ..*request
            };
            rfc9421::verify(
                &parts,
                &input,
                &signature,
                key,
                Some(&client_id),
                now,
                &policy,
            )
        };
        let verified = match verify(request.authority) {
            Err(SignatureError::Mismatch) if !public.eq_ignore_ascii_case(request.authority) => {
                verify(&public)?
            }
            other => other?,
        };
        let (Some((connector, _)), true) = (found, live_org) else {
            return Err(HandshakeError::UnknownConnector);
        };
        let nonce = verified.nonce.unwrap_or_default();
        let until = verified
            .created
            .unwrap_or(now)
            .saturating_add(policy.max_age_s.unwrap_or(0))
            .saturating_add(policy.skew_s);
        if !self
            .nonces
            .check_and_insert(&client_id, &nonce, until)
            .await?
        {
            return Err(SignatureError::Replay.into());
        }
        Ok(Account {
            org_id: connector.org_id,
            key_id: connector.client_id,
        })
    }
}
