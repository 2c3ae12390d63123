//! Administration of organisations, API keys and connectors: one set of operations, reached
//! either directly on the data directory or, while a server holds the database, through the
//! server's admin socket (see [`socket`]). The CLI and, later, the dashboard use them.

pub mod socket;

use std::sync::Arc;

use callstream_actors::usage::UsageError;
use serde::{Deserialize, Serialize};

use crate::auth::keys;
use crate::clock;
use crate::config::{Config, StorageBackend};
use crate::store::{new_id, ApiKey, Connector, Org, SharedState, Store, StoreError};
use crate::usage::{Quotas, UsageReport};

/// One administrative operation. `Debug` (what the logs show) leaves passwords out; MCP
/// header values are left out by [`crate::store::McpIntegration`]'s own `Debug`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum AdminRequest {
    /// Create an organisation on a plan (the default plan when `None`).
    OrgCreate {
        /// Display name.
        name: String,
        /// Plan name.
        plan: Option<String>,
    },
    /// List organisations.
    OrgList,
    /// Delete an organisation: its keys then answer 404.
    OrgDelete {
        /// Organisation id.
        org: String,
    },
    /// Set or clear an organisation's system prompt.
    OrgSetPrompt {
        /// Organisation id.
        org: String,
        /// The prompt; `None` clears it.
        system_prompt: Option<String>,
    },
    /// Set or clear an organisation's MCP server.
    OrgSetMcp {
        /// Organisation id.
        org: String,
        /// The server; `None` clears it.
        mcp: Option<crate::store::McpIntegration>,
    },
    /// Set the non-public networks and host names an organisation's MCP server may have
    /// (within `llm.mcp_allow`).
    OrgSetMcpAllow {
        /// Organisation id.
        org: String,
        /// CIDR networks, addresses or host names; empty: public addresses only.
        allow: Vec<String>,
    },
    /// Set an organisation's call-history settings: retention (within its plan's) and
    /// redaction, with overrides per connector or API key.
    OrgSetHistory {
        /// Organisation id.
        org: String,
        /// The settings, replaced whole.
        history: crate::store::HistorySettings,
    },
    /// Create an API key; the response holds its secret, once.
    KeyCreate {
        /// Organisation id.
        org: String,
        /// Free text.
        name: Option<String>,
    },
    /// List an organisation's keys.
    KeyList {
        /// Organisation id.
        org: String,
    },
    /// Revoke a key.
    KeyRevoke {
        /// Key id.
        key: String,
    },
    /// Create a connector; the response holds its client secret, once.
    ConnectorCreate {
        /// Organisation id.
        org: String,
        /// Free text.
        name: Option<String>,
    },
    /// List an organisation's connectors.
    ConnectorList {
        /// Organisation id.
        org: String,
    },
    /// Replace a connector's client secret; the response holds the new one, once.
    ConnectorRotate {
        /// Client id.
        client_id: String,
    },
    /// Revoke a connector.
    ConnectorRevoke {
        /// Client id.
        client_id: String,
    },
    /// Create a dashboard user who administers an organisation.
    UserCreate {
        /// Organisation id.
        org: String,
        /// Sign-in name.
        email: String,
        /// Password (at least 12 characters); only its argon2id hash is kept.
        password: String,
    },
    /// This month's usage of an organisation.
    Usage {
        /// Organisation id.
        org: String,
    },
    /// Which store the server keeps its data in.
    Server,
}

