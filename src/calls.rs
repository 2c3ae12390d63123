//! Live calls, the service side: connector authentication of the AudioHook upgrade request,
//! the process-wide billing actor, the intent analysis behind the engine's port, and the
//! settings every call starts with.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use ractor::{Actor, ActorRef};
use tokio::sync::OnceCell;

use callstream_actors::billing::{Account, Billing, BillingArgs, BillingMsg};
use callstream_actors::call::{
    CallInfo, CallObserver, CallSettings, IntentClassifier, IntentFuture, LiveStats,
};

use crate::auth::rfc9421::{self, NonceCache, Policy, RequestParts, SignatureError};
use crate::config::Config;
use crate::llm::profiles::{analyse, ProfileKind};
use crate::llm::Provider;
use crate::store::{Store, StoreError};
use crate::usage::Quotas;

/// Why an upgrade request is refused (all close with 4401; the reason is only logged).
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

/// The intent profile of the language model, as the engine's [`IntentClassifier`].
pub struct LlmIntent {
    provider: Arc<dyn Provider>,
}

impl LlmIntent {
    /// Classifies with `provider`.
    pub fn new(provider: Arc<dyn Provider>) -> Self {
        Self { provider }
    }
}

impl IntentClassifier for LlmIntent {
    fn classify(&self, transcript: String) -> IntentFuture {
        let provider = self.provider.clone();
        Box::pin(async move {
            analyse(provider.as_ref(), ProfileKind::Intent, &transcript)
                .await
                .map(|(value, _usage)| value)
                .map_err(|e| e.to_string())
        })
    }
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

/// Most transcript lines kept per call for the dashboard.
const MAX_LINES: usize = 500;

/// A call in progress, as the dashboard shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LiveCall {
    /// Call id.
    pub call_id: String,
    /// Owner (not sent to browsers).
    #[serde(skip)]
    pub org_id: String,
    /// The platform's conversation id.
    pub conversation_id: String,
    /// Channel names in order.
    pub channels: Vec<String>,
    /// Language tag.
    pub language: Option<String>,
    /// RFC 3339.
    pub started_at: String,
    /// Final transcripts so far (the last 500).
    pub lines: Vec<LiveLine>,
}

/// A final transcript of a call in progress.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LiveLine {
    /// Channel index.
    pub channel: usize,
    /// Seconds on the call timeline.
    pub offset: f64,
    /// Text.
    pub text: String,
}

/// What the live page is told.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum LiveEvent {
    /// A call opened.
    Opened {
        /// The call.
        call: LiveCall,
    },
    /// A final transcript.
    Transcript {
        /// Call id.
        call_id: String,
        /// The line.
        line: LiveLine,
    },
    /// A call ended.
    Ended {
        /// Call id.
        call_id: String,
    },
}

/// The calls in progress, per organisation, and a feed of what happens to them.
pub struct LiveCalls {
    calls: std::sync::Mutex<std::collections::HashMap<String, LiveCall>>,
    feed: tokio::sync::broadcast::Sender<(String, LiveEvent)>,
}

impl Default for LiveCalls {
    fn default() -> Self {
        Self {
            calls: Default::default(),
            feed: tokio::sync::broadcast::channel(1024).0,
        }
    }
}

impl LiveCalls {
    /// The organisation's calls in progress, oldest first.
    pub fn of_org(&self, org_id: &str) -> Vec<LiveCall> {
        let calls = self
            .calls
            .lock()
            .expect("live call map lock is never poisoned");
        let mut list: Vec<LiveCall> = calls
            .values()
            .filter(|c| c.org_id == org_id)
            .cloned()
            .collect();
        list.sort_by(|a, b| a.started_at.cmp(&b.started_at));
        list
    }

    /// Everything that happens from now on: (organisation id, event).
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<(String, LiveEvent)> {
        self.feed.subscribe()
    }

    fn publish(&self, org_id: String, event: LiveEvent) {
        // Nobody watching is fine.
        let _ = self.feed.send((org_id, event));
    }
}

impl CallObserver for LiveCalls {
    fn opened(&self, call: &CallInfo) {
        let live = LiveCall {
            call_id: call.call_id.clone(),
            org_id: call.org_id.clone(),
            conversation_id: call.conversation_id.clone(),
            channels: call.channels.clone(),
            language: call.language.clone(),
            started_at: crate::clock::rfc3339(crate::clock::now_ms()),
            lines: Vec::new(),
        };
        self.calls
            .lock()
            .expect("live call map lock is never poisoned")
            .insert(call.call_id.clone(), live.clone());
        self.publish(call.org_id.clone(), LiveEvent::Opened { call: live });
    }

    fn transcript(&self, call_id: &str, channel: usize, offset_secs: f64, text: &str) {
        let line = LiveLine {
            channel,
            offset: (offset_secs * 1000.0).round() / 1000.0,
            text: text.to_owned(),
        };
        let org = {
            let mut calls = self
                .calls
                .lock()
                .expect("live call map lock is never poisoned");
            let Some(call) = calls.get_mut(call_id) else {
                return;
            };
            if call.lines.len() == MAX_LINES {
                call.lines.remove(0);
            }
            call.lines.push(line.clone());
            call.org_id.clone()
        };
        self.publish(
            org,
            LiveEvent::Transcript {
                call_id: call_id.to_owned(),
                line,
            },
        );
    }

    fn ended(&self, call_id: &str) {
        let removed = self
            .calls
            .lock()
            .expect("live call map lock is never poisoned")
            .remove(call_id);
        if let Some(call) = removed {
            self.publish(
                call.org_id,
                LiveEvent::Ended {
                    call_id: call_id.to_owned(),
                },
            );
        }
    }
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
        let until = verified.created.unwrap_or(now) + policy.max_age_s.unwrap_or(0) + policy.skew_s;
        self.nonces
            .check_and_insert(&client_id, &nonce, now, until)?;
        Ok(Account {
            org_id: connector.org_id,
            key_id: connector.client_id,
        })
    }
}

/// Signs an AudioHook upgrade request the way Genesys does: the six components of
/// [`Policy::audiohook`], label `sig1`, HMAC-SHA256 keyed by the base64-decoded client secret.
/// Returns the `Signature-Input` and `Signature` header values.
pub fn sign_upgrade(
    request: &RequestParts<'_>,
    client_id: &str,
    client_secret_b64: &str,
    created: i64,
) -> Result<(String, String), String> {
    let key = base64::engine::general_purpose::STANDARD
        .decode(client_secret_b64.trim())
        .map_err(|e| format!("the client secret is not base64: {e}"))?;
    let nonce = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(rand::random::<[u8; 18]>());
    let components = Policy::audiohook()
        .required
        .iter()
        .map(|c| format!("\"{c}\""))
        .collect::<Vec<_>>()
        .join(" ");
    let params = format!(
        "({components});keyid=\"{client_id}\";nonce=\"{nonce}\";alg=\"hmac-sha256\";created={created};expires={}",
        created + 30
    );
    let input_header = format!("sig1={params}");
    let parsed = rfc9421::parse_input(&input_header, Some("sig1")).map_err(|e| e.to_string())?;
    let base = rfc9421::signature_base(request, &parsed).map_err(|e| e.to_string())?;
    use hmac::Mac;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&key).expect("any key length");
    mac.update(base.as_bytes());
    let sig = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    Ok((input_header, format!("sig1=:{sig}:")))
}
