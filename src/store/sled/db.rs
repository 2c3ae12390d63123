//! The sled database behind [`SledStore`](super::SledStore), and its calls, which block
//! (a charge waits for its fsync).
//!
//! Trees and their keys:
//! - `orgs`: org id -> JSON [`OrgRecord`] (MCP headers sealed)
//! - `api_keys`: key id -> JSON [`ApiKey`]; `api_key_hashes`: SHA-256 of the secret -> key id
//! - `connectors`: client id -> JSON [`ConnectorRecord`] (client secret sealed)
//! - `dashboard_users`: email -> JSON [`DashboardUser`] (argon2id password hash)
//! - `ledger`: `org id / at_ms (u64 BE) / sequence (u64 BE)` -> JSON [`UsageEvent`]; a live
//!   call's running total uses a sequence derived from its call id (top bit set, so it never
//!   meets a generated one) and is written over in place
//! - `usage_daily`: `org id / YYYY-MM-DD kind-tag` -> total (u64 BE)
//! - the call history's trees: see [`super::archive`]
//!
//! A ledger append and its daily total change in one transaction and are flushed to disk
//! before `record` returns, so an acknowledged charge is never lost and the totals never drift
//! from the ledger.

use std::collections::BTreeMap;
use std::path::Path;

use base64::Engine as _;
use callstream_actors::usage::{UsageError, UsageEvent, UsageKind};
use serde::{Deserialize, Serialize};
use sled::transaction::{ConflictableTransactionError, TransactionError, Transactional};

use super::codec::{backend, decode, encode, org_prefix};
use crate::clock;
use crate::store::{
    call_seq, hex_to_hash, ApiKey, Connector, DashboardUser, DayUsage, McpIntegration, Org,
    SecretBox, StoreError,
};

/// Directory below the data directory that holds the sled files.
pub const DB_DIR: &str = "db";

/// The embedded sled database; every method blocks.
pub struct Db {
    db: sled::Db,
    orgs: sled::Tree,
    api_keys: sled::Tree,
    api_key_hashes: sled::Tree,
    connectors: sled::Tree,
    users: sled::Tree,
    ledger: sled::Tree,
    usage_daily: sled::Tree,
    secrets: SecretBox,
    /// The call history ([`super::archive`]).
    pub(super) archive: super::archive::Trees,
    commits: GroupCommit,
    // A parking_lot Mutex: held while an organisation's keys or connectors are counted and one
    // is added, so two creations at once cannot both pass the cap. One process owns the
    // database, so a lock in it is enough.
    creating: parking_lot::Mutex<()>,
}

/// Group commit for charges: every charge is applied at once, and one fsync then makes all the
/// charges applied before it durable. The first waiter flushes; the others wait for that flush
/// (or the next) instead of each paying for an fsync of its own.
#[derive(Default)]
struct GroupCommit {
    // A parking_lot Mutex: held only to update counters, never across the flush itself.
    state: parking_lot::Mutex<CommitState>,
    flushed: parking_lot::Condvar,
}

#[derive(Default)]
struct CommitState {
    /// Charges applied so far.
    applied: u64,
    /// Charges known to be on disk.
    durable: u64,
    /// A flush is in progress.
    flushing: bool,
}

impl GroupCommit {
    /// Registers an applied charge; returns its ticket.
    fn applied(&self) -> u64 {
        let mut s = self.state.lock();
        s.applied += 1;
        s.applied
    }

    /// Returns once charge `ticket` is on disk, flushing with `flush` when no one else is.
    fn wait_durable(
        &self,
        ticket: u64,
        flush: impl Fn() -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let mut s = self.state.lock();
        while s.durable < ticket {
            if s.flushing {
                self.flushed.wait(&mut s);
                continue;
            }
            s.flushing = true;
            let target = s.applied;
            drop(s);
            let result = flush();
            s = self.state.lock();
            s.flushing = false;
            if result.is_ok() {
                s.durable = s.durable.max(target);
            }
            self.flushed.notify_all();
            result?;
        }
        Ok(())
    }
}