impl std::fmt::Debug for AdminRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use AdminRequest as R;
        match self {
            R::OrgCreate { name, plan } => f
                .debug_struct("OrgCreate")
                .field("name", name)
                .field("plan", plan)
                .finish(),
            R::OrgList => f.write_str("OrgList"),
            R::OrgDelete { org } => f.debug_struct("OrgDelete").field("org", org).finish(),
            R::OrgSetPrompt { org, system_prompt } => f
                .debug_struct("OrgSetPrompt")
                .field("org", org)
                .field(
                    "prompt_chars",
                    &system_prompt.as_ref().map(|p| p.chars().count()),
                )
                .finish(),
            R::OrgSetMcp { org, mcp } => f
                .debug_struct("OrgSetMcp")
                .field("org", org)
                .field("mcp", mcp)
                .finish(),
            R::OrgSetMcpAllow { org, allow } => f
                .debug_struct("OrgSetMcpAllow")
                .field("org", org)
                .field("allow", allow)
                .finish(),
            R::OrgSetHistory { org, history } => f
                .debug_struct("OrgSetHistory")
                .field("org", org)
                .field("history", history)
                .finish(),
            R::KeyCreate { org, name } => f
                .debug_struct("KeyCreate")
                .field("org", org)
                .field("name", name)
                .finish(),
            R::KeyList { org } => f.debug_struct("KeyList").field("org", org).finish(),
            R::KeyRevoke { key } => f.debug_struct("KeyRevoke").field("key", key).finish(),
            R::ConnectorCreate { org, name } => f
                .debug_struct("ConnectorCreate")
                .field("org", org)
                .field("name", name)
                .finish(),
            R::ConnectorList { org } => f.debug_struct("ConnectorList").field("org", org).finish(),
            R::ConnectorRotate { client_id } => f
                .debug_struct("ConnectorRotate")
                .field("client_id", client_id)
                .finish(),
            R::ConnectorRevoke { client_id } => f
                .debug_struct("ConnectorRevoke")
                .field("client_id", client_id)
                .finish(),
            // E-mail addresses are personal data: they are logged at debug level only.
            R::UserCreate { org, .. } => f
                .debug_struct("UserCreate")
                .field("org", org)
                .finish_non_exhaustive(),
            R::Usage { org } => f.debug_struct("Usage").field("org", org).finish(),
            R::Server => f.write_str("Server"),
        }
    }
}

/// An organisation as shown to administrators.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrgView {
    /// Id.
    pub id: String,
    /// Name.
    pub name: String,
    /// Plan name.
    pub plan: String,
    /// Deleted flag.
    pub deleted: bool,
    /// RFC 3339.
    pub created_at: String,
    /// Whether a system prompt is set.
    pub has_system_prompt: bool,
    /// MCP server URL, if any (its headers are never shown).
    pub mcp_url: Option<String>,
    /// Non-public networks and host names its MCP server may have (within `llm.mcp_allow`).
    #[serde(default)]
    pub mcp_allow: Vec<String>,
    /// Call-history settings.
    #[serde(default)]
    pub history: crate::store::HistorySettings,
    /// Days records are kept (the organisation's own within its plan's); `None`: for ever.
    #[serde(default)]
    pub retention_days: Option<u32>,
}

/// An API key as shown to administrators: never the secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyView {
    /// Id.
    pub id: String,
    /// Organisation id.
    pub org_id: String,
    /// Free text.
    pub name: Option<String>,
    /// Last four characters of the secret.
    pub last4: String,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339, once revoked.
    pub revoked_at: Option<String>,
}

/// A connector as shown to administrators: never the secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectorView {
    /// Client id, the connector's API key.
    pub client_id: String,
    /// Organisation id.
    pub org_id: String,
    /// Free text.
    pub name: Option<String>,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339 of the last secret rotation.
    pub rotated_at: Option<String>,
    /// RFC 3339, once revoked.
    pub revoked_at: Option<String>,
}

/// The result of an [`AdminRequest`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum AdminResponse {
    /// One organisation.
    Org(OrgView),
    /// Organisations.
    Orgs {
        /// Oldest first.
        orgs: Vec<OrgView>,
    },
    /// A new key and its secret, shown this once.
    KeyCreated {
        /// The key.
        key: KeyView,
        /// The full secret.
        secret: String,
    },
    /// One key.
    Key(KeyView),
    /// Keys.
    Keys {
        /// Oldest first.
        keys: Vec<KeyView>,
    },
    /// A connector with a client secret shown this once (creation or rotation).
    ConnectorSecret {
        /// The connector.
        connector: ConnectorView,
        /// Base64 client secret.
        client_secret: String,
        /// The fixed AudioHook URL to configure in the platform.
        websocket_url: String,
    },
    /// One connector.
    Connector(ConnectorView),
    /// Connectors.
    Connectors {
        /// Oldest first.
        connectors: Vec<ConnectorView>,
        /// The fixed AudioHook URL.
        websocket_url: String,
    },
    /// Usage report.
    Usage(Box<UsageReport>),
    /// A dashboard user.
    User {
        /// Sign-in name.
        email: String,
        /// Organisation id.
        org_id: String,
    },
    /// The store a server keeps its data in.
    Server {
        /// `storage.backend`.
        backend: StorageBackend,
        /// [`crate::config::StorageConfig::location`].
        location: String,
    },
}

