//! Persistent state: organisations, API keys, connectors, dashboard users and the usage
//! ledger, behind the [`Store`] trait: sled embedded in one process (the default), or
//! PostgreSQL shared by several instances (`storage.backend = "postgres"`).
//!
//! Secrets never reach a store in plain text: API keys arrive as SHA-256 hashes, and connector
//! client secrets and MCP headers are sealed with [`crypto::SecretBox`] before they are written.
//! Usage events are appended to a ledger; per-day totals are kept beside it in the same
//! transaction, so quota questions are answered without scanning the ledger.

pub mod archive;
pub mod copy;
pub mod crypto;
pub mod postgres;
pub mod shared;
pub mod sled;
#[cfg(test)]
mod suite;
#[cfg(test)]
pub(crate) mod testpg;

use std::collections::BTreeMap;

use callstream_actors::usage::{UsageError, UsageEvent, UsageKind, UsageSink};
use rand::RngCore;
use serde::{Deserialize, Serialize};

pub use self::postgres::PgStore;
pub use self::shared::{SharedState, Space};
pub use self::sled::SledStore;
pub use crypto::SecretBox;

/// Why the configured store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The data directory could not be created.
    #[error("cannot create data directory {0}: {1}")]
    DataDir(String, std::io::Error),
    /// The encryption key is unusable.
    #[error(transparent)]
    Key(#[from] crypto::KeyError),
    /// The configuration does not say enough to open the store.
    #[error("{0}")]
    Config(String),
    /// The database could not be opened.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// An opened store and the state shared with the other instances using it.
#[derive(Clone)]
pub struct Opened {
    /// The records.
    pub store: std::sync::Arc<dyn Store>,
    /// Sessions, nonces and rate limits: in this process for sled, in the database for
    /// PostgreSQL.
    pub shared: std::sync::Arc<dyn SharedState>,
    /// The key that signs dashboard sign-in forms, derived from the storage key (so every
    /// instance sharing the database accepts the others' forms).
    pub form_key: [u8; 32],
}

/// What the sign-in form key is derived for.
const FORM_KEY_PURPOSE: &str = "dashboard sign-in forms";

/// Opens the store `storage` configures, creating it (or bringing its schema up to date) on
/// first use. The data directory is created in either case: it holds the admin socket.
pub async fn open(storage: &crate::config::StorageConfig) -> Result<Opened, OpenError> {
    use crate::config::StorageBackend;
    use std::sync::Arc;
    let dir = &storage.data_dir;
    let data_dir_error = |e| OpenError::DataDir(dir.display().to_string(), e);
    std::fs::create_dir_all(dir).map_err(data_dir_error)?;
    let opened = match storage.backend {
        StorageBackend::Sled => {
            let secrets = SecretBox::from_config(&storage.secret_key, dir)?;
            Opened {
                form_key: secrets.derive(FORM_KEY_PURPOSE),
                store: Arc::new(SledStore::open(dir, secrets)?),
                shared: Arc::new(shared::Local::default()),
            }
        }
        StorageBackend::Postgres => {
            if storage.postgres_url.trim().is_empty() {
                return Err(OpenError::Config(
                    "storage.backend is \"postgres\" but storage.postgres_url is empty".into(),
                ));
            }
            // Every instance must open the secrets the others sealed: a key generated into
            // one machine's data directory would not do.
            if storage.secret_key.trim().is_empty() {
                return Err(OpenError::Config(
                    "storage.backend is \"postgres\": set storage.secret_key (base64 of 32 \
                     bytes, the same on every instance; CALLSTREAM_STORAGE__SECRET_KEY)"
                        .into(),
                ));
            }
            let secrets = SecretBox::from_config(&storage.secret_key, dir)?;
            let form_key = secrets.derive(FORM_KEY_PURPOSE);
            let pg = Arc::new(
                PgStore::open(&storage.postgres_url, storage.postgres_pool, secrets).await?,
            );
            Opened {
                store: pg.clone(),
                shared: pg,
                form_key,
            }
        }
    };
    restrict(dir).map_err(data_dir_error)?;
    Ok(opened)
}

/// Makes the data directory its owner's alone: directories 0700, files 0600 (a directory made
/// by an older version, or under a looser umask, included).
fn restrict(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        if kind.is_dir() {
            restrict(&entry.path())?;
        } else if kind.is_file() {
            std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(0o600))?;
        }
    }
    Ok(())
}

