//! The embedded [`Store`] on sled.
//!
//! sled's calls block (a charge returns once its fsync is done), so each runs on tokio's
//! blocking threads, never on an async worker: a request waiting on the disk holds no worker
//! that others need. The database and its layout are in [`db`].

mod archive;
mod codec;
mod db;

use std::path::Path;
use std::sync::Arc;

use callstream_actors::usage::{UsageError, UsageEvent, UsageSink};

pub use db::DB_DIR;

use crate::history::{IntentEntry, Line, Page, Query, Record, RecordHead, RecordKind};

use super::{ApiKey, Connector, DashboardUser, DayUsage, Org, SecretBox, Store, StoreError};

/// [`Store`] on an embedded sled database.
#[derive(Clone)]
pub struct SledStore {
    db: Arc<db::Db>,
}

impl SledStore {
    /// Opens (or creates) the database in `data_dir/db`. Blocks (a few milliseconds; longer
    /// when sled recovers a large log), so it is called before serving, or off the workers.
    pub fn open(data_dir: &Path, secrets: SecretBox) -> Result<Self, StoreError> {
        Ok(Self {
            db: Arc::new(db::Db::open(data_dir, secrets)?),
        })
    }

    /// Runs `call` on the database on a blocking thread.
    async fn blocking<T: Send + 'static>(
        &self,
        call: impl FnOnce(&db::Db) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || call(&db))
            .await
            .map_err(|e| StoreError::Backend(format!("store task failed: {e}")))?
    }
}

#[async_trait::async_trait]
impl Store for SledStore {
    async fn insert_user(&self, user: &DashboardUser) -> Result<(), StoreError> {
        let user = user.clone();
        self.blocking(move |db| db.insert_user(&user)).await
    }

    async fn user(&self, email: &str) -> Result<Option<DashboardUser>, StoreError> {
        let email = email.to_owned();
        self.blocking(move |db| db.user(&email)).await
    }

    async fn users(&self) -> Result<Vec<DashboardUser>, StoreError> {
        self.blocking(|db| db.users()).await
    }

    async fn insert_org(&self, org: &Org) -> Result<(), StoreError> {
        let org = org.clone();
        self.blocking(move |db| db.insert_org(&org)).await
    }

    async fn update_org(&self, org: &Org) -> Result<(), StoreError> {
        let org = org.clone();
        self.blocking(move |db| db.update_org(&org)).await
    }

    async fn org(&self, id: &str) -> Result<Option<Org>, StoreError> {
        let id = id.to_owned();
        self.blocking(move |db| db.org(&id)).await
    }

    async fn orgs(&self) -> Result<Vec<Org>, StoreError> {
        self.blocking(|db| db.orgs()).await
    }

    async fn insert_api_key(&self, key: &ApiKey, most: usize) -> Result<(), StoreError> {
        let key = key.clone();
        self.blocking(move |db| db.insert_api_key(&key, most)).await
    }

    async fn revoke_api_key(&self, id: &str, at_ms: i64) -> Result<ApiKey, StoreError> {
        let id = id.to_owned();
        self.blocking(move |db| db.revoke_api_key(&id, at_ms)).await
    }

    async fn api_key(&self, id: &str) -> Result<Option<ApiKey>, StoreError> {
        let id = id.to_owned();
        self.blocking(move |db| db.api_key(&id)).await
    }

    async fn api_key_by_hash(&self, hash: &[u8; 32]) -> Result<Option<ApiKey>, StoreError> {
        let hash = *hash;
        self.blocking(move |db| db.api_key_by_hash(&hash)).await
    }

    async fn api_keys(&self, org_id: &str) -> Result<Vec<ApiKey>, StoreError> {
        let org_id = org_id.to_owned();
        self.blocking(move |db| db.api_keys(&org_id)).await
    }

    async fn insert_connector(
        &self,
        connector: &Connector,
        secret: &[u8],
        most: usize,
    ) -> Result<(), StoreError> {
        let (connector, secret) = (connector.clone(), secret.to_vec());
        self.blocking(move |db| db.insert_connector(&connector, &secret, most))
            .await
    }

    async fn rotate_connector(
        &self,
        client_id: &str,
        secret: &[u8],
        at_ms: i64,
    ) -> Result<Connector, StoreError> {
        let (client_id, secret) = (client_id.to_owned(), secret.to_vec());
        self.blocking(move |db| db.rotate_connector(&client_id, &secret, at_ms))
            .await
    }

