//! The shared [`Store`] on PostgreSQL, for several instances of the service behind one load
//! balancer.
//!
//! Every call is async, on a pool of tokio-postgres connections (deadpool): a request waiting
//! on the database holds no runtime worker. Each connection keeps the statements it prepared.
//! The schema is versioned: the migrations in `src/store/migrations/` are applied at open by
//! refinery, one instance at a time (see [`migrate`]); a database written by a newer version is
//! refused rather than guessed at. Secrets are sealed exactly as in the embedded store, with
//! `storage.secret_key`, which every instance must share.
//!
//! A charge is committed (PostgreSQL's `synchronous_commit`, on by default) before `record`
//! returns; the ledger row and its day total change in one transaction.
//!
//! Where things are: `records` (organisations, keys, connectors, users), `ledger` (usage),
//! `shared` (sessions, nonces, rate limits, reservations), `instance` (heartbeat, LISTEN,
//! the queue of writes nobody waits for), `migrate` (the schema).

mod archive;
mod instance;
mod ledger;
pub mod migrate;
mod records;
mod shared;

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use callstream_actors::usage::{UsageEvent, UsageKind};
use deadpool_postgres::GenericClient;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use super::{ApiKey, Connector, DashboardUser, McpIntegration, Org, SecretBox, StoreError};

pub use migrate::MIGRATIONS;

/// How long a caller waits for a pooled connection to come free, and for a new one.
const POOL_WAIT: Duration = Duration::from_secs(10);

/// [`Store`](super::Store) (and [`SharedState`](super::SharedState)) on a PostgreSQL database.
pub struct PgStore {
    pool: deadpool_postgres::Pool,
    secrets: SecretBox,
    inserts: AtomicU64,
    /// This process's id among the instances, and its background work.
    instance: instance::Instance,
}

fn backend(e: tokio_postgres::Error) -> StoreError {
    StoreError::Backend(e.to_string())
}

fn pool_error(e: deadpool_postgres::PoolError) -> StoreError {
    use deadpool_postgres::PoolError;
    match e {
        PoolError::Timeout(_) => StoreError::Backend(format!(
            "no PostgreSQL connection came free within {} ms",
            POOL_WAIT.as_millis()
        )),
        PoolError::Backend(e) => StoreError::Backend(format!("cannot connect to PostgreSQL: {e}")),
        e => StoreError::Backend(format!("PostgreSQL pool: {e}")),
    }
}

fn is_unique_violation(e: &tokio_postgres::Error) -> bool {
    e.code() == Some(&SqlState::UNIQUE_VIOLATION)
}

/// Parameters of a statement.
type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

/// Runs `sql` (prepared once per connection) and returns its one row, if any.
async fn opt(
    c: &impl GenericClient,
    sql: &str,
    params: Params<'_>,
) -> Result<Option<Row>, StoreError> {
    let statement = c.prepare_cached(sql).await.map_err(backend)?;
    c.query_opt(&statement, params).await.map_err(backend)
}

/// Runs `sql` (prepared once per connection) and returns its rows.
async fn rows(
    c: &impl GenericClient,
    sql: &str,
    params: Params<'_>,
) -> Result<Vec<Row>, StoreError> {
    let statement = c.prepare_cached(sql).await.map_err(backend)?;
    c.query(&statement, params).await.map_err(backend)
}

/// Runs `sql` (prepared once per connection); returns the rows it changed, or the database's
/// error as it is, for callers that tell errors apart.
async fn exec_raw(
    c: &impl GenericClient,
    sql: &str,
    params: Params<'_>,
) -> Result<u64, tokio_postgres::Error> {
    let statement = c.prepare_cached(sql).await?;
    c.execute(&statement, params).await
}

/// Runs `sql` (prepared once per connection); returns the rows it changed.
async fn exec(c: &impl GenericClient, sql: &str, params: Params<'_>) -> Result<u64, StoreError> {
    exec_raw(c, sql, params).await.map_err(backend)
}

fn amount_i64(amount: u64) -> i64 {
    i64::try_from(amount).unwrap_or(i64::MAX)
}

fn amount_u64(amount: i64) -> u64 {
    u64::try_from(amount).unwrap_or(0)
}

fn kind_i16(kind: UsageKind) -> i16 {
    i16::from(kind.tag())
}

fn encode_event(event: &UsageEvent) -> String {
    serde_json::to_string(event).expect("usage events are plain data and always serialize")
}

fn decode_event(text: &str) -> Result<UsageEvent, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt("usage event".into(), e.to_string()))
}

const ORG_COLUMNS: &str =
    "id, name, system_prompt, mcp_url, mcp_headers_sealed, plan, deleted, created_at_ms, mcp_allow, \
     history";
const KEY_COLUMNS: &str = "id, org_id, name, hash, last4, created_at_ms, revoked_at_ms";
/// The lookups of every authenticated request, written out rather than formatted per call.
const ORG_BY_ID: &str = "SELECT id, name, system_prompt, mcp_url, mcp_headers_sealed, plan, \
                         deleted, created_at_ms, mcp_allow, history FROM orgs WHERE id = $1";
