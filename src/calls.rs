//! Live calls, the service side: connector authentication of the AudioHook upgrade request,
//! the process-wide billing actor's lifecycle, and the settings every call starts with. The
//! intent analysis behind the engine's port is [`crate::llm::profiles::LlmIntent`]; calls in
//! progress for the dashboard are [`crate::live`].

use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorRef};
use tokio::sync::OnceCell;

use callstream_actors::billing::{Billing, BillingArgs, BillingMsg};
use callstream_actors::call::{CallSettings, IntentClassifier, LiveStats};
use callstream_actors::usage::Account;

use crate::auth::rfc9421::{self, NonceCache, Policy, RequestParts, SignatureError};
use crate::config::Config;
use crate::live::LiveCalls;
use crate::llm::profiles::LlmIntent;
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

/// What live calls share.
pub struct Calls {
    config: Arc<Config>,
    store: Arc<dyn Store>,
    quotas: Arc<Quotas>,
    nonces: NonceCache,
    billing: OnceCell<ActorRef<BillingMsg>>,
    /// The intent analysis.
    pub classifier: Arc<dyn IntentClassifier>,
    /// Counters across calls.
    pub stats: Arc<LiveStats>,
    /// Calls in progress, for the dashboard.
    pub live: Arc<LiveCalls>,
}

impl Calls {
    /// The live-call services over `store`, analysing with `provider`.
    pub fn new(config: Arc<Config>, store: Arc<dyn Store>, provider: Arc<dyn Provider>) -> Self {
        Self {
            quotas: Arc::new(Quotas::new(config.clone(), store.clone())),
            config,
            store,
            nonces: NonceCache::default(),
            billing: OnceCell::new(),
            classifier: Arc::new(LlmIntent::new(provider)),
            stats: Arc::new(LiveStats::default()),
            live: Arc::new(LiveCalls::default()),
        }
    }

    /// The settings a call starts with.
    pub fn settings(&self, languages: &[String]) -> CallSettings {
        let c = &self.config.calls;
        CallSettings {
            vad: self.config.vad.config(),
            languages: languages.to_vec(),
            default_language: c.default_language.clone(),
            quota_check: Duration::from_millis(c.quota_check_ms),
            disconnect_grace: Duration::from_millis(c.disconnect_grace_ms),
            idle_timeout: Duration::from_millis(c.idle_timeout_ms),
            probe_timeout: Duration::from_millis(c.probe_timeout_ms),
            max_held_utterances: c.max_held_utterances,
            external_label: c.external_label.clone(),
            internal_label: c.internal_label.clone(),
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

    /// Writes the usage of calls in progress and stops the billing actor.
    pub async fn shutdown(&self) {
        if let Some(billing) = self.billing.get() {
            let _ = billing
                .stop_and_wait(None, Some(Duration::from_secs(10)))
                .await;
        }
    }

    /// Authenticates an AudioHook upgrade request: the connector named by `X-API-Key` must
    /// exist, be live and belong to a live organisation, and the RFC 9421 signature must
    /// verify with its client secret. An unknown connector is verified with a random key, so
    /// it fails the same way and takes the same time as a bad signature.
    pub fn authenticate(
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
            .connector(&client_id)?
            .filter(|(c, _)| c.revoked_at_ms.is_none());
        let live_org = match &found {
            Some((c, _)) => self.store.org(&c.org_id)?.is_some_and(|o| !o.deleted),
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
        let verified = rfc9421::verify(
            request,
            &input,
            &signature,
            key,
            Some(&client_id),
            now,
            &policy,
        )?;
        let (Some((connector, _)), true) = (found, live_org) else {
            return Err(HandshakeError::UnknownConnector);
        };
        let nonce = verified.nonce.unwrap_or_default();
        let until = verified
            .created
            .unwrap_or(now)
            .saturating_add(policy.max_age_s.unwrap_or(0))
            .saturating_add(policy.skew_s);
        self.nonces
            .check_and_insert(&client_id, &nonce, now, until)?;
        Ok(Account {
            org_id: connector.org_id,
            key_id: connector.client_id,
        })
    }
}