    async fn revoke_connector(&self, client_id: &str, at_ms: i64) -> Result<Connector, StoreError> {
        let client_id = client_id.to_owned();
        self.blocking(move |db| db.revoke_connector(&client_id, at_ms))
            .await
    }

    async fn connector(&self, client_id: &str) -> Result<Option<(Connector, Vec<u8>)>, StoreError> {
        let client_id = client_id.to_owned();
        self.blocking(move |db| db.connector(&client_id)).await
    }

    async fn connectors(&self, org_id: &str) -> Result<Vec<Connector>, StoreError> {
        let org_id = org_id.to_owned();
        self.blocking(move |db| db.connectors(&org_id)).await
    }

    async fn usage_by_day(
        &self,
        org_id: &str,
        from: &str,
        to: &str,
    ) -> Result<Vec<DayUsage>, StoreError> {
        let (org_id, from, to) = (org_id.to_owned(), from.to_owned(), to.to_owned());
        self.blocking(move |db| db.usage_by_day(&org_id, &from, &to))
            .await
    }

    async fn usage_events(
        &self,
        org_id: &str,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<Vec<UsageEvent>, StoreError> {
        let org_id = org_id.to_owned();
        self.blocking(move |db| db.usage_events(&org_id, from_ms, to_ms))
            .await
    }
}

#[async_trait::async_trait]
impl UsageSink for SledStore {
    async fn record(&self, event: &UsageEvent) -> Result<(), UsageError> {
        let event = event.clone();
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || db.record(&event))
            .await
            .map_err(|e| UsageError::Store(format!("billing task failed: {e}")))?
    }

    async fn checkpoint(&self, totals: &[UsageEvent]) -> Result<(), UsageError> {
        if totals.is_empty() {
            return Ok(());
        }
        let totals = totals.to_vec();
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || db.checkpoint(&totals))
            .await
            .map_err(|e| UsageError::Store(format!("billing task failed: {e}")))?
    }
}

#[async_trait::async_trait]
impl crate::store::archive::Archive for SledStore {
    async fn begin_record(&self, head: &RecordHead) -> Result<(), StoreError> {
        let head = head.clone();
        self.blocking(move |db| db.archive.begin(&head)).await
    }

    async fn add_lines(&self, org_id: &str, id: &str, lines: &[Line]) -> Result<(), StoreError> {
        let (org_id, id, lines) = (org_id.to_owned(), id.to_owned(), lines.to_vec());
        self.blocking(move |db| db.archive.add_lines(&org_id, &id, &lines))
            .await
    }

    async fn add_intent(
        &self,
        org_id: &str,
        id: &str,
        entry: &IntentEntry,
    ) -> Result<(), StoreError> {
        let (org_id, id, entry) = (org_id.to_owned(), id.to_owned(), entry.clone());
        self.blocking(move |db| db.archive.add_intent(&org_id, &id, &entry))
            .await
    }

    async fn end_record(
        &self,
        org_id: &str,
        id: &str,
        ended_ms: i64,
        close_reason: &str,
        billed_ms: u64,
    ) -> Result<(), StoreError> {
        let (org_id, id, reason) = (org_id.to_owned(), id.to_owned(), close_reason.to_owned());
        self.blocking(move |db| db.archive.end(&org_id, &id, ended_ms, &reason, billed_ms))
            .await
    }

    async fn put_record(&self, record: &Record) -> Result<(), StoreError> {
        let record = record.clone();
        self.blocking(move |db| db.archive.put(&record)).await
    }

    async fn load_record(&self, org_id: &str, id: &str) -> Result<Option<Record>, StoreError> {
        let (org_id, id) = (org_id.to_owned(), id.to_owned());
        self.blocking(move |db| db.archive.record(&org_id, &id))
            .await
    }

    async fn records(
        &self,
        org_id: &str,
        kind: RecordKind,
        query: &Query,
    ) -> Result<Page, StoreError> {
        let (org_id, query) = (org_id.to_owned(), query.clone());
        self.blocking(move |db| db.archive.list(&org_id, kind, &query))
            .await
    }

    async fn delete_record(&self, org_id: &str, id: &str) -> Result<bool, StoreError> {
        let (org_id, id) = (org_id.to_owned(), id.to_owned());
        self.blocking(move |db| db.archive.delete(&org_id, &id))
            .await
    }

    async fn purge_records(
        &self,
        org_id: &str,
        before_ms: i64,
        most: usize,
    ) -> Result<usize, StoreError> {
        let org_id = org_id.to_owned();
        self.blocking(move |db| db.archive.purge(&org_id, before_ms, most))
            .await
    }
}