/// An organisation as stored: MCP headers sealed.
#[derive(Serialize, Deserialize)]
struct OrgRecord {
    id: String,
    name: String,
    system_prompt: Option<String>,
    mcp: Option<McpRecord>,
    /// Absent from records written before it existed.
    #[serde(default)]
    mcp_allow: Vec<String>,
    plan: String,
    /// Absent from records written before it existed.
    #[serde(default)]
    history: crate::store::HistorySettings,
    deleted: bool,
    created_at_ms: i64,
}

#[derive(Serialize, Deserialize)]
struct McpRecord {
    url: String,
    /// Base64 of the sealed JSON header map.
    headers_sealed: String,
}

/// A connector as stored: client secret sealed.
#[derive(Serialize, Deserialize)]
struct ConnectorRecord {
    #[serde(flatten)]
    connector: Connector,
    /// Base64 of the sealed client secret.
    secret_sealed: String,
}

fn b64() -> &'static base64::engine::GeneralPurpose {
    &base64::engine::general_purpose::STANDARD
}

fn ledger_key(org_id: &str, at_ms: i64, seq: u64) -> Vec<u8> {
    let mut key = org_prefix(org_id);
    key.extend_from_slice(&(at_ms.max(0) as u64).to_be_bytes());
    key.extend_from_slice(&seq.to_be_bytes());
    key
}

fn daily_key(org_id: &str, day: &str, kind: UsageKind) -> Vec<u8> {
    let mut key = org_prefix(org_id);
    key.extend_from_slice(day.as_bytes());
    key.push(kind.tag());
    key
}

impl Db {
    /// Opens (or creates) the database in `data_dir/db`.
    pub fn open(data_dir: &Path, secrets: SecretBox) -> Result<Self, StoreError> {
        let path = data_dir.join(DB_DIR);
        let db = sled::Config::new()
            .path(&path)
            .open()
            .map_err(|e| match &e {
                sled::Error::Io(io) if is_lock_error(io) => {
                    StoreError::Locked(data_dir.display().to_string())
                }
                _ => backend(e),
            })?;
        let tree = |name: &str| db.open_tree(name).map_err(backend);
        Ok(Self {
            orgs: tree("orgs")?,
            api_keys: tree("api_keys")?,
            api_key_hashes: tree("api_key_hashes")?,
            connectors: tree("connectors")?,
            users: tree("dashboard_users")?,
            ledger: tree("ledger")?,
            usage_daily: tree("usage_daily")?,
            archive: super::archive::Trees::open(&db)?,
            db,
            secrets,
            commits: GroupCommit::default(),
            creating: parking_lot::Mutex::new(()),
        })
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.db.flush().map(drop).map_err(backend)
    }

    fn seal_record(&self, org: &Org) -> OrgRecord {
        OrgRecord {
            id: org.id.clone(),
            name: org.name.clone(),
            system_prompt: org.system_prompt.clone(),
            mcp: org.mcp.as_ref().map(|m| McpRecord {
                url: m.url.clone(),
                headers_sealed: b64().encode(self.secrets.seal(&org.id, &encode(&m.headers))),
            }),
            mcp_allow: org.mcp_allow.clone(),
            plan: org.plan.clone(),
            history: org.history.clone(),
            deleted: org.deleted,
            created_at_ms: org.created_at_ms,
        }
    }

    fn open_record(&self, rec: OrgRecord) -> Result<Org, StoreError> {
        let mcp = match rec.mcp {
            None => None,
            Some(m) => {
                let sealed = b64()
                    .decode(&m.headers_sealed)
                    .map_err(|_| StoreError::Decrypt)?;
                let headers: BTreeMap<String, String> =
                    decode("mcp headers", &self.secrets.open(&rec.id, &sealed)?)?;
                Some(McpIntegration {
                    url: m.url,
                    headers,
                })
            }
        };
        Ok(Org {
            id: rec.id,
            name: rec.name,
            system_prompt: rec.system_prompt,
            mcp,
            mcp_allow: rec.mcp_allow,
            plan: rec.plan,
            history: rec.history,
            deleted: rec.deleted,
            created_at_ms: rec.created_at_ms,
        })
    }

