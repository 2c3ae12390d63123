//! The usage ledger and its day totals: what [`UsageSink`] writes.

use callstream_actors::usage::{UsageError, UsageEvent, UsageKind, UsageSink};
use deadpool_postgres::GenericClient;

use super::{amount_i64, amount_u64, backend, encode_event, exec, kind_i16, opt, PgStore};
use crate::clock;
use crate::store::{call_seq, StoreError};

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

#[async_trait::async_trait]
impl UsageSink for PgStore {
    async fn record(&self, event: &UsageEvent) -> Result<(), UsageError> {
        let conn = self.conn().await?;
        Ok(write_event(&conn, event).await?)
    }

    async fn checkpoint(&self, totals: &[UsageEvent]) -> Result<(), UsageError> {
        if totals.is_empty() {
            return Ok(());
        }
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(backend)?;
        write_totals(&tx, totals).await?;
        Ok(tx.commit().await.map_err(backend)?)
    }
}

/// Appends `event` to the ledger and its day total: one statement, so both or neither.
pub(super) async fn write_event(
    c: &impl GenericClient,
    event: &UsageEvent,
) -> Result<(), StoreError> {
    exec(
        c,
        RECORD_SQL,
        &[
            &event.org_id,
            &event.at_ms,
            &kind_i16(event.kind),
            &amount_i64(event.amount),
            &encode_event(event),
            &clock::day_of(event.at_ms),
        ],
    )
    .await
    .map(drop)
}

/// Writes live calls' running totals (see [`UsageSink::checkpoint`]) inside the transaction
/// `tx`.
pub(super) async fn write_totals(
    tx: &impl GenericClient,
    totals: &[UsageEvent],
) -> Result<(), StoreError> {
    for total in totals {
        let seq = call_seq(total.call_id.as_deref().unwrap_or_default()) as i64;
        let event = encode_event(total);
        // The row exists (at zero when new) and is locked before it is read, so two writers
        // of one call's total cannot both add the same growth.
        exec(
            tx,
            "INSERT INTO usage_ledger (org_id, at_ms, seq, kind, amount, event)
             VALUES ($1, $2, $3, $4, 0, $5) ON CONFLICT DO NOTHING",
            &[
                &total.org_id,
                &total.at_ms,
                &seq,
                &kind_i16(total.kind),
                &event,
            ],
        )
        .await?;
        // The day grows by what the call's total grew since it was last written.
        let before: i64 = opt(
            tx,
            "SELECT amount FROM usage_ledger
             WHERE org_id = $1 AND at_ms = $2 AND seq = $3 FOR UPDATE",
            &[&total.org_id, &total.at_ms, &seq],
        )
        .await?
        .map_or(0, |row| row.get(0));
        exec(
            tx,
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
        )
        .await?;
        let before = amount_u64(before);
        add_to_day(
            tx,
            &total.org_id,
            &clock::day_of(total.at_ms),
            total.kind,
            total.amount.saturating_sub(before),
        )
        .await?;
    }
    Ok(())
}

/// Adds `amount` to a day total, inside the caller's transaction.
async fn add_to_day(
    tx: &impl GenericClient,
    org_id: &str,
    day: &str,
    kind: UsageKind,
    amount: u64,
) -> Result<(), StoreError> {
    if amount == 0 {
        return Ok(());
    }
    exec(
        tx,
        "INSERT INTO usage_daily (org_id, day, kind, amount) VALUES ($1, $2, $3, $4)
         ON CONFLICT (org_id, day, kind) DO UPDATE SET amount = usage_daily.amount + EXCLUDED.amount",
        &[&org_id, &day, &kind_i16(kind), &amount_i64(amount)],
    )
    .await
    .map(drop)
}