/// An organisation: the tenant that owns keys, connectors, a plan and usage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Org {
    /// `org_` followed by 20 hex digits.
    pub id: String,
    /// Display name.
    pub name: String,
    /// Applied before every chat conversation of the organisation.
    pub system_prompt: Option<String>,
    /// MCP server whose tools are offered to the model.
    pub mcp: Option<McpIntegration>,
    /// Non-public networks (CIDR) and host names this organisation's MCP server may have, set
    /// by the operator (`callstream org set-mcp-allow`); each counts only within
    /// `llm.mcp_allow`, the operator's bound for every organisation.
    pub mcp_allow: Vec<String>,
    /// Name of a plan in the configuration.
    pub plan: String,
    /// Retention and redaction of the organisation's call history.
    #[serde(default)]
    pub history: HistorySettings,
    /// Deleted organisations keep their records; their keys answer 404.
    pub deleted: bool,
    /// Unix milliseconds.
    pub created_at_ms: i64,
}

/// What an organisation asks of its call history.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct HistorySettings {
    /// Days a record is kept, if shorter than the plan's `retention_days`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_days: Option<u32>,
    /// Card numbers, social security numbers, e-mail addresses and phone numbers are replaced
    /// (`[card]`, `[ssn]`, `[email]`, `[phone]`) in transcripts sent, stored and analysed.
    #[serde(default)]
    pub redact: bool,
    /// Connectors (client ids) that redact otherwise than the organisation.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub redact_connectors: BTreeMap<String, bool>,
}

impl HistorySettings {
    /// Whether what comes in through `connector` (a client id or API key id) is redacted.
    pub fn redacts(&self, connector: &str) -> bool {
        self.redact_connectors
            .get(connector)
            .copied()
            .unwrap_or(self.redact)
    }

    /// Days a record is kept: the organisation's own, within the plan's.
    pub fn retention(&self, plan_days: Option<u32>) -> Option<u32> {
        match (self.retention_days, plan_days) {
            (Some(own), Some(plan)) => Some(own.min(plan)),
            (own, plan) => own.or(plan),
        }
    }
}

/// An MCP server reached over Streamable HTTP. The headers usually carry credentials, so the
/// store seals them, and `Debug` shows their names only.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct McpIntegration {
    /// Endpoint URL.
    pub url: String,
    /// Headers sent with every request to it.
    pub headers: BTreeMap<String, String>,
}

impl McpIntegration {
    /// The URL as it may be logged: without a user name or password, with every query value
    /// replaced (`?token=REDACTED`) and without a fragment.
    pub fn url_for_logs(&self) -> String {
        let Ok(mut url) = reqwest::Url::parse(&self.url) else {
            return "(not a URL)".to_owned();
        };
        // Only a URL that cannot have them refuses these, and then it has none.
        let _ = url.set_username("");
        let _ = url.set_password(None);
        if url.query().is_some() {
            let names: Vec<String> = url
                .query_pairs()
                .map(|(name, _)| format!("{name}=REDACTED"))
                .collect();
            url.set_query(Some(&names.join("&")));
        }
        url.set_fragment(None);
        url.to_string()
    }
}

impl std::fmt::Debug for McpIntegration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpIntegration")
            .field("url", &self.url_for_logs())
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// An API key. Its secret is not here: only its hash and last four characters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiKey {
    /// `key_` followed by 20 hex digits.
    pub id: String,
    /// Owner.
    pub org_id: String,
    /// Free text to tell keys apart.
    pub name: Option<String>,
    /// Hex SHA-256 of the secret.
    pub hash: String,
    /// Last four characters of the secret.
    pub last4: String,
    /// Unix milliseconds.
    pub created_at_ms: i64,
    /// Set once revoked; a revoked key authenticates nothing.
    pub revoked_at_ms: Option<i64>,
}