    fn connector_record(&self, client_id: &str) -> Result<Option<ConnectorRecord>, StoreError> {
        self.connectors
            .get(client_id)
            .map_err(backend)?
            .map(|v| decode("connector", &v))
            .transpose()
    }

    /// Replaces a connector record that must exist, then flushes.
    fn update_connector(
        &self,
        client_id: &str,
        change: impl Fn(&mut ConnectorRecord),
    ) -> Result<Connector, StoreError> {
        let mut updated = None;
        self.connectors
            .fetch_and_update(client_id, |old| {
                let mut rec: ConnectorRecord = decode("connector", old?).ok()?;
                change(&mut rec);
                let bytes = encode(&rec);
                updated = Some(rec.connector);
                Some(bytes)
            })
            .map_err(backend)?;
        let connector = updated.ok_or_else(|| StoreError::NotFound {
            kind: "connector",
            id: client_id.to_owned(),
        })?;
        self.flush()?;
        Ok(connector)
    }

    fn scan<'a, T: for<'de> Deserialize<'de>>(
        tree: &'a sled::Tree,
        what: &str,
    ) -> impl Iterator<Item = Result<T, StoreError>> + 'a {
        let what = what.to_owned();
        tree.iter()
            .values()
            .map(move |v| decode(&what, &v.map_err(backend)?))
    }
}

fn is_lock_error(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::WouldBlock || e.to_string().contains("acquire lock")
}

/// What [`Store`](crate::store::Store) asks, answered in the calling thread.
impl Db {
    pub(super) fn insert_org(&self, org: &Org) -> Result<(), StoreError> {
        let swapped = self
            .orgs
            .compare_and_swap(
                &org.id,
                None as Option<&[u8]>,
                Some(encode(&self.seal_record(org))),
            )
            .map_err(backend)?;
        if swapped.is_err() {
            return Err(StoreError::Exists {
                kind: "organisation",
                id: org.id.clone(),
            });
        }
        self.flush()
    }

    pub(super) fn update_org(&self, org: &Org) -> Result<(), StoreError> {
        if !self.orgs.contains_key(&org.id).map_err(backend)? {
            return Err(StoreError::NotFound {
                kind: "organisation",
                id: org.id.clone(),
            });
        }
        self.orgs
            .insert(&org.id, encode(&self.seal_record(org)))
            .map_err(backend)?;
        self.flush()
    }

    pub(super) fn org(&self, id: &str) -> Result<Option<Org>, StoreError> {
        match self.orgs.get(id).map_err(backend)? {
            Some(v) => Ok(Some(self.open_record(decode("organisation", &v)?)?)),
            None => Ok(None),
        }
    }

    pub(super) fn orgs(&self) -> Result<Vec<Org>, StoreError> {
        let mut orgs = Self::scan::<OrgRecord>(&self.orgs, "organisation")
            .map(|r| self.open_record(r?))
            .collect::<Result<Vec<_>, _>>()?;
        orgs.sort_by_key(|o| o.created_at_ms);
        Ok(orgs)
    }

    pub(super) fn insert_api_key(&self, key: &ApiKey, most: usize) -> Result<(), StoreError> {
        let _alone = self.creating.lock();
        let live = self
            .api_keys(&key.org_id)?
            .iter()
            .filter(|k| k.revoked_at_ms.is_none())
            .count();
        if live >= most {
            return Err(StoreError::Cap {
                kind: "API key",
                most,
            });
        }
        let hash = hex_to_hash(&key.hash).ok_or_else(|| {
            StoreError::Corrupt(key.id.clone(), "hash is not 64 hex digits".into())
        })?;
        let value = encode(key);
        let result = (&self.api_keys, &self.api_key_hashes).transaction(|(keys, hashes)| {
            if keys.get(key.id.as_bytes())?.is_some() || hashes.get(hash)?.is_some() {
                return Err(ConflictableTransactionError::Abort(()));
            }
            keys.insert(key.id.as_bytes(), value.as_slice())?;
            hashes.insert(&hash[..], key.id.as_bytes())?;
            Ok(())
        });
        match result {
            Ok(()) => self.flush(),
            Err(TransactionError::Abort(())) => Err(StoreError::Exists {
                kind: "API key",
                id: key.id.clone(),
            }),
            Err(TransactionError::Storage(e)) => Err(backend(e)),
        }
    }

