//! The shared [`Store`] on PostgreSQL, for several instances of the service behind one load
//! balancer.
//!
//! The schema is versioned: [`MIGRATIONS`] are applied in order at open (one instance at a
//! time, under an advisory lock) and recorded in `schema_migrations`; a database written by a
//! newer version is refused rather than guessed at. Secrets are sealed exactly as in the
//! embedded store, with `storage.secret_key`, which every instance must share.
//!
//! The [`Store`] trait is synchronous (the embedded store answers in microseconds), so calls
//! here block: on a multi-threaded tokio runtime they run under `block_in_place`, which lets
//! the runtime move its other tasks to another worker meanwhile. Connections come from a small
//! pool; each keeps its prepared statements.
//!
//! A charge is committed (PostgreSQL's `synchronous_commit`, on by default) before `record`
//! returns; the ledger row and its day total change in one transaction.

use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use callstream_actors::usage::{UsageError, UsageEvent, UsageKind, UsageSink};
use postgres::error::SqlState;
use postgres::fallible_iterator::FallibleIterator as _;
use postgres::{Client, GenericClient, NoTls, Row, Statement};

use super::shared::{SharedState, Space, Write};
use super::{
    call_seq, hex_to_hash, ApiKey, Connector, DashboardUser, DayUsage, McpIntegration, Org,
    SecretBox, Store, StoreError,
};
use crate::clock;

/// Schema versions in order: (version, what it does, SQL).
pub const MIGRATIONS: &[(i32, &str, &str)] = &[
    (
        1,
        "organisations, keys, connectors, dashboard users, usage ledger and day totals",
        include_str!("migrations/0001_initial.sql"),
    ),
    (
        2,
        "shared entries (sessions, sign-in forms, nonces) and rate limits",
        include_str!("migrations/0002_shared_state.sql"),
    ),
    (
        3,
        "instances, their reservations and live calls",
        include_str!("migrations/0003_instances.sql"),
    ),
];

/// How often an instance writes its heartbeat.
const HEARTBEAT: Duration = Duration::from_secs(2);

/// An instance whose heartbeat is older than this (ms) is gone: its reservations and calls
/// no longer count, and the next sweep deletes them.
const INSTANCE_STALE_MS: i64 = 15_000;

/// Channel of revocations and organisation changes.
const CHANGES_CHANNEL: &str = "callstream_changes";

/// Channel of live-page events: `org id`, a tab, the event's JSON.
const LIVE_CHANNEL: &str = "callstream_live";

/// PostgreSQL refuses NOTIFY payloads from 8000 bytes on.
const MAX_NOTIFY_BYTES: usize = 7_900;

/// Key of the advisory lock that serialises migrations between instances starting together.
const MIGRATION_LOCK: i64 = 0x6361_6c6c_7374_726d; // "callstrm"

/// A pooled connection idle longer than this is checked before use (the server may have
/// restarted, or a proxy dropped it).
const CHECK_AFTER_IDLE: Duration = Duration::from_secs(30);

/// Expired shared entries and idle rate-limit rows are deleted once every this many inserts.
const SWEEP_EVERY: u64 = 512;

/// [`Store`] (and [`SharedState`]) on a PostgreSQL database.
pub struct PgStore {
    pool: Arc<Pool>,
    secrets: SecretBox,
    inserts: std::sync::atomic::AtomicU64,
    /// This process's id among the instances.
    instance: String,
    /// The background thread (heartbeat, sweeps, LISTEN) runs while this is set.
    running: Arc<AtomicBool>,
    changes: tokio::sync::watch::Sender<u64>,
    live: tokio::sync::broadcast::Sender<(String, String)>,
    /// Live-page events waiting to be sent to the other instances, by a thread of their own,
    /// so a call never waits on the database to report a transcript.
    outgoing: crossbeam_channel::Sender<String>,
    outgoing_rx: crossbeam_channel::Receiver<String>,
}

/// Live-page events queued for the other instances at most; past this they are dropped (the
/// pages that miss one reload their snapshot on the next).
const OUTGOING_EVENTS: usize = 4_096;

fn backend(e: postgres::Error) -> StoreError {
    StoreError::Backend(e.to_string())
}

fn is_unique_violation(e: &postgres::Error) -> bool {
    e.code() == Some(&SqlState::UNIQUE_VIOLATION)
}

/// Runs blocking database work from whatever thread calls: directly on a plain thread, under
/// `block_in_place` on a multi-threaded runtime, and on a scoped thread of its own on a
/// current-thread runtime (where the client's own runtime may not be entered).
fn off_runtime<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Err(_) => f(),
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        Ok(_) => std::thread::scope(|s| match s.spawn(f).join() {
            Ok(value) => value,
            Err(panic) => std::panic::resume_unwind(panic),
        }),
    }
}

/// One pooled connection and the statements prepared on it.
struct Conn {
    client: Client,
    statements: HashMap<&'static str, Statement>,
    idle_since: Instant,
}

impl Conn {
    fn statement(&mut self, sql: &'static str) -> Result<Statement, postgres::Error> {
        if let Some(statement) = self.statements.get(sql) {
            return Ok(statement.clone());
        }
        let statement = self.client.prepare(sql)?;
        self.statements.insert(sql, statement.clone());
        Ok(statement)
    }

    fn query_opt(
        &mut self,
        sql: &'static str,
        params: &[&(dyn postgres::types::ToSql + Sync)],
    ) -> Result<Option<Row>, postgres::Error> {
        let statement = self.statement(sql)?;
        self.client.query_opt(&statement, params)
    }

    fn query(
        &mut self,
        sql: &'static str,
        params: &[&(dyn postgres::types::ToSql + Sync)],
    ) -> Result<Vec<Row>, postgres::Error> {
        let statement = self.statement(sql)?;
        self.client.query(&statement, params)
    }
}