/// Why an administrative operation failed.
#[derive(Debug, thiserror::Error, Serialize, Deserialize)]
#[serde(tag = "code", content = "message", rename_all = "snake_case")]
pub enum AdminError {
    /// No record with that id.
    #[error("{0}")]
    NotFound(String),
    /// The request cannot be carried out as asked.
    #[error("{0}")]
    Invalid(String),
    /// The organisation has as many keys or connectors as its plan allows.
    #[error("{0}")]
    Cap(String),
    /// The store failed.
    #[error("{0}")]
    Store(String),
    /// The admin socket could not be used.
    #[error("{0}")]
    Transport(String),
}

impl From<StoreError> for AdminError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound { .. } => AdminError::NotFound(e.to_string()),
            StoreError::Exists { .. } => AdminError::Invalid(e.to_string()),
            StoreError::Cap { .. } => AdminError::Cap(e.to_string()),
            other => AdminError::Store(other.to_string()),
        }
    }
}

/// Carries out administrative operations on a store.
#[derive(Clone)]
pub struct Admin {
    config: Arc<Config>,
    store: Arc<dyn Store>,
    shared: Arc<dyn SharedState>,
}

fn org_view(o: &Org) -> OrgView {
    OrgView {
        id: o.id.clone(),
        name: o.name.clone(),
        plan: o.plan.clone(),
        deleted: o.deleted,
        created_at: clock::rfc3339(o.created_at_ms),
        has_system_prompt: o.system_prompt.as_deref().is_some_and(|p| !p.is_empty()),
        mcp_url: o.mcp.as_ref().map(|m| m.url.clone()),
        mcp_allow: o.mcp_allow.clone(),
        history: o.history.clone(),
        retention_days: None,
    }
}

fn key_view(k: &ApiKey) -> KeyView {
    KeyView {
        id: k.id.clone(),
        org_id: k.org_id.clone(),
        name: k.name.clone(),
        last4: k.last4.clone(),
        created_at: clock::rfc3339(k.created_at_ms),
        revoked_at: k.revoked_at_ms.map(clock::rfc3339),
    }
}

fn connector_view(c: &Connector) -> ConnectorView {
    ConnectorView {
        client_id: c.client_id.clone(),
        org_id: c.org_id.clone(),
        name: c.name.clone(),
        created_at: clock::rfc3339(c.created_at_ms),
        rotated_at: c.rotated_at_ms.map(clock::rfc3339),
        revoked_at: c.revoked_at_ms.map(clock::rfc3339),
    }
}

impl Admin {
    /// Operations on `store` with the plans and public URL of `config`; revocations and
    /// organisation changes are announced through `shared` to every instance.
    pub fn new(config: Arc<Config>, store: Arc<dyn Store>, shared: Arc<dyn SharedState>) -> Self {
        Self {
            config,
            store,
            shared,
        }
    }

    fn ws_url(&self) -> String {
        self.config
            .callstream_ws_url()
            .expect("the configuration was validated when loaded")
    }

    /// An organisation that exists; `live` also requires it not deleted.
    async fn org(&self, id: &str, live: bool) -> Result<Org, AdminError> {
        let org = self
            .store
            .org(id)
            .await?
            .ok_or_else(|| AdminError::NotFound(format!("no organisation with id {id}")))?;
        if live && org.deleted {
            return Err(AdminError::Invalid(format!("organisation {id} is deleted")));
        }
        Ok(org)
    }