    pub(super) fn revoke_api_key(&self, id: &str, at_ms: i64) -> Result<ApiKey, StoreError> {
        let mut updated = None;
        self.api_keys
            .fetch_and_update(id, |old| {
                let mut key: ApiKey = decode("API key", old?).ok()?;
                key.revoked_at_ms.get_or_insert(at_ms);
                let bytes = encode(&key);
                updated = Some(key);
                Some(bytes)
            })
            .map_err(backend)?;
        let key = updated.ok_or_else(|| StoreError::NotFound {
            kind: "API key",
            id: id.to_owned(),
        })?;
        self.flush()?;
        Ok(key)
    }

    pub(super) fn api_key(&self, id: &str) -> Result<Option<ApiKey>, StoreError> {
        self.api_keys
            .get(id)
            .map_err(backend)?
            .map(|v| decode("API key", &v))
            .transpose()
    }

    pub(super) fn api_key_by_hash(&self, hash: &[u8; 32]) -> Result<Option<ApiKey>, StoreError> {
        match self.api_key_hashes.get(hash).map_err(backend)? {
            Some(id) => self.api_key(&String::from_utf8_lossy(&id)),
            None => Ok(None),
        }
    }

    pub(super) fn api_keys(&self, org_id: &str) -> Result<Vec<ApiKey>, StoreError> {
        let mut keys = Vec::new();
        for key in Self::scan::<ApiKey>(&self.api_keys, "API key") {
            let key = key?;
            if key.org_id == org_id {
                keys.push(key);
            }
        }
        keys.sort_by_key(|k| k.created_at_ms);
        Ok(keys)
    }

    pub(super) fn insert_user(&self, user: &DashboardUser) -> Result<(), StoreError> {
        let swapped = self
            .users
            .compare_and_swap(&user.email, None as Option<&[u8]>, Some(encode(user)))
            .map_err(backend)?;
        if swapped.is_err() {
            return Err(StoreError::Exists {
                kind: "dashboard user",
                id: user.email.clone(),
            });
        }
        self.flush()
    }

    pub(super) fn user(&self, email: &str) -> Result<Option<DashboardUser>, StoreError> {
        self.users
            .get(email)
            .map_err(backend)?
            .map(|v| decode("dashboard user", &v))
            .transpose()
    }

    pub(super) fn users(&self) -> Result<Vec<DashboardUser>, StoreError> {
        let mut users = Self::scan::<DashboardUser>(&self.users, "dashboard user")
            .collect::<Result<Vec<_>, _>>()?;
        users.sort_by(|a, b| (a.created_at_ms, &a.email).cmp(&(b.created_at_ms, &b.email)));
        Ok(users)
    }

    pub(super) fn insert_connector(
        &self,
        connector: &Connector,
        secret: &[u8],
        most: usize,
    ) -> Result<(), StoreError> {
        let _alone = self.creating.lock();
        let live = self
            .connectors(&connector.org_id)?
            .iter()
            .filter(|c| c.revoked_at_ms.is_none())
            .count();
        if live >= most {
            return Err(StoreError::Cap {
                kind: "connector",
                most,
            });
        }
        let rec = ConnectorRecord {
            connector: connector.clone(),
            secret_sealed: b64().encode(self.secrets.seal(&connector.client_id, secret)),
        };
        let swapped = self
            .connectors
            .compare_and_swap(
                &connector.client_id,
                None as Option<&[u8]>,
                Some(encode(&rec)),
            )
            .map_err(backend)?;
        if swapped.is_err() {
            return Err(StoreError::Exists {
                kind: "connector",
                id: connector.client_id.clone(),
            });
        }
        self.flush()
    }