struct PoolState {
    idle: Vec<Conn>,
    open: usize,
}

/// Connections to one database, at most `size` open at once; a caller waits up to
/// `wait` for one to come free.
struct Pool {
    config: postgres::Config,
    size: usize,
    wait: Duration,
    state: Mutex<PoolState>,
    freed: Condvar,
}

impl Pool {
    fn lock(&self) -> parking_lot::MutexGuard<'_, PoolState> {
        self.state.lock()
    }

    fn take(&self) -> Result<Conn, StoreError> {
        let deadline = Instant::now() + self.wait;
        let mut state = self.lock();
        loop {
            if let Some(mut conn) = state.idle.pop() {
                drop(state);
                if conn.idle_since.elapsed() < CHECK_AFTER_IDLE
                    || conn.client.is_valid(Duration::from_secs(2)).is_ok()
                {
                    return Ok(conn);
                }
                // Gone stale: replace it.
                state = self.lock();
                state.open -= 1;
                continue;
            }
            if state.open < self.size {
                state.open += 1;
                drop(state);
                return match self.config.connect(NoTls) {
                    Ok(client) => Ok(Conn {
                        client,
                        statements: HashMap::new(),
                        idle_since: Instant::now(),
                    }),
                    Err(e) => {
                        self.lock().open -= 1;
                        self.freed.notify_one();
                        Err(StoreError::Backend(format!(
                            "cannot connect to PostgreSQL: {e}"
                        )))
                    }
                };
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(StoreError::Backend(format!(
                    "all {} PostgreSQL connections stayed busy for {} ms",
                    self.size,
                    self.wait.as_millis()
                )));
            }
            self.freed.wait_for(&mut state, deadline - now);
        }
    }

    fn give_back(&self, mut conn: Conn) {
        let mut state = self.lock();
        if conn.client.is_closed() {
            state.open -= 1;
        } else {
            conn.idle_since = Instant::now();
            state.idle.push(conn);
        }
        drop(state);
        self.freed.notify_one();
    }

    /// Runs `f` on a pooled connection, off the async runtime.
    fn with<T: Send>(
        &self,
        f: impl FnOnce(&mut Conn) -> Result<T, StoreError> + Send,
    ) -> Result<T, StoreError> {
        off_runtime(|| {
            let mut conn = self.take()?;
            let result = f(&mut conn);
            self.give_back(conn);
            result
        })
    }
}

/// Applies the migrations `client`'s database lacks, one instance at a time; returns the
/// versions applied.
pub fn migrate(client: &mut Client) -> Result<Vec<i32>, StoreError> {
    let mut tx = client.transaction().map_err(backend)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .map_err(backend)?;
    // "relation already exists, skipping" is not news.
    tx.batch_execute("SET LOCAL client_min_messages = warning")
        .map_err(backend)?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (
             version     integer PRIMARY KEY,
             description text NOT NULL,
             applied_at  timestamptz NOT NULL DEFAULT now()
         )",
    )
    .map_err(backend)?;
    let current: i32 = tx
        .query_one(
            "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
            &[],
        )
        .map_err(backend)?
        .get(0);
    let known = MIGRATIONS.last().map_or(0, |m| m.0);
    if current > known {
        return Err(StoreError::Backend(format!(
            "the database schema is at version {current}, newer than this build knows ({known}); \
             run the newer callstream against it"
        )));
    }
    let mut applied = Vec::new();
    for &(version, description, sql) in MIGRATIONS.iter().filter(|m| m.0 > current) {
        tx.batch_execute(sql).map_err(|e| {
            StoreError::Backend(format!("migration {version} ({description}) failed: {e}"))
        })?;
        tx.execute(
            "INSERT INTO schema_migrations (version, description) VALUES ($1, $2)",
            &[&version, &description],
        )
        .map_err(backend)?;
        applied.push(version);
    }
    tx.commit().map_err(backend)?;
    Ok(applied)
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

/// Adds `amount` to a day total, inside the caller's transaction.
fn add_to_day(
    tx: &mut impl GenericClient,
    org_id: &str,
    day: &str,
    kind: UsageKind,
    amount: u64,
) -> Result<(), postgres::Error> {
    if amount == 0 {
        return Ok(());
    }
    tx.execute(
        "INSERT INTO usage_daily (org_id, day, kind, amount) VALUES ($1, $2, $3, $4)
         ON CONFLICT (org_id, day, kind) DO UPDATE SET amount = usage_daily.amount + EXCLUDED.amount",
        &[&org_id, &day, &kind_i16(kind), &amount_i64(amount)],
    )?;
    Ok(())
}

const ORG_COLUMNS: &str =
    "id, name, system_prompt, mcp_url, mcp_headers_sealed, plan, deleted, created_at_ms";
const KEY_COLUMNS: &str = "id, org_id, name, hash, last4, created_at_ms, revoked_at_ms";
const CONNECTOR_COLUMNS: &str =
    "client_id, org_id, name, created_at_ms, rotated_at_ms, revoked_at_ms";

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
    /// pending migrations, and keeps up to `pool_size` connections.
    pub fn open(url: &str, pool_size: usize, secrets: SecretBox) -> Result<Self, StoreError> {
        let mut config: postgres::Config = url
            .parse()
            .map_err(|e| StoreError::Backend(format!("storage.postgres_url: {e}")))?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(10));
        }
        if config.get_application_name().is_none() {
            config.application_name("callstream");
        }
        let pool = Pool {
            config,
            size: pool_size.max(1),
            wait: Duration::from_secs(10),
            state: Mutex::new(PoolState {
                idle: Vec::new(),
                open: 0,
            }),
            freed: Condvar::new(),
        };
        let outgoing = crossbeam_channel::bounded(OUTGOING_EVENTS);
        let store = Self {
            pool: Arc::new(pool),
            secrets,
            inserts: Default::default(),
            instance: super::new_id("inst_", 10),
            running: Arc::new(AtomicBool::new(false)),
            changes: tokio::sync::watch::channel(0).0,
            live: tokio::sync::broadcast::channel(1024).0,
            outgoing: outgoing.0,
            outgoing_rx: outgoing.1,
        };
        let applied = store.pool.with(|conn| migrate(&mut conn.client))?;
        if !applied.is_empty() {
            tracing::info!(?applied, "database schema migrated");
        }
        Ok(store)
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

    fn update_connector(
        &self,
        client_id: &str,
        sql: &'static str,
        params: &[&(dyn postgres::types::ToSql + Sync)],
    ) -> Result<Connector, StoreError> {
        let row = self
            .pool
            .with(|conn| conn.client.query_opt(sql, params).map_err(backend))?;
        row.map(|r| connector_from(&r))
            .ok_or_else(|| StoreError::NotFound {
                kind: "connector",
                id: client_id.to_owned(),
            })
    }
}