/// An AudioHook connector: a client id (its API key on the wire) and a client secret that
/// keys the request signatures. The secret is held sealed and handed out only to verify.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Connector {
    /// `cc_` followed by 32 hex digits; sent by the platform as `X-API-Key`.
    pub client_id: String,
    /// Owner.
    pub org_id: String,
    /// Free text to tell connectors apart.
    pub name: Option<String>,
    /// Unix milliseconds.
    pub created_at_ms: i64,
    /// When the secret was last replaced, if ever.
    pub rotated_at_ms: Option<i64>,
    /// Set once revoked.
    pub revoked_at_ms: Option<i64>,
}

/// A person who signs in to the dashboard to administer one organisation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DashboardUser {
    /// Sign-in name, lower-case.
    pub email: String,
    /// The organisation administered.
    pub org_id: String,
    /// Argon2id hash in PHC string form.
    pub password_hash: String,
    /// Unix milliseconds.
    pub created_at_ms: i64,
}

/// Usage of one kind by one organisation on one UTC day.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DayUsage {
    /// `YYYY-MM-DD`.
    pub day: String,
    /// What `amount` counts.
    pub kind: UsageKind,
    /// Tokens or audio milliseconds.
    pub amount: u64,
}

/// Errors of a store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The backend failed (I/O, corruption, lock).
    #[error("storage failed: {0}")]
    Backend(String),
    /// Another process holds the database open.
    #[error("the data directory {0} is in use by another process")]
    Locked(String),
    /// A record could not be decoded.
    #[error("stored record {0} is unreadable: {1}")]
    Corrupt(String, String),
    /// A sealed secret did not open: the encryption key is not the one it was sealed with.
    #[error(
        "a stored secret cannot be decrypted; is storage.secret_key the one it was written with?"
    )]
    Decrypt,
    /// No record with that id.
    #[error("no {kind} with id {id}")]
    NotFound {
        /// Which kind of record.
        kind: &'static str,
        /// The id asked for.
        id: String,
    },
    /// A record with that id already exists.
    #[error("{kind} {id} already exists")]
    Exists {
        /// Which kind of record.
        kind: &'static str,
        /// The id.
        id: String,
    },
    /// A bounded in-process table is full of entries that have not expired yet; the new one is
    /// refused rather than one of them dropped.
    #[error("too many {0} are held; try again shortly")]
    Full(&'static str),
    /// The organisation has as many records of a kind as its plan allows.
    #[error("this organisation already has {most} {kind}s, as many as its plan allows")]
    Cap {
        /// Which kind of record.
        kind: &'static str,
        /// How many it may have.
        most: usize,
    },
}

impl From<StoreError> for UsageError {
    fn from(e: StoreError) -> Self {
        UsageError::Store(e.to_string())
    }
}