    pub(super) fn rotate_connector(
        &self,
        client_id: &str,
        secret: &[u8],
        at_ms: i64,
    ) -> Result<Connector, StoreError> {
        let sealed = b64().encode(self.secrets.seal(client_id, secret));
        self.update_connector(client_id, |rec| {
            rec.secret_sealed = sealed.clone();
            rec.connector.rotated_at_ms = Some(at_ms);
        })
    }

    pub(super) fn revoke_connector(
        &self,
        client_id: &str,
        at_ms: i64,
    ) -> Result<Connector, StoreError> {
        self.update_connector(client_id, |rec| {
            rec.connector.revoked_at_ms.get_or_insert(at_ms);
        })
    }

    pub(super) fn connector(
        &self,
        client_id: &str,
    ) -> Result<Option<(Connector, Vec<u8>)>, StoreError> {
        let Some(rec) = self.connector_record(client_id)? else {
            return Ok(None);
        };
        let sealed = b64()
            .decode(&rec.secret_sealed)
            .map_err(|_| StoreError::Decrypt)?;
        let secret = self.secrets.open(client_id, &sealed)?;
        Ok(Some((rec.connector, secret)))
    }

    pub(super) fn connectors(&self, org_id: &str) -> Result<Vec<Connector>, StoreError> {
        let mut all = Vec::new();
        for rec in Self::scan::<ConnectorRecord>(&self.connectors, "connector") {
            let rec = rec?;
            if rec.connector.org_id == org_id {
                all.push(rec.connector);
            }
        }
        all.sort_by_key(|c| c.created_at_ms);
        Ok(all)
    }

    pub(super) fn usage_by_day(
        &self,
        org_id: &str,
        from: &str,
        to: &str,
    ) -> Result<Vec<DayUsage>, StoreError> {
        let prefix_len = org_prefix(org_id).len();
        let mut start = org_prefix(org_id);
        start.extend_from_slice(from.as_bytes());
        let mut end = org_prefix(org_id);
        end.extend_from_slice(to.as_bytes());
        end.push(0xff);
        let mut days = Vec::new();
        for item in self.usage_daily.range(start..end) {
            let (key, value) = item.map_err(backend)?;
            let rest = &key[prefix_len..];
            let corrupt = || StoreError::Corrupt("daily usage".into(), format!("{key:?}"));
            let (day, tag) = rest.split_at(rest.len().checked_sub(1).ok_or_else(corrupt)?);
            let kind = UsageKind::from_tag(tag[0]).ok_or_else(corrupt)?;
            let amount = u64::from_be_bytes(value.as_ref().try_into().map_err(|_| corrupt())?);
            days.push(DayUsage {
                day: String::from_utf8(day.to_vec()).map_err(|_| corrupt())?,
                kind,
                amount,
            });
        }
        Ok(days)
    }

    pub(super) fn usage_events(
        &self,
        org_id: &str,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<Vec<UsageEvent>, StoreError> {
        let start = ledger_key(org_id, from_ms, 0);
        let end = ledger_key(org_id, to_ms, 0);
        self.ledger
            .range(start..end)
            .values()
            .map(|v| decode("usage event", &v.map_err(backend)?))
            .collect()
    }
}

/// What [`UsageSink`](callstream_actors::usage::UsageSink) asks, in the calling thread.
impl Db {
    pub(super) fn record(&self, event: &UsageEvent) -> Result<(), UsageError> {
        let seq = self
            .db
            .generate_id()
            .map_err(|e| UsageError::Store(e.to_string()))?;
        let ledger_key = ledger_key(&event.org_id, event.at_ms, seq);
        let daily_key = daily_key(&event.org_id, &clock::day_of(event.at_ms), event.kind);
        let value = encode(event);
        (&self.ledger, &self.usage_daily)
            .transaction(|(ledger, daily)| {
                ledger.insert(ledger_key.as_slice(), value.as_slice())?;
                add_to_day(daily, &daily_key, event.amount)?;
                Ok::<_, ConflictableTransactionError<()>>(())
            })
            .map_err(|e| UsageError::Store(format!("{e:?}")))?;
        self.durable()
    }