impl Store for PgStore {
    fn insert_user(&self, user: &DashboardUser) -> Result<(), StoreError> {
        let inserted = self.pool.with(|conn| {
            conn.client
                .execute(
                    "INSERT INTO dashboard_users (email, org_id, password_hash, created_at_ms)
                     VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
                    &[
                        &user.email,
                        &user.org_id,
                        &user.password_hash,
                        &user.created_at_ms,
                    ],
                )
                .map_err(backend)
        })?;
        if inserted == 0 {
            return Err(StoreError::Exists {
                kind: "dashboard user",
                id: user.email.clone(),
            });
        }
        Ok(())
    }

    fn user(&self, email: &str) -> Result<Option<DashboardUser>, StoreError> {
        let row = self.pool.with(|conn| {
            conn.query_opt(
                "SELECT email, org_id, password_hash, created_at_ms
                 FROM dashboard_users WHERE email = $1",
                &[&email],
            )
            .map_err(backend)
        })?;
        Ok(row.as_ref().map(user_from))
    }

    fn users(&self) -> Result<Vec<DashboardUser>, StoreError> {
        let rows = self.pool.with(|conn| {
            conn.client
                .query(
                    "SELECT email, org_id, password_hash, created_at_ms
                     FROM dashboard_users ORDER BY created_at_ms, email",
                    &[],
                )
                .map_err(backend)
        })?;
        Ok(rows.iter().map(user_from).collect())
    }

