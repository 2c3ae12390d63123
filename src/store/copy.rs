//! Moving an installation between stores: `callstream store copy --from sled:PATH --to
//! postgres:URL` (either direction).
//!
//! Everything is read through the source's [`Store`] and written through the target's, so
//! secrets are opened with the source's key and sealed again with the target's, and the
//! target's day totals are rebuilt from the ledger it is given. The target must be empty: a
//! copy never merges into (or doubles) an installation that is already in use.

use callstream_actors::usage::UsageEvent;
use serde::Serialize;

use super::{Store, StoreError};

/// What a copy moved.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct CopyReport {
    /// Organisations, deleted ones included.
    pub orgs: usize,
    /// API keys, revoked ones included.
    pub api_keys: usize,
    /// Connectors with their secrets.
    pub connectors: usize,
    /// Dashboard users.
    pub users: usize,
    /// Ledger rows: charges and live calls' running totals.
    pub usage_events: usize,
    /// Call-history records (calls and file transcriptions) with their lines and intents.
    #[serde(default)]
    pub history_records: usize,
}

/// Why a copy did not start or did not finish.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    /// The target already holds data.
    #[error("the target store is not empty ({0}); copy only into a new database")]
    TargetNotEmpty(String),
    /// Reading or writing failed; what was written so far stays in the target.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Live calls' running totals are written in batches of this many.
const CHECKPOINT_BATCH: usize = 500;

/// Copies everything `from` holds into the empty `to`. Everything but the ledger is read (and
/// every secret opened) before anything is written, so a wrong key or an unreadable record
/// leaves the target empty.
pub async fn copy(from: &dyn Store, to: &dyn Store) -> Result<CopyReport, CopyError> {
    let existing_orgs = to.orgs().await?.len();
    let existing_users = to.users().await?.len();
    if existing_orgs > 0 || existing_users > 0 {
        return Err(CopyError::TargetNotEmpty(format!(
            "{existing_orgs} organisations, {existing_users} dashboard users"
        )));
    }
    let orgs = from.orgs().await?;
    let mut records = Vec::with_capacity(orgs.len());
    for org in orgs {
        let keys = from.api_keys(&org.id).await?;
        let mut connectors = Vec::new();
        for connector in from.connectors(&org.id).await? {
            if let Some(with_secret) = from.connector(&connector.client_id).await? {
                connectors.push(with_secret);
            }
        }
        records.push((org, keys, connectors));
    }
    let users = from.users().await?;

    let usage = |e: callstream_actors::usage::UsageError| StoreError::Backend(e.to_string());
    let mut report = CopyReport::default();
    for (org, keys, connectors) in records {
        to.insert_org(&org).await?;
        report.orgs += 1;
        for key in keys {
            // A copy keeps every record, whatever the plan's caps say now.
            to.insert_api_key(&key, usize::MAX).await?;
            report.api_keys += 1;
        }
        for (connector, secret) in connectors {
            to.insert_connector(&connector, &secret, usize::MAX).await?;
            report.connectors += 1;
        }
        let mut running: Vec<UsageEvent> = Vec::new();
        for event in from.usage_events(&org.id, i64::MIN, i64::MAX).await? {
            report.usage_events += 1;
            if event.call_id.is_some() {
                running.push(event);
                if running.len() == CHECKPOINT_BATCH {
                    to.checkpoint(&running).await.map_err(usage)?;
                    running.clear();
                }
            } else {
                to.record(&event).await.map_err(usage)?;
            }
        }
        to.checkpoint(&running).await.map_err(usage)?;
        report.history_records += copy_history(from, to, &org.id).await?;
    }
    for user in users {
        to.insert_user(&user).await?;
        report.users += 1;
    }
    Ok(report)
}

/// Copies an organisation's call history, page by page, each record whole.
async fn copy_history(from: &dyn Store, to: &dyn Store, org_id: &str) -> Result<usize, StoreError> {
    use crate::history::{Query, RecordKind, MAX_PAGE};
    let mut copied = 0;
    for kind in [RecordKind::Call, RecordKind::File] {
        let mut query = Query {
            limit: MAX_PAGE,
            ..Query::default()
        };
        loop {
            let page = from.records(org_id, kind, &query).await?;
            for head in &page.heads {
                // Erased since the page was read: nothing to copy.
                let Some(record) = from.load_record(org_id, &head.id).await? else {
                    continue;
                };
                to.put_record(&record).await?;
                for entry in &record.intents {
                    to.add_intent(org_id, &head.id, entry).await?;
                }
                copied += 1;
            }
            match page.next {
                Some(next) => query.after = Some(next),
                None => break,
            }
        }
    }
    Ok(copied)
}
