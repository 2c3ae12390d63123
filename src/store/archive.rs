//! The call history's storage port: what the stores (sled, PostgreSQL) do for it.

use crate::history::{IntentEntry, Line, Page, Query, Record, RecordHead, RecordKind};
use crate::store::StoreError;

/// The call history of every organisation. Every method is scoped to one organisation.
#[async_trait::async_trait]
pub trait Archive: Send + Sync + 'static {
    /// Starts a record, or continues one with this id (a call resumed elsewhere: its start,
    /// lines and billing so far are kept, the rest of the head is replaced).
    async fn begin_record(&self, head: &RecordHead) -> Result<(), StoreError>;
    /// Appends final lines to a record (a line with a channel and offset already kept is
    /// skipped). A record that does not exist (erased meanwhile) takes nothing.
    async fn add_lines(&self, org_id: &str, id: &str, lines: &[Line]) -> Result<(), StoreError>;
    /// Appends an intent update; the head's intent becomes its top intent.
    async fn add_intent(
        &self,
        org_id: &str,
        id: &str,
        entry: &IntentEntry,
    ) -> Result<(), StoreError>;
    /// Ends a call: its end, how it ended, and the audio billed by this session (added).
    async fn end_record(
        &self,
        org_id: &str,
        id: &str,
        ended_ms: i64,
        close_reason: &str,
        billed_ms: u64,
    ) -> Result<(), StoreError>;
    /// Stores a whole record at once (a file transcription).
    async fn put_record(&self, record: &Record) -> Result<(), StoreError>;
    /// One record of an organisation.
    async fn load_record(&self, org_id: &str, id: &str) -> Result<Option<Record>, StoreError>;
    /// A page of an organisation's records of one kind, newest first.
    async fn records(
        &self,
        org_id: &str,
        kind: RecordKind,
        query: &Query,
    ) -> Result<Page, StoreError>;
    /// Erases a record with everything about it; whether there was one.
    async fn delete_record(&self, org_id: &str, id: &str) -> Result<bool, StoreError>;
    /// Erases up to `most` of an organisation's records started before `before_ms`; how many.
    async fn purge_records(
        &self,
        org_id: &str,
        before_ms: i64,
        most: usize,
    ) -> Result<usize, StoreError>;
}

/// Most records one purge pass erases per organisation before it moves on.
const PURGE_STEP: usize = 500;

/// Erases every organisation's records older than its retention at `now_ms`; how many.
/// Safe to run on several instances at once: each erasure is idempotent.
pub async fn purge_expired(
    store: &dyn crate::store::Store,
    plans: &std::collections::BTreeMap<String, crate::config::Plan>,
    now_ms: i64,
) -> Result<usize, StoreError> {
    let mut erased = 0;
    for org in store.orgs().await? {
        let plan_days = plans.get(&org.plan).and_then(|p| p.retention_days);
        let Some(days) = org.history.retention(plan_days) else {
            continue;
        };
        let before = now_ms.saturating_sub(i64::from(days) * 86_400_000);
        loop {
            let n = store.purge_records(&org.id, before, PURGE_STEP).await?;
            erased += n;
            if n < PURGE_STEP {
                break;
            }
        }
    }
    Ok(erased)
}