    /// The plan of `org`; one the configuration no longer names caps nothing (its requests
    /// are refused where the plan is needed, as `plan_not_configured`).
    fn view_of(&self, org: &Org) -> OrgView {
        OrgView {
            retention_days: org.history.retention(self.plan_of(org).retention_days),
            ..org_view(org)
        }
    }

    fn plan_of(&self, org: &Org) -> crate::config::Plan {
        self.config
            .plans
            .get(&org.plan)
            .cloned()
            .unwrap_or_else(crate::config::Plan::unlimited)
    }

    /// Carries out one operation.
    pub async fn execute(&self, request: AdminRequest) -> Result<AdminResponse, AdminError> {
        let now = clock::now_ms();
        match request {
            AdminRequest::OrgCreate { name, plan } => {
                let name = name.trim().to_owned();
                if name.is_empty() {
                    return Err(AdminError::Invalid("organisation name is empty".into()));
                }
                let plan = plan.unwrap_or_else(|| self.config.limits.default_plan.clone());
                if self.config.plan(&plan).is_none() {
                    let known: Vec<&str> = self.config.plans.keys().map(String::as_str).collect();
                    return Err(AdminError::Invalid(format!(
                        "unknown plan {plan:?}; configured plans: {}",
                        known.join(", ")
                    )));
                }
                let org = Org {
                    id: new_id("org_", 10),
                    name,
                    system_prompt: None,
                    mcp: None,
                    mcp_allow: Vec::new(),
                    history: Default::default(),
                    plan,
                    deleted: false,
                    created_at_ms: now,
                };
                self.store.insert_org(&org).await?;
                Ok(AdminResponse::Org(self.view_of(&org)))
            }
            AdminRequest::OrgList => Ok(AdminResponse::Orgs {
                orgs: self
                    .store
                    .orgs()
                    .await?
                    .iter()
                    .map(|o| self.view_of(o))
                    .collect(),
            }),
            AdminRequest::OrgDelete { org } => {
                let mut org = self.org(&org, false).await?;
                if !org.deleted {
                    org.deleted = true;
                    self.store.update_org(&org).await?;
                    self.shared.announce_change().await;
                }
                Ok(AdminResponse::Org(self.view_of(&org)))
            }
            AdminRequest::OrgSetPrompt { org, system_prompt } => {
                let mut org = self.org(&org, true).await?;
                org.system_prompt = system_prompt.filter(|p| !p.trim().is_empty());
                self.store.update_org(&org).await?;
                self.shared.announce_change().await;
                Ok(AdminResponse::Org(self.view_of(&org)))
            }
            AdminRequest::OrgSetMcp { org, mcp } => {
                let mut org = self.org(&org, true).await?;
                if let Some(m) = &mcp {
                    if !(m.url.starts_with("http://") || m.url.starts_with("https://")) {
                        return Err(AdminError::Invalid(format!(
                            "MCP URL {:?} must be http:// or https://",
                            m.url
                        )));
                    }
                }
                org.mcp = mcp;
                self.store.update_org(&org).await?;
                self.shared.announce_change().await;
                Ok(AdminResponse::Org(self.view_of(&org)))
            }
            AdminRequest::OrgSetMcpAllow { org, allow } => {
                let mut org = self.org(&org, true).await?;
                for entry in &allow {
                    crate::llm::mcp::McpPolicy::new(std::slice::from_ref(entry), &[])
                        .map_err(AdminError::Invalid)?;
                }
                org.mcp_allow = allow.iter().map(|a| a.trim().to_owned()).collect();
                self.store.update_org(&org).await?;
                self.shared.announce_change().await;
                Ok(AdminResponse::Org(self.view_of(&org)))
            }
            AdminRequest::OrgSetHistory { org, history } => {
                let mut org = self.org(&org, true).await?;
                let plan_days = self.plan_of(&org).retention_days;
                match (history.retention_days, plan_days) {
                    (Some(0), _) => {
                        return Err(AdminError::Invalid(
                            "retention_days must be at least 1".into(),
                        ))
                    }
                    (Some(own), Some(plan)) if own > plan => {
                        return Err(AdminError::Invalid(format!(
                            "retention_days {own} is longer than the plan's {plan}"
                        )))
                    }
                    _ => {}
                }
                if !history.redact_connectors.is_empty() {
                    let keys = self.store.api_keys(&org.id).await?;
                    let connectors = self.store.connectors(&org.id).await?;
                    for id in history.redact_connectors.keys() {
                        let known = keys.iter().any(|k| &k.id == id)
                            || connectors.iter().any(|c| &c.client_id == id);
                        if !known {
                            return Err(AdminError::Invalid(format!(
                                "{id:?} is neither a connector nor an API key of {}",
                                org.id
                            )));
                        }
                    }
                }
                org.history = history;
                self.store.update_org(&org).await?;
                self.shared.announce_change().await;
                Ok(AdminResponse::Org(self.view_of(&org)))
            }
            AdminRequest::KeyCreate { org, name } => {
                let org = self.org(&org, true).await?;
                let most = self.plan_of(&org).max_api_keys;
                let secret = keys::new_api_key_secret();
                let key = ApiKey {
                    id: new_id("key_", 10),
                    org_id: org.id,
                    name,
                    hash: keys::hex(&keys::hash_secret(&secret)),
                    last4: keys::last4(&secret),
                    created_at_ms: now,
                    revoked_at_ms: None,
                };
                self.store.insert_api_key(&key, most).await?;
                Ok(AdminResponse::KeyCreated {
                    key: key_view(&key),
                    secret,
                })
            }
            AdminRequest::KeyList { org } => {
                let org = self.org(&org, false).await?;
                Ok(AdminResponse::Keys {
                    keys: self
                        .store
                        .api_keys(&org.id)
                        .await?
                        .iter()
                        .map(key_view)
                        .collect(),
                })
            }
            AdminRequest::UserCreate {
                org,
                email,
                password,
            } => {
                self.org(&org, true).await?;
                let email = email.trim().to_lowercase();
                if !email.contains('@') || email.len() > 254 {
                    return Err(AdminError::Invalid(format!(
                        "{email:?} is not an email address"
                    )));
                }
                if password.chars().count() < 12 {
                    return Err(AdminError::Invalid(
                        "the password must have at least 12 characters".into(),
                    ));
                }
                let user = crate::store::DashboardUser {
                    email: email.clone(),
                    org_id: org.clone(),
                    // argon2id takes tens of milliseconds of CPU: not on an async worker.
                    password_hash: tokio::task::spawn_blocking(move || {
                        crate::auth::password::hash(&password)
                    })
                    .await
                    .map_err(|e| AdminError::Store(format!("password task failed: {e}")))?,
                    created_at_ms: now,
                };
                self.store.insert_user(&user).await?;
                Ok(AdminResponse::User { email, org_id: org })
            }
            AdminRequest::KeyRevoke { key } => Ok(AdminResponse::Key(key_view(&{
                let revoked = self.store.revoke_api_key(&key, now).await?;
                self.shared.announce_change().await;
                revoked
            }))),
            AdminRequest::ConnectorCreate { org, name } => {
                let org = self.org(&org, true).await?;
                let most = self.plan_of(&org).max_connectors;
                let (secret, text) = keys::new_client_secret();
                let connector = Connector {
                    client_id: new_id("cc_", 16),
                    org_id: org.id,
                    name,
                    created_at_ms: now,
                    rotated_at_ms: None,
                    revoked_at_ms: None,
                };
                self.store
                    .insert_connector(&connector, &secret, most)
                    .await?;
                Ok(AdminResponse::ConnectorSecret {
                    connector: connector_view(&connector),
                    client_secret: text,
                    websocket_url: self.ws_url(),
                })
            }
            AdminRequest::ConnectorList { org } => {
                let org = self.org(&org, false).await?;
                Ok(AdminResponse::Connectors {
                    connectors: self
                        .store
                        .connectors(&org.id)
                        .await?
                        .iter()
                        .map(connector_view)
                        .collect(),
                    websocket_url: self.ws_url(),
                })
            }
            AdminRequest::ConnectorRotate { client_id } => {
                let (current, _) = self.store.connector(&client_id).await?.ok_or_else(|| {
                    AdminError::NotFound(format!("no connector with client id {client_id}"))
                })?;
                if current.revoked_at_ms.is_some() {
                    return Err(AdminError::Invalid(format!(
                        "connector {client_id} is revoked; create a new one"
                    )));
                }
                let (secret, text) = keys::new_client_secret();
                let connector = self
                    .store
                    .rotate_connector(&client_id, &secret, now)
                    .await?;
                Ok(AdminResponse::ConnectorSecret {
                    connector: connector_view(&connector),
                    client_secret: text,
                    websocket_url: self.ws_url(),
                })
            }
            AdminRequest::ConnectorRevoke { client_id } => {
                Ok(AdminResponse::Connector(connector_view(&{
                    let revoked = self.store.revoke_connector(&client_id, now).await?;
                    self.shared.announce_change().await;
                    revoked
                })))
            }
            AdminRequest::Server => Ok(AdminResponse::Server {
                backend: self.config.storage.backend,
                location: self.config.storage.location(),
            }),
            AdminRequest::Usage { org } => {
                let org = self.org(&org, false).await?;
                let report: UsageReport =
                    Quotas::new(self.config.clone(), self.store.clone(), self.shared.clone())
                        .report(&org.id, now)
                        .await
                        .map_err(|e| match e {
                            UsageError::UnknownOrg(id) => {
                                AdminError::NotFound(format!("no organisation with id {id}"))
                            }
                            other => AdminError::Store(other.to_string()),
                        })?;
                Ok(AdminResponse::Usage(Box::new(report)))
            }
        }
    }
}