    fn insert_org(&self, org: &Org) -> Result<(), StoreError> {
        let (mcp_url, sealed) = self.sealed_headers(org);
        let inserted = self.pool.with(|conn| {
            conn.client
                .execute(
                    "INSERT INTO orgs (id, name, system_prompt, mcp_url, mcp_headers_sealed, plan,
                                       deleted, created_at_ms)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING",
                    &[
                        &org.id,
                        &org.name,
                        &org.system_prompt,
                        &mcp_url,
                        &sealed,
                        &org.plan,
                        &org.deleted,
                        &org.created_at_ms,
                    ],
                )
                .map_err(backend)
        })?;
        if inserted == 0 {
            return Err(StoreError::Exists {
                kind: "organisation",
                id: org.id.clone(),
            });
        }
        Ok(())
    }

    fn update_org(&self, org: &Org) -> Result<(), StoreError> {
        let (mcp_url, sealed) = self.sealed_headers(org);
        let updated = self.pool.with(|conn| {
            conn.client
                .execute(
                    "UPDATE orgs SET name = $2, system_prompt = $3, mcp_url = $4,
                                     mcp_headers_sealed = $5, plan = $6, deleted = $7,
                                     created_at_ms = $8
                     WHERE id = $1",
                    &[
                        &org.id,
                        &org.name,
                        &org.system_prompt,
                        &mcp_url,
                        &sealed,
                        &org.plan,
                        &org.deleted,
                        &org.created_at_ms,
                    ],
                )
                .map_err(backend)
        })?;
        if updated == 0 {
            return Err(StoreError::NotFound {
                kind: "organisation",
                id: org.id.clone(),
            });
        }
        Ok(())
    }

    fn org(&self, id: &str) -> Result<Option<Org>, StoreError> {
        let row = self.pool.with(|conn| {
            conn.query_opt(
                "SELECT id, name, system_prompt, mcp_url, mcp_headers_sealed, plan, deleted,
                        created_at_ms
                 FROM orgs WHERE id = $1",
                &[&id],
            )
            .map_err(backend)
        })?;
        row.map(|r| self.org_from(&r)).transpose()
    }

    fn orgs(&self) -> Result<Vec<Org>, StoreError> {
        let rows = self.pool.with(|conn| {
            conn.client
                .query(
                    &format!("SELECT {ORG_COLUMNS} FROM orgs ORDER BY created_at_ms, id"),
                    &[],
                )
                .map_err(backend)
        })?;
        rows.iter().map(|r| self.org_from(r)).collect()
    }

    fn insert_api_key(&self, key: &ApiKey) -> Result<(), StoreError> {
        let hash = hex_to_hash(&key.hash).ok_or_else(|| {
            StoreError::Corrupt(key.id.clone(), "hash is not 64 hex digits".into())
        })?;
        let hash = hash.to_vec();
        let result = self.pool.with(|conn| {
            Ok(conn.client.execute(
                &format!(
                    "INSERT INTO api_keys ({KEY_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7)"
                ),
                &[
                    &key.id,
                    &key.org_id,
                    &key.name,
                    &hash,
                    &key.last4,
                    &key.created_at_ms,
                    &key.revoked_at_ms,
                ],
            ))
        })?;
        match result {
            Ok(_) => Ok(()),
            Err(e) if is_unique_violation(&e) => Err(StoreError::Exists {
                kind: "API key",
                id: key.id.clone(),
            }),
            Err(e) => Err(backend(e)),
        }
    }

    fn revoke_api_key(&self, id: &str, at_ms: i64) -> Result<ApiKey, StoreError> {
        let row = self.pool.with(|conn| {
            conn.client
                .query_opt(
                    &format!(
                        "UPDATE api_keys SET revoked_at_ms = COALESCE(revoked_at_ms, $2)
                         WHERE id = $1 RETURNING {KEY_COLUMNS}"
                    ),
                    &[&id, &at_ms],
                )
                .map_err(backend)
        })?;
        row.map(|r| key_from(&r))
            .ok_or_else(|| StoreError::NotFound {
                kind: "API key",
                id: id.to_owned(),
            })
    }

    fn api_key(&self, id: &str) -> Result<Option<ApiKey>, StoreError> {
        let row = self.pool.with(|conn| {
            conn.query_opt(
                "SELECT id, org_id, name, hash, last4, created_at_ms, revoked_at_ms
                 FROM api_keys WHERE id = $1",
                &[&id],
            )
            .map_err(backend)
        })?;
        Ok(row.as_ref().map(key_from))
    }

    fn api_key_by_hash(&self, hash: &[u8; 32]) -> Result<Option<ApiKey>, StoreError> {
        let hash = hash.as_slice();
        let row = self.pool.with(|conn| {
            conn.query_opt(
                "SELECT id, org_id, name, hash, last4, created_at_ms, revoked_at_ms
                 FROM api_keys WHERE hash = $1",
                &[&hash],
            )
            .map_err(backend)
        })?;
        Ok(row.as_ref().map(key_from))
    }

    fn api_keys(&self, org_id: &str) -> Result<Vec<ApiKey>, StoreError> {
        let rows = self.pool.with(|conn| {
            conn.query(
                "SELECT id, org_id, name, hash, last4, created_at_ms, revoked_at_ms
                 FROM api_keys WHERE org_id = $1 ORDER BY created_at_ms, id",
                &[&org_id],
            )
            .map_err(backend)
        })?;
        Ok(rows.iter().map(key_from).collect())
    }

    fn insert_connector(&self, connector: &Connector, secret: &[u8]) -> Result<(), StoreError> {
        let sealed = self.secrets.seal(&connector.client_id, secret);
        let inserted = self.pool.with(|conn| {
            conn.client
                .execute(
                    &format!(
                        "INSERT INTO connectors ({CONNECTOR_COLUMNS}, secret_sealed)
                         VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING"
                    ),
                    &[
                        &connector.client_id,
                        &connector.org_id,
                        &connector.name,
                        &connector.created_at_ms,
                        &connector.rotated_at_ms,
                        &connector.revoked_at_ms,
                        &sealed,
                    ],
                )
                .map_err(backend)
        })?;
        if inserted == 0 {
            return Err(StoreError::Exists {
                kind: "connector",
                id: connector.client_id.clone(),
            });
        }
        Ok(())
    }

    fn rotate_connector(
        &self,
        client_id: &str,
        secret: &[u8],
        at_ms: i64,
    ) -> Result<Connector, StoreError> {
        let sealed = self.secrets.seal(client_id, secret);
        self.update_connector(
            client_id,
            "UPDATE connectors SET secret_sealed = $2, rotated_at_ms = $3 WHERE client_id = $1
             RETURNING client_id, org_id, name, created_at_ms, rotated_at_ms, revoked_at_ms",
            &[&client_id, &sealed, &at_ms],
        )
    }

    fn revoke_connector(&self, client_id: &str, at_ms: i64) -> Result<Connector, StoreError> {
        self.update_connector(
            client_id,
            "UPDATE connectors SET revoked_at_ms = COALESCE(revoked_at_ms, $2)
             WHERE client_id = $1
             RETURNING client_id, org_id, name, created_at_ms, rotated_at_ms, revoked_at_ms",
            &[&client_id, &at_ms],
        )
    }

    fn connector(&self, client_id: &str) -> Result<Option<(Connector, Vec<u8>)>, StoreError> {
        let row = self.pool.with(|conn| {
            conn.query_opt(
                "SELECT client_id, org_id, name, created_at_ms, rotated_at_ms, revoked_at_ms,
                        secret_sealed
                 FROM connectors WHERE client_id = $1",
                &[&client_id],
            )
            .map_err(backend)
        })?;
        let Some(row) = row else {
            return Ok(None);
        };
        let sealed: Vec<u8> = row.get(6);
        let secret = self.secrets.open(client_id, &sealed)?;
        Ok(Some((connector_from(&row), secret)))
    }

    fn connectors(&self, org_id: &str) -> Result<Vec<Connector>, StoreError> {
        let rows = self.pool.with(|conn| {
            conn.query(
                "SELECT client_id, org_id, name, created_at_ms, rotated_at_ms, revoked_at_ms
                 FROM connectors WHERE org_id = $1 ORDER BY created_at_ms, client_id",
                &[&org_id],
            )
            .map_err(backend)
        })?;
        Ok(rows.iter().map(connector_from).collect())
    }

    fn usage_by_day(
        &self,
        org_id: &str,
        from: &str,
        to: &str,
    ) -> Result<Vec<DayUsage>, StoreError> {
        let rows = self.pool.with(|conn| {
            conn.query(
                "SELECT day, kind, amount FROM usage_daily
                 WHERE org_id = $1 AND day >= $2 AND day <= $3 ORDER BY day, kind",
                &[&org_id, &from, &to],
            )
            .map_err(backend)
        })?;
        rows.iter()
            .map(|row| {
                let tag: i16 = row.get(1);
                let kind = u8::try_from(tag)
                    .ok()
                    .and_then(UsageKind::from_tag)
                    .ok_or_else(|| {
                        StoreError::Corrupt("daily usage".into(), format!("kind {tag}"))
                    })?;
                Ok(DayUsage {
                    day: row.get(0),
                    kind,
                    amount: amount_u64(row.get(2)),
                })
            })
            .collect()
    }

    fn usage_events(
        &self,
        org_id: &str,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<Vec<UsageEvent>, StoreError> {
        let rows = self.pool.with(|conn| {
            conn.query(
                "SELECT event FROM usage_ledger
                 WHERE org_id = $1 AND at_ms >= $2 AND at_ms < $3 ORDER BY at_ms, seq",
                &[&org_id, &from_ms, &to_ms],
            )
            .map_err(backend)
        })?;
        rows.iter().map(|row| decode_event(row.get(0))).collect()
    }
}