const KEY_BY_HASH: &str = "SELECT id, org_id, name, hash, last4, created_at_ms, revoked_at_ms \
                           FROM api_keys WHERE hash = $1";
const CONNECTOR_COLUMNS: &str =
    "client_id, org_id, name, created_at_ms, rotated_at_ms, revoked_at_ms";
const USER_COLUMNS: &str = "email, org_id, password_hash, created_at_ms";

fn key_from(row: &Row) -> ApiKey {
    let hash: Vec<u8> = row.get(3);
    ApiKey {
        id: row.get(0),
        org_id: row.get(1),
        name: row.get(2),
        hash: hash.iter().map(|b| format!("{b:02x}")).collect(),
        last4: row.get(4),
        created_at_ms: row.get(5),
        revoked_at_ms: row.get(6),
    }
}

fn connector_from(row: &Row) -> Connector {
    Connector {
        client_id: row.get(0),
        org_id: row.get(1),
        name: row.get(2),
        created_at_ms: row.get(3),
        rotated_at_ms: row.get(4),
        revoked_at_ms: row.get(5),
    }
}

fn user_from(row: &Row) -> DashboardUser {
    DashboardUser {
        email: row.get(0),
        org_id: row.get(1),
        password_hash: row.get(2),
        created_at_ms: row.get(3),
    }
}

impl PgStore {
    /// Connects to `url` (a `postgres://` URL or a `key=value` connection string), applies
    /// pending migrations, and keeps up to `pool_size` connections. Its background work (the
    /// queue of writes nobody waits for) runs on the tokio runtime this is called on.
    pub async fn open(url: &str, pool_size: usize, secrets: SecretBox) -> Result<Self, StoreError> {
        let mut config: tokio_postgres::Config = url
            .parse()
            .map_err(|e| StoreError::Backend(format!("storage.postgres_url: {e}")))?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(POOL_WAIT);
        }
        if config.get_application_name().is_none() {
            config.application_name("callstream");
        }
        let manager = deadpool_postgres::Manager::from_config(
            config.clone(),
            tokio_postgres::NoTls,
            deadpool_postgres::ManagerConfig {
                // A connection that sat idle is checked before it is handed out: the server
                // may have restarted, or a proxy dropped it.
                recycling_method: deadpool_postgres::RecyclingMethod::Verified,
            },
        );
        let pool = deadpool_postgres::Pool::builder(manager)
            .max_size(pool_size.max(1))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(POOL_WAIT))
            .create_timeout(Some(POOL_WAIT))
            .recycle_timeout(Some(Duration::from_secs(2)))
            .build()
            .map_err(|e| StoreError::Backend(format!("PostgreSQL pool: {e}")))?;
        let applied = migrate::migrate(&config).await?;
        if !applied.is_empty() {
            tracing::info!(?applied, "database schema migrated");
        }
        let instance = instance::Instance::new(pool.clone(), config.clone());
        Ok(Self {
            pool,
            secrets,
            inserts: AtomicU64::new(0),
            instance,
        })
    }

    /// A pooled connection.
    async fn conn(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.pool.get().await.map_err(pool_error)
    }

    fn org_from(&self, row: &Row) -> Result<Org, StoreError> {
        let id: String = row.get(0);
        let mcp_url: Option<String> = row.get(3);
        let sealed: Option<Vec<u8>> = row.get(4);
        let mcp = match (mcp_url, sealed) {
            (Some(url), Some(sealed)) => {
                let headers = serde_json::from_slice(&self.secrets.open(&id, &sealed)?)
                    .map_err(|e| StoreError::Corrupt("mcp headers".into(), e.to_string()))?;
                Some(McpIntegration { url, headers })
            }
            _ => None,
        };
        Ok(Org {
            name: row.get(1),
            system_prompt: row.get(2),
            mcp,
            plan: row.get(5),
            deleted: row.get(6),
            created_at_ms: row.get(7),
            mcp_allow: row.get(8),
            history: match row.get::<_, Option<String>>(9) {
                Some(text) => serde_json::from_str(&text)
                    .map_err(|e| StoreError::Corrupt("history settings".into(), e.to_string()))?,
                None => Default::default(),
            },
            id,
        })
    }

    fn sealed_headers(&self, org: &Org) -> (Option<String>, Option<Vec<u8>>) {
        match &org.mcp {
            None => (None, None),
            Some(m) => {
                let json = serde_json::to_vec(&m.headers)
                    .expect("a header map is plain data and always serializes");
                (Some(m.url.clone()), Some(self.secrets.seal(&org.id, &json)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_written_out_lookups_read_the_same_columns() {
        assert_eq!(
            ORG_BY_ID,
            format!("SELECT {ORG_COLUMNS} FROM orgs WHERE id = $1")
        );
        assert_eq!(
            KEY_BY_HASH,
            format!("SELECT {KEY_COLUMNS} FROM api_keys WHERE hash = $1")
        );
    }
}