/// Everything the service keeps. Implementations are shared between threads, and never block
/// the async runtime's workers: sled's calls run on tokio's blocking threads, PostgreSQL's are
/// async on pooled connections.
///
/// Writes are durable when they return `Ok`: a usage event acknowledged by
/// [`UsageSink::record`] survives a crash.
#[async_trait::async_trait]
pub trait Store: UsageSink + archive::Archive + Send + Sync + 'static {
    /// Adds a dashboard user; the email must be new.
    async fn insert_user(&self, user: &DashboardUser) -> Result<(), StoreError>;
    /// A dashboard user by email.
    async fn user(&self, email: &str) -> Result<Option<DashboardUser>, StoreError>;
    /// All dashboard users, oldest first.
    async fn users(&self) -> Result<Vec<DashboardUser>, StoreError>;
    /// Adds an organisation; its id must be new.
    async fn insert_org(&self, org: &Org) -> Result<(), StoreError>;
    /// Replaces an existing organisation.
    async fn update_org(&self, org: &Org) -> Result<(), StoreError>;
    /// One organisation, deleted or not.
    async fn org(&self, id: &str) -> Result<Option<Org>, StoreError>;
    /// All organisations, deleted ones included, oldest first.
    async fn orgs(&self) -> Result<Vec<Org>, StoreError>;

    /// Adds an API key; its id and hash must be new, and its organisation must have fewer than
    /// `most` keys not revoked ([`StoreError::Cap`] otherwise), counted and added in one step.
    async fn insert_api_key(&self, key: &ApiKey, most: usize) -> Result<(), StoreError>;
    /// Marks a key revoked (idempotent) and returns it.
    async fn revoke_api_key(&self, id: &str, at_ms: i64) -> Result<ApiKey, StoreError>;
    /// One key by id.
    async fn api_key(&self, id: &str) -> Result<Option<ApiKey>, StoreError>;
    /// The key whose secret hashes to `hash`.
    async fn api_key_by_hash(&self, hash: &[u8; 32]) -> Result<Option<ApiKey>, StoreError>;
    /// An organisation's keys, oldest first.
    async fn api_keys(&self, org_id: &str) -> Result<Vec<ApiKey>, StoreError>;

    /// Adds a connector with its client secret; the client id must be new, and its organisation
    /// must have fewer than `most` connectors not revoked ([`StoreError::Cap`] otherwise).
    async fn insert_connector(
        &self,
        connector: &Connector,
        secret: &[u8],
        most: usize,
    ) -> Result<(), StoreError>;
    /// Replaces a connector's secret and returns the updated connector.
    async fn rotate_connector(
        &self,
        client_id: &str,
        secret: &[u8],
        at_ms: i64,
    ) -> Result<Connector, StoreError>;
    /// Marks a connector revoked (idempotent) and returns it.
    async fn revoke_connector(&self, client_id: &str, at_ms: i64) -> Result<Connector, StoreError>;
    /// One connector with its opened client secret, for signature verification.
    async fn connector(&self, client_id: &str) -> Result<Option<(Connector, Vec<u8>)>, StoreError>;
    /// An organisation's connectors, oldest first.
    async fn connectors(&self, org_id: &str) -> Result<Vec<Connector>, StoreError>;

    /// Per-day totals of an organisation for days `from..=to` (`YYYY-MM-DD`), in day order.
    async fn usage_by_day(
        &self,
        org_id: &str,
        from: &str,
        to: &str,
    ) -> Result<Vec<DayUsage>, StoreError>;
    /// Ledger events of an organisation with `from_ms <= at_ms < to_ms`, in time order.
    async fn usage_events(
        &self,
        org_id: &str,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<Vec<UsageEvent>, StoreError>;
}

/// A new random id: `prefix` followed by `2 * bytes` hex digits.
pub fn new_id(prefix: &str, bytes: usize) -> String {
    let mut raw = vec![0u8; bytes];
    rand::rngs::OsRng.fill_bytes(&mut raw);
    let mut id = String::with_capacity(prefix.len() + 2 * bytes);
    id.push_str(prefix);
    for b in raw {
        id.push_str(&format!("{b:02x}"));
    }
    id
}

/// The ledger sequence of a live call's running total: stable for the call, top bit set (so it
/// never meets a generated one).
pub(crate) fn call_seq(call_id: &str) -> u64 {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(call_id.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first) | (1 << 63)
}

/// The 32 bytes of a 64-hex-digit SHA-256.
pub(crate) fn hex_to_hash(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::McpIntegration;

    #[test]
    fn an_mcp_url_is_logged_without_its_credentials() {
        let logged = |url: &str| {
            let mcp = McpIntegration {
                url: url.to_owned(),
                headers: [("Authorization".to_owned(), "Bearer s3cret".to_owned())].into(),
            };
            (mcp.url_for_logs(), format!("{mcp:?}"))
        };
        let (url, debug) = logged("https://alice:hunter2@mcp.example.com/v1?token=abc&x=1#frag");
        assert_eq!(url, "https://mcp.example.com/v1?token=REDACTED&x=REDACTED");
        for secret in ["alice", "hunter2", "abc", "s3cret", "frag"] {
            assert!(!debug.contains(secret), "{debug}");
        }
        assert_eq!(
            logged("http://10.0.0.1:9000/mcp").0,
            "http://10.0.0.1:9000/mcp"
        );
        assert_eq!(logged("not a url").0, "(not a URL)");
    }
}