impl UsageSink for PgStore {
    fn record(&self, event: &UsageEvent) -> Result<(), UsageError> {
        self.pool
            .with(|conn| {
                let record = conn.statement(RECORD_SQL).map_err(backend)?;
                write_event(&mut conn.client, &record, event).map_err(backend)
            })
            .map_err(UsageError::from)
    }

    fn checkpoint(&self, totals: &[UsageEvent]) -> Result<(), UsageError> {
        if totals.is_empty() {
            return Ok(());
        }
        self.pool
            .with(|conn| {
                let mut tx = conn.client.transaction().map_err(backend)?;
                write_totals(&mut tx, totals).map_err(backend)?;
                tx.commit().map_err(backend)
            })
            .map_err(UsageError::from)
    }
}

/// Appends a usage event to the ledger and its day total, in one statement:
/// `$1` organisation, `$2` at (ms), `$3` kind, `$4` amount, `$5` the event, `$6` its day.
const RECORD_SQL: &str = "WITH ledger AS (
         INSERT INTO usage_ledger (org_id, at_ms, seq, kind, amount, event)
         VALUES ($1, $2, nextval('usage_ledger_seq'), $3, $4, $5)
     )
     INSERT INTO usage_daily (org_id, day, kind, amount)
     SELECT $1, $6, $3, $4 WHERE $4 > 0
     ON CONFLICT (org_id, day, kind)
     DO UPDATE SET amount = usage_daily.amount + EXCLUDED.amount";

/// Takes `$4` off instance `$1`'s reservation of organisation `$2`'s pool `$3`.
const RELEASE_SQL: &str = "UPDATE reservations SET amount = GREATEST(amount - $4, 0)
     WHERE instance_id = $1 AND org_id = $2 AND kind = $3";

/// The lock `callstream_reserve` takes alone on organisation `$1`'s pool `$2`, shared, until
/// the transaction ends.
const POOL_SHARED_SQL: &str = "SELECT pg_advisory_xact_lock_shared(hashtextextended(
     'reserve/' || $1::text || '/' || ($2::smallint)::text, 0))";

/// Appends `event` to the ledger and its day total with `record` (prepared [`RECORD_SQL`]):
/// one statement, so both or neither.
fn write_event(
    client: &mut impl GenericClient,
    record: &Statement,
    event: &UsageEvent,
) -> Result<(), postgres::Error> {
    client
        .query(
            record,
            &[
                &event.org_id,
                &event.at_ms,
                &kind_i16(event.kind),
                &amount_i64(event.amount),
                &encode_event(event),
                &clock::day_of(event.at_ms),
            ],
        )
        .map(drop)
}

/// Writes live calls' running totals (see [`UsageSink::checkpoint`]) inside `tx`.
fn write_totals(
    tx: &mut postgres::Transaction<'_>,
    totals: &[UsageEvent],
) -> Result<(), postgres::Error> {
    for total in totals {
        let seq = call_seq(total.call_id.as_deref().unwrap_or_default()) as i64;
        let event = encode_event(total);
        // The row exists (at zero when new) and is locked before it is read, so two writers
        // of one call's total cannot both add the same growth.
        tx.execute(
            "INSERT INTO usage_ledger (org_id, at_ms, seq, kind, amount, event)
             VALUES ($1, $2, $3, $4, 0, $5) ON CONFLICT DO NOTHING",
            &[
                &total.org_id,
                &total.at_ms,
                &seq,
                &kind_i16(total.kind),
                &event,
            ],
        )?;
        // The day grows by what the call's total grew since it was last written.
        let before: i64 = tx
            .query_one(
                "SELECT amount FROM usage_ledger
                 WHERE org_id = $1 AND at_ms = $2 AND seq = $3 FOR UPDATE",
                &[&total.org_id, &total.at_ms, &seq],
            )?
            .get(0);
        tx.execute(
            "UPDATE usage_ledger SET kind = $4, amount = $5, event = $6
             WHERE org_id = $1 AND at_ms = $2 AND seq = $3",
            &[
                &total.org_id,
                &total.at_ms,
                &seq,
                &kind_i16(total.kind),
                &amount_i64(total.amount),
                &event,
            ],
        )?;
        let before = amount_u64(before);
        add_to_day(
            tx,
            &total.org_id,
            &clock::day_of(total.at_ms),
            total.kind,
            total.amount.saturating_sub(before),
        )?;
    }
    Ok(())
}

/// Takes `amount` off `instance`'s reservation of a pool with `release` (prepared
/// [`RELEASE_SQL`]).
fn release_held(
    client: &mut impl GenericClient,
    release: &Statement,
    instance: &str,
    (org_id, kind, amount): (&str, UsageKind, u64),
) -> Result<(), postgres::Error> {
    client
        .execute(
            release,
            &[&instance, &org_id, &kind_i16(kind), &amount_i64(amount)],
        )
        .map(drop)
}

/// The database's clock in Unix ms: one clock for every instance.
const DB_NOW_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

impl PgStore {
    /// Once every [`SWEEP_EVERY`] inserts, deletes what has expired (best effort).
    fn maybe_sweep(&self, conn: &mut Conn) {
        let n = self
            .inserts
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if !n.is_multiple_of(SWEEP_EVERY) {
            return;
        }
        let swept = conn.client.batch_execute(&format!(
            "DELETE FROM shared_entries WHERE expires_ms <= {DB_NOW_MS};
             DELETE FROM rate_limits WHERE tat_ms < {DB_NOW_MS} - 60000;"
        ));
        if let Err(e) = swept {
            tracing::warn!(error = %e, "sweeping expired shared entries failed");
        }
    }
}