    pub(super) fn checkpoint(&self, totals: &[UsageEvent]) -> Result<(), UsageError> {
        if totals.is_empty() {
            return Ok(());
        }
        // (ledger key, daily key, row, running total) of each call.
        type Row = (Vec<u8>, Vec<u8>, Vec<u8>, u64);
        let rows: Vec<Row> = totals
            .iter()
            .map(|t| {
                let call = t.call_id.as_deref().unwrap_or_default();
                (
                    ledger_key(&t.org_id, t.at_ms, call_seq(call)),
                    daily_key(&t.org_id, &clock::day_of(t.at_ms), t.kind),
                    encode(t),
                    t.amount,
                )
            })
            .collect();
        (&self.ledger, &self.usage_daily)
            .transaction(|(ledger, daily)| {
                for (ledger_key, daily_key, value, amount) in &rows {
                    // The day grows by what the call's total grew since it was last written.
                    let before = match ledger.get(ledger_key)? {
                        Some(old) => serde_json::from_slice::<UsageEvent>(&old)
                            .map(|e| e.amount)
                            .unwrap_or(0),
                        None => 0,
                    };
                    ledger.insert(ledger_key.as_slice(), value.as_slice())?;
                    add_to_day(daily, daily_key, amount.saturating_sub(before))?;
                }
                Ok::<_, ConflictableTransactionError<()>>(())
            })
            .map_err(|e| UsageError::Store(format!("{e:?}")))?;
        self.durable()
    }
}

impl Db {
    /// Returns once every charge applied so far is on disk (one flush for all waiting).
    fn durable(&self) -> Result<(), UsageError> {
        let ticket = self.commits.applied();
        self.commits
            .wait_durable(ticket, || self.flush())
            .map_err(UsageError::from)
    }
}

/// Adds `amount` to the day total at `key`, inside a transaction.
fn add_to_day(
    daily: &sled::transaction::TransactionalTree,
    key: &[u8],
    amount: u64,
) -> Result<(), sled::transaction::UnabortableTransactionError> {
    if amount == 0 {
        return Ok(());
    }
    let total = daily
        .get(key)?
        .and_then(|v| <[u8; 8]>::try_from(v.as_ref()).ok())
        .map_or(0, u64::from_be_bytes);
    daily.insert(key, &total.saturating_add(amount).to_be_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::crypto::KEY_LEN;
    use callstream_actors::usage::UsageSource;

    fn store(dir: &Path) -> Db {
        Db::open(dir, SecretBox::new(&[3; KEY_LEN])).unwrap()
    }

    fn event(org: &str, at_ms: i64, kind: UsageKind, amount: u64) -> UsageEvent {
        UsageEvent {
            org_id: org.into(),
            key_id: "key_1".into(),
            end_user: Some("u1".into()),
            kind,
            amount,
            source: UsageSource::Chat,
            at_ms,
            call_id: None,
        }
    }

    /// Every charge is on disk when acknowledged, with fewer flushes than charges allowed.
    #[test]
    fn concurrent_charges_are_all_made_durable() {
        let dir = tempfile::tempdir().unwrap();
        let s = std::sync::Arc::new(store(dir.path()));
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let s = s.clone();
                std::thread::spawn(move || {
                    for i in 0..25 {
                        s.record(&event(
                            "org_a",
                            1_795_651_199_000 + t * 100 + i,
                            UsageKind::Tokens,
                            1,
                        ))
                        .unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let days = s.usage_by_day("org_a", "2026-11-01", "2026-11-30").unwrap();
        assert_eq!(days.iter().map(|d| d.amount).sum::<u64>(), 200);
        assert_eq!(s.usage_events("org_a", 0, i64::MAX).unwrap().len(), 200);
        let c = s.commits.state.lock();
        assert_eq!((c.applied, c.durable), (200, 200));
    }

    #[test]
    fn second_open_reports_the_lock() {
        let dir = tempfile::tempdir().unwrap();
        let _first = store(dir.path());
        let second = Db::open(dir.path(), SecretBox::new(&[3; KEY_LEN]));
        assert!(
            matches!(second, Err(StoreError::Locked(_))),
            "{:?}",
            second.err()
        );
    }
}