/// How the CLI reaches a data directory: directly, or through the server that holds it.
pub enum AdminClient {
    /// The database was free and is open in this process, on a runtime of the command's own.
    Direct(Admin, tokio::runtime::Runtime),
    /// A server holds the database; requests go through its admin socket.
    Socket(std::path::PathBuf),
}

impl AdminClient {
    /// Finds the server whose admin socket is in the data directory of `config`, or, with no
    /// server there, opens the configured store. A server that keeps its data in another
    /// store than `config` names is refused, naming both: what the CLI wrote would be where
    /// that server never looks.
    pub fn connect(config: Arc<Config>) -> Result<Self, AdminError> {
        let data_dir = config.storage.data_dir.clone();
        let path = socket::socket_path(&data_dir);
        if path.exists() {
            match socket::call(&path, &AdminRequest::Server) {
                Ok(AdminResponse::Server { backend, location }) => {
                    let same = backend == config.storage.backend
                        && (backend == StorageBackend::Sled
                            || location == config.storage.location());
                    if !same {
                        return Err(AdminError::Invalid(format!(
                            "the server on {} keeps its data in {location}, but this command is \
                             configured for {}; run it with the server's storage settings (its \
                             config file or CALLSTREAM_STORAGE__* variables)",
                            path.display(),
                            config.storage.location()
                        )));
                    }
                    return Ok(AdminClient::Socket(path));
                }
                Ok(_) => {
                    return Err(AdminError::Transport(format!(
                        "the server on {} gave an unexpected answer",
                        path.display()
                    )))
                }
                // Nobody listens: a socket file left by a server that is gone.
                Err(AdminError::Transport(_)) => {}
                Err(e) => return Err(e),
            }
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| AdminError::Transport(format!("cannot start a runtime: {e}")))?;
        match runtime.block_on(crate::store::open(&config.storage)) {
            Ok(opened) => Ok(AdminClient::Direct(
                Admin::new(config, opened.store, opened.shared),
                runtime,
            )),
            Err(crate::store::OpenError::Store(StoreError::Locked(_))) => {
                Ok(AdminClient::Socket(socket::socket_path(&data_dir)))
            }
            Err(e) => Err(AdminError::Store(e.to_string())),
        }
    }

    /// Carries out one operation.
    pub fn execute(&self, request: AdminRequest) -> Result<AdminResponse, AdminError> {
        match self {
            AdminClient::Direct(admin, runtime) => runtime.block_on(admin.execute(request)),
            AdminClient::Socket(path) => socket::call(path, &request),
        }
    }
}