impl SharedState for PgStore {
    fn rate(
        &self,
        key: &str,
        per_minute: u32,
        _now: Instant,
    ) -> Result<Result<(), Duration>, StoreError> {
        let interval_ms = i64::from(60_000 / per_minute.max(1));
        let tolerance_ms = 60_000 - interval_ms;
        self.pool.with(|conn| {
            // One statement: the row is locked while it is read and moved on, so two instances
            // counting the same key at once are serialised by the database.
            let allowed = conn
                .query_opt(
                    "INSERT INTO rate_limits AS r (key, tat_ms)
                     VALUES ($1, (extract(epoch from clock_timestamp()) * 1000)::bigint + $2)
                     ON CONFLICT (key) DO UPDATE
                         SET tat_ms = GREATEST(r.tat_ms, EXCLUDED.tat_ms - $2) + $2
                         WHERE GREATEST(r.tat_ms, EXCLUDED.tat_ms - $2)
                               - (EXCLUDED.tat_ms - $2) <= $3
                     RETURNING tat_ms",
                    &[&key, &interval_ms, &tolerance_ms],
                )
                .map_err(backend)?;
            if allowed.is_some() {
                self.maybe_sweep(conn);
                return Ok(Ok(()));
            }
            let ahead: Option<i64> = conn
                .query_opt(
                    "SELECT tat_ms - (extract(epoch from clock_timestamp()) * 1000)::bigint
                     FROM rate_limits WHERE key = $1",
                    &[&key],
                )
                .map_err(backend)?
                .map(|row| row.get(0));
            let wait_ms = ahead.unwrap_or(0).saturating_sub(tolerance_ms).max(1);
            Ok(Err(Duration::from_millis(wait_ms as u64)))
        })
    }

    fn insert_new(
        &self,
        space: Space,
        key: &str,
        value: &str,
        expires_ms: i64,
    ) -> Result<bool, StoreError> {
        let now = clock::now_ms();
        self.pool.with(|conn| {
            let stored = conn
                .query_opt(
                    "INSERT INTO shared_entries AS e (space, key, value, expires_ms)
                     VALUES ($1, $2, $3, $4)
                     ON CONFLICT (space, key) DO UPDATE
                         SET value = EXCLUDED.value, expires_ms = EXCLUDED.expires_ms
                         WHERE e.expires_ms <= $5
                     RETURNING 1",
                    &[&(space as i16), &key, &value, &expires_ms, &now],
                )
                .map_err(backend)?
                .is_some();
            self.maybe_sweep(conn);
            Ok(stored)
        })
    }

    fn get(&self, space: Space, key: &str) -> Result<Option<String>, StoreError> {
        let now = clock::now_ms();
        self.pool.with(|conn| {
            Ok(conn
                .query_opt(
                    "SELECT value FROM shared_entries
                     WHERE space = $1 AND key = $2 AND expires_ms > $3",
                    &[&(space as i16), &key, &now],
                )
                .map_err(backend)?
                .map(|row| row.get(0)))
        })
    }

    fn take(&self, space: Space, key: &str) -> Result<Option<String>, StoreError> {
        let now = clock::now_ms();
        self.pool.with(|conn| {
            Ok(conn
                .query_opt(
                    "DELETE FROM shared_entries WHERE space = $1 AND key = $2
                     RETURNING value, expires_ms",
                    &[&(space as i16), &key],
                )
                .map_err(backend)?
                .filter(|row| row.get::<_, i64>(1) > now)
                .map(|row| row.get(0)))
        })
    }

    fn reserve(
        &self,
        pool: super::shared::PoolRef<'_>,
        want: u64,
        min: u64,
        _used: &dyn Fn() -> Result<u64, StoreError>,
    ) -> Result<Option<u64>, StoreError> {
        let kind = kind_i16(pool.kind);
        self.pool.with(|conn| {
            // An unlimited pool has nothing to share: no other instance asks about it.
            let Some(quota) = pool.quota else {
                return Ok(Some(want));
            };
            // One round trip: the function takes a lock per pool (every instance reserving
            // from it waits its turn), reads what is left and takes its share.
            let granted: i64 = conn
                .query_opt(
                    "SELECT callstream_reserve($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                    &[
                        &self.instance,
                        &pool.org_id,
                        &kind,
                        &amount_i64(quota),
                        &amount_i64(want),
                        &amount_i64(min),
                        &pool.first_day,
                        &pool.last_day,
                        &INSTANCE_STALE_MS,
                    ],
                )
                .map_err(backend)?
                .map_or(-1, |row| row.get(0));
            if granted < 0 {
                return Ok(None);
            }
            let granted = amount_u64(granted);
            Ok(Some(granted))
        })
    }

    fn reserved(&self, org_id: &str, kind: UsageKind) -> Result<u64, StoreError> {
        // On every quota check: a fixed statement, prepared once per connection.
        let held = self.pool.with(|conn| {
            conn.query_opt(
                "SELECT COALESCE(SUM(r.amount), 0)::bigint FROM reservations r
                 JOIN instances i ON i.id = r.instance_id
                 WHERE r.org_id = $1 AND r.kind = $2
                   AND i.heartbeat_ms > (extract(epoch from clock_timestamp()) * 1000)::bigint - $3",
                &[&org_id, &kind_i16(kind), &INSTANCE_STALE_MS],
            )
            .map_err(backend)
        })?;
        Ok(held.map_or(0, |row| amount_u64(row.get(0))))
    }

    fn release(&self, org_id: &str, kind: UsageKind, amount: u64) -> Result<(), StoreError> {
        if amount == 0 {
            return Ok(());
        }
        self.pool.with(|conn| {
            let release = conn.statement(RELEASE_SQL).map_err(backend)?;
            release_held(
                &mut conn.client,
                &release,
                &self.instance,
                (org_id, kind, amount),
            )
            .map_err(backend)
        })
    }

    fn settle(
        &self,
        _ledger: &dyn UsageSink,
        usage: Write<'_>,
        release: &[(&str, UsageKind, u64)],
    ) -> Result<(), UsageError> {
        // This database is the ledger too: the write and the release are one transaction,
        // holding the lock `callstream_reserve` takes alone per pool, shared (settlements go
        // together; a reservation waits for those in flight, and reads both or neither).
        // Locks are taken in one order, so settlements never wait on each other in a circle.
        let mut pools: Vec<(&str, UsageKind)> = release
            .iter()
            .filter(|(_, _, amount)| *amount > 0)
            .map(|(org_id, kind, _)| (*org_id, *kind))
            .collect();
        pools.sort_by_key(|(org_id, kind)| (*org_id, kind.tag()));
        pools.dedup();
        self.pool
            .with(|conn| {
                let lock = conn.statement(POOL_SHARED_SQL).map_err(backend)?;
                let record = conn.statement(RECORD_SQL).map_err(backend)?;
                let give_back = conn.statement(RELEASE_SQL).map_err(backend)?;
                let mut tx = conn.client.transaction().map_err(backend)?;
                for (org_id, kind) in &pools {
                    tx.execute(&lock, &[org_id, &kind_i16(*kind)])
                        .map_err(backend)?;
                }
                match usage {
                    Write::Event(event) => write_event(&mut tx, &record, event),
                    Write::Totals(totals) => write_totals(&mut tx, totals),
                }
                .map_err(backend)?;
                for held in release.iter().filter(|r| r.2 > 0) {
                    release_held(&mut tx, &give_back, &self.instance, *held).map_err(backend)?;
                }
                tx.commit().map_err(backend)
            })
            .map_err(UsageError::from)
    }

    fn start_instance(&self) {
        if self.running.swap(true, Ordering::AcqRel) {
            return;
        }
        let (pool, instance, running) = (
            self.pool.clone(),
            self.instance.clone(),
            self.running.clone(),
        );
        let (changes, live) = (self.changes.clone(), self.live.clone());
        // The first heartbeat is written before this returns, so the instance's reservations
        // count from its first request.
        if let Err(e) = self
            .pool
            .with(|conn| heartbeat(&mut conn.client, &instance).map_err(backend))
        {
            tracing::warn!(error = %e, "first instance heartbeat failed");
        }
        let spawned = std::thread::Builder::new()
            .name("pg-instance".into())
            .spawn(move || background(pool, instance, running, changes, live));
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the instance thread");
        }
        let (pool, events, running) = (
            self.pool.clone(),
            self.outgoing_rx.clone(),
            self.running.clone(),
        );
        let spawned = std::thread::Builder::new()
            .name("pg-live-events".into())
            .spawn(move || send_live_events(&pool, &events, &running));
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the live-events thread");
        }
    }

    fn stop_instance(&self) {
        if !self.running.swap(false, Ordering::AcqRel) {
            return;
        }
        let instance = self.instance.clone();
        let cleared = self.pool.with(|conn| {
            let mut tx = conn.client.transaction().map_err(backend)?;
            for table in [
                "instances WHERE id",
                "reservations WHERE instance_id",
                "live_calls WHERE instance_id",
            ] {
                tx.execute(&format!("DELETE FROM {table} = $1"), &[&instance])
                    .map_err(backend)?;
            }
            tx.commit().map_err(backend)
        });
        if let Err(e) = cleared {
            tracing::warn!(error = %e, "cannot withdraw this instance; its rows expire in 15 s");
        }
    }

    fn set_draining(&self) {
        let instance = self.instance.clone();
        let set = self.pool.with(|conn| {
            conn.client
                .execute(
                    "UPDATE instances SET draining = true WHERE id = $1",
                    &[&instance],
                )
                .map_err(backend)
        });
        if let Err(e) = set {
            tracing::warn!(error = %e, "cannot mark this instance draining");
        }
    }

    fn changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.changes.subscribe())
    }

    fn announce_change(&self) {
        // This instance's own watchers are told at once, not after the round trip.
        self.changes.send_modify(|n| *n += 1);
        self.notify(CHANGES_CHANNEL, "");
    }

    fn call_opened(&self, call_id: &str, org_id: &str, call: &str) {
        let listed = self.pool.with(|conn| {
            conn.client
                .execute(
                    "INSERT INTO live_calls (call_id, instance_id, org_id, call)
                     VALUES ($1, $2, $3, $4)
                     ON CONFLICT (call_id) DO UPDATE SET call = EXCLUDED.call",
                    &[&call_id, &self.instance, &org_id, &call],
                )
                .map_err(backend)
        });
        if let Err(e) = listed {
            tracing::warn!(error = %e, "cannot list the call for other instances");
        }
    }

    fn call_ended(&self, call_id: &str) {
        let removed = self.pool.with(|conn| {
            conn.client
                .execute("DELETE FROM live_calls WHERE call_id = $1", &[&call_id])
                .map_err(backend)
        });
        if let Err(e) = removed {
            tracing::warn!(error = %e, "cannot unlist the call");
        }
    }

    fn remote_calls(&self, org_id: &str) -> Vec<super::shared::RemoteCall> {
        let rows = self.pool.with(|conn| {
            conn.query(
                "SELECT c.instance_id, c.call FROM live_calls c
                 JOIN instances i ON i.id = c.instance_id
                 WHERE c.org_id = $1 AND c.instance_id <> $2
                   AND i.heartbeat_ms > (extract(epoch from clock_timestamp()) * 1000)::bigint - $3",
                &[&org_id, &self.instance, &INSTANCE_STALE_MS],
            )
            .map_err(backend)
        });
        match rows {
            Ok(rows) => rows
                .iter()
                .map(|r| super::shared::RemoteCall {
                    instance: r.get(0),
                    call: r.get(1),
                })
                .collect(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot list other instances' calls");
                Vec::new()
            }
        }
    }

    fn publish_live(&self, org_id: &str, event: &str) {
        let payload = format!("{}\t{org_id}\t{event}", self.instance);
        if payload.len() > MAX_NOTIFY_BYTES {
            tracing::debug!(
                bytes = payload.len(),
                "live event too large to share; skipped"
            );
            return;
        }
        if self.outgoing.try_send(payload).is_err() {
            tracing::debug!("live events queue full; an event for other instances is dropped");
        }
    }

    fn remote_live(&self) -> Option<tokio::sync::broadcast::Receiver<(String, String)>> {
        Some(self.live.subscribe())
    }
}

/// The instance's background work, on a connection of its own: LISTEN for changes and live
/// events, write the heartbeat, delete what crashed instances left. Reconnects after errors;
/// each (re)connection counts as a change, so watchers re-check what they may have missed.
fn background(
    pool: Arc<Pool>,
    instance: String,
    running: Arc<AtomicBool>,
    changes: tokio::sync::watch::Sender<u64>,
    live: tokio::sync::broadcast::Sender<(String, String)>,
) {
    let prefix = format!("{instance}\t");
    while running.load(Ordering::Acquire) {
        let mut client = match pool.config.connect(NoTls) {
            Ok(client) => client,
            Err(e) => {
                tracing::warn!(error = %e, "instance connection to PostgreSQL failed; retrying");
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
        };
        let listening =
            client.batch_execute(&format!("LISTEN {CHANGES_CHANNEL}; LISTEN {LIVE_CHANNEL};"));
        if let Err(e) = listening {
            tracing::warn!(error = %e, "LISTEN failed; retrying");
            std::thread::sleep(Duration::from_secs(1));
            continue;
        }
        changes.send_modify(|n| *n += 1);
        let mut beat_at = Instant::now();
        'connected: while running.load(Ordering::Acquire) {
            if Instant::now() >= beat_at {
                if let Err(e) = heartbeat(&mut client, &instance) {
                    tracing::warn!(error = %e, "instance heartbeat failed; reconnecting");
                    break 'connected;
                }
                beat_at = Instant::now() + HEARTBEAT;
            }
            let mut notifications = client.notifications();
            let mut pending = notifications.timeout_iter(Duration::from_millis(250));
            loop {
                match pending.next() {
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!(error = %e, "LISTEN connection lost; reconnecting");
                        break 'connected;
                    }
                    Ok(Some(n)) if n.channel() == CHANGES_CHANNEL => {
                        changes.send_modify(|n| *n += 1);
                    }
                    Ok(Some(n)) => {
                        // Events this instance sent are already on its own feed.
                        if let Some((org, event)) = n
                            .payload()
                            .strip_prefix(&prefix)
                            .is_none()
                            .then(|| n.payload().split_once('\t'))
                            .flatten()
                            .and_then(|(_, rest)| rest.split_once('\t'))
                        {
                            let _ = live.send((org.to_owned(), event.to_owned()));
                        }
                    }
                }
                if Instant::now() >= beat_at {
                    break;
                }
            }
        }
    }
}

/// Writes this instance's heartbeat (registering it again if a sweep removed it), and
/// deletes instances that stopped beating, with their reservations and calls.
fn heartbeat(client: &mut Client, instance: &str) -> Result<(), postgres::Error> {
    client.execute(
        &format!(
            "INSERT INTO instances (id, started_ms, heartbeat_ms) VALUES ($1, {DB_NOW_MS}, {DB_NOW_MS})
             ON CONFLICT (id) DO UPDATE SET heartbeat_ms = EXCLUDED.heartbeat_ms"
        ),
        &[&instance],
    )?;
    client.batch_execute(&format!(
        "DELETE FROM instances WHERE heartbeat_ms < {DB_NOW_MS} - {INSTANCE_STALE_MS};
         DELETE FROM reservations r WHERE NOT EXISTS (SELECT 1 FROM instances i WHERE i.id = r.instance_id);
         DELETE FROM live_calls c WHERE NOT EXISTS (SELECT 1 FROM instances i WHERE i.id = c.instance_id);"
    ))
}

impl Drop for PgStore {
    fn drop(&mut self) {
        self.stop_instance();
    }
}

impl PgStore {
    fn notify(&self, channel: &'static str, payload: &str) {
        let sent = self.pool.with(|conn| {
            conn.client
                .execute("SELECT pg_notify($1, $2)", &[&channel, &payload])
                .map_err(backend)
        });
        if let Err(e) = sent {
            tracing::warn!(error = %e, channel, "NOTIFY failed");
        }
    }
}

/// Sends queued live-page events with NOTIFY, on a connection of its own, until the instance
/// stops.
fn send_live_events(
    pool: &Pool,
    events: &crossbeam_channel::Receiver<String>,
    running: &AtomicBool,
) {
    let mut client: Option<Client> = None;
    while running.load(Ordering::Acquire) {
        let Ok(payload) = events.recv_timeout(Duration::from_millis(250)) else {
            continue;
        };
        if client.as_ref().is_none_or(Client::is_closed) {
            client = pool.config.connect(NoTls).ok();
        }
        let Some(c) = client.as_mut() else {
            tracing::warn!("cannot reach PostgreSQL to share a live event; dropped");
            continue;
        };
        if let Err(e) = c.execute("SELECT pg_notify($1, $2)", &[&LIVE_CHANNEL, &payload]) {
            tracing::warn!(error = %e, "sharing a live event failed");
            client = None;
        }
    }
}
