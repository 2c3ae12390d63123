//! The state every instance sees alike, in the database: sessions, sign-in forms, nonces, rate
//! limits, and the reservations work in progress holds against the quotas.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use callstream_actors::usage::{UsageError, UsageKind, UsageSink};

use super::instance::{CHANGES_CHANNEL, DB_NOW_MS, INSTANCE_STALE_MS, RELEASE_SQL};
use super::ledger::{write_event, write_totals};
use super::{amount_i64, amount_u64, backend, exec, kind_i16, opt, rows, PgStore};
use crate::clock;
use crate::store::shared::{PoolRef, RemoteCall, SharedState, Space, Used, Write};
use crate::store::StoreError;

/// Expired shared entries and idle rate-limit rows are deleted once every this many inserts.
const SWEEP_EVERY: u64 = 512;

/// The lock `callstream_reserve` takes alone on organisation `$1`'s pool `$2`, shared, until
/// the transaction ends.
const POOL_SHARED_SQL: &str = "SELECT pg_advisory_xact_lock_shared(hashtextextended(
     'reserve/' || $1::text || '/' || ($2::smallint)::text, 0))";

impl PgStore {
    /// Once every [`SWEEP_EVERY`] inserts, deletes what has expired (best effort).
    async fn maybe_sweep(&self, conn: &deadpool_postgres::Object) {
        let n = self.inserts.fetch_add(1, Ordering::Relaxed);
        if !n.is_multiple_of(SWEEP_EVERY) {
            return;
        }
        let swept = conn
            .batch_execute(&format!(
                "DELETE FROM shared_entries WHERE expires_ms <= {DB_NOW_MS};
                 DELETE FROM rate_limits WHERE tat_ms < {DB_NOW_MS} - 60000;"
            ))
            .await;
        if let Err(e) = swept {
            tracing::warn!(error = %e, "sweeping expired shared entries failed");
        }
    }
}

#[async_trait::async_trait]
impl SharedState for PgStore {
    async fn rate(
        &self,
        key: &str,
        per_minute: u32,
        _now: Instant,
    ) -> Result<Result<(), Duration>, StoreError> {
        let interval_ms = i64::from(60_000 / per_minute.max(1));
        let tolerance_ms = 60_000 - interval_ms;
        let conn = self.conn().await?;
        // One statement: the row is locked while it is read and moved on, so two instances
        // counting the same key at once are serialised by the database.
        let allowed = opt(
            &conn,
            "INSERT INTO rate_limits AS r (key, tat_ms)
             VALUES ($1, (extract(epoch from clock_timestamp()) * 1000)::bigint + $2)
             ON CONFLICT (key) DO UPDATE
                 SET tat_ms = GREATEST(r.tat_ms, EXCLUDED.tat_ms - $2) + $2
                 WHERE GREATEST(r.tat_ms, EXCLUDED.tat_ms - $2)
                       - (EXCLUDED.tat_ms - $2) <= $3
             RETURNING tat_ms",
            &[&key, &interval_ms, &tolerance_ms],
        )
        .await?;
        if allowed.is_some() {
            self.maybe_sweep(&conn).await;
            return Ok(Ok(()));
        }
        let ahead: Option<i64> = opt(
            &conn,
            "SELECT tat_ms - (extract(epoch from clock_timestamp()) * 1000)::bigint
             FROM rate_limits WHERE key = $1",
            &[&key],
        )
        .await?
        .map(|row| row.get(0));
        let wait_ms = ahead.unwrap_or(0).saturating_sub(tolerance_ms).max(1);
        Ok(Err(Duration::from_millis(wait_ms as u64)))
    }

    async fn insert_new(
        &self,
        space: Space,
        key: &str,
        value: &str,
        expires_ms: i64,
    ) -> Result<bool, StoreError> {
        let now = clock::now_ms();
        let conn = self.conn().await?;
        let stored = opt(
            &conn,
            "INSERT INTO shared_entries AS e (space, key, value, expires_ms)
             VALUES ($1, $2, $3, $4)
             ON CONFLICT (space, key) DO UPDATE
                 SET value = EXCLUDED.value, expires_ms = EXCLUDED.expires_ms
                 WHERE e.expires_ms <= $5
             RETURNING 1",
            &[&(space as i16), &key, &value, &expires_ms, &now],
        )
        .await?
        .is_some();
        self.maybe_sweep(&conn).await;
        Ok(stored)
    }

    async fn get(&self, space: Space, key: &str) -> Result<Option<String>, StoreError> {
        let now = clock::now_ms();
        let conn = self.conn().await?;
        Ok(opt(
            &conn,
            "SELECT value FROM shared_entries
             WHERE space = $1 AND key = $2 AND expires_ms > $3",
            &[&(space as i16), &key, &now],
        )
        .await?
        .map(|row| row.get(0)))
    }

    async fn take(&self, space: Space, key: &str) -> Result<Option<String>, StoreError> {
        let now = clock::now_ms();
        let conn = self.conn().await?;
        Ok(opt(
            &conn,
            "DELETE FROM shared_entries WHERE space = $1 AND key = $2
             RETURNING value, expires_ms",
            &[&(space as i16), &key],
        )
        .await?
        .filter(|row| row.get::<_, i64>(1) > now)
        .map(|row| row.get(0)))
    }

    async fn reserve(
        &self,
        pool: PoolRef<'_>,
        want: u64,
        min: u64,
        _used: Used<'_, '_>,
    ) -> Result<Option<u64>, StoreError> {
        // An unlimited pool has nothing to share: no other instance asks about it.
        let Some(quota) = pool.quota else {
            return Ok(Some(want));
        };
        // What this instance gave back is seen.
        self.instance.caught_up().await;
        let conn = self.conn().await?;
        // One round trip: the function takes a lock per pool (every instance reserving from it
        // waits its turn), reads what is left and takes its share.
        let granted: i64 = opt(
            &conn,
            "SELECT callstream_reserve($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            &[
                &self.instance.id,
                &pool.org_id,
                &kind_i16(pool.kind),
                &amount_i64(quota),
                &amount_i64(want),
                &amount_i64(min),
                &pool.first_day,
                &pool.last_day,
                &INSTANCE_STALE_MS,
            ],
        )
        .await?
        .map_or(-1, |row| row.get(0));
        if granted < 0 {
            return Ok(None);
        }
        Ok(Some(amount_u64(granted)))
    }

    async fn reserved(&self, org_id: &str, kind: UsageKind) -> Result<u64, StoreError> {
        self.instance.caught_up().await;
        let conn = self.conn().await?;
        let held = opt(
            &conn,
            "SELECT COALESCE(SUM(r.amount), 0)::bigint FROM reservations r
             JOIN instances i ON i.id = r.instance_id
             WHERE r.org_id = $1 AND r.kind = $2
               AND i.heartbeat_ms > (extract(epoch from clock_timestamp()) * 1000)::bigint - $3",
            &[&org_id, &kind_i16(kind), &INSTANCE_STALE_MS],
        )
        .await?;
        Ok(held.map_or(0, |row| amount_u64(row.get(0))))
    }

    fn release(&self, org_id: &str, kind: UsageKind, amount: u64) {
        if amount > 0 {
            self.instance.release(org_id, kind, amount);
        }
    }

    async fn take_place(&self, name: &str, holder: &str, cap: usize) -> Result<bool, StoreError> {
        // What this instance gave back is seen.
        self.instance.caught_up().await;
        let conn = self.conn().await?;
        let cap = i64::try_from(cap).unwrap_or(i64::MAX);
        let taken = opt(
            &conn,
            "SELECT callstream_take_place($1, $2, $3, $4, $5)",
            &[&self.instance.id, &name, &holder, &cap, &INSTANCE_STALE_MS],
        )
        .await?;
        Ok(taken.is_some_and(|row| row.get::<_, bool>(0)))
    }

    fn leave_place(&self, name: &str, holder: &str) {
        self.instance.leave_place(name, holder);
    }

    async fn settle(
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
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(backend)?;
        for (org_id, kind) in &pools {
            exec(&tx, POOL_SHARED_SQL, &[org_id, &kind_i16(*kind)]).await?;
        }
        match usage {
            Write::Event(event) => write_event(&tx, event).await?,
            Write::Totals(totals) => write_totals(&tx, totals).await?,
        }
        for (org_id, kind, amount) in release.iter().filter(|r| r.2 > 0) {
            exec(
                &tx,
                RELEASE_SQL,
                &[
                    &self.instance.id,
                    org_id,
                    &kind_i16(*kind),
                    &amount_i64(*amount),
                ],
            )
            .await?;
        }
        Ok(tx.commit().await.map_err(backend)?)
    }

    async fn start_instance(&self) {
        self.instance.start().await;
    }

    async fn stop_instance(&self) {
        self.instance.stop().await;
    }

    async fn set_draining(&self) {
        let set = match self.conn().await {
            Ok(conn) => {
                exec(
                    &conn,
                    "UPDATE instances SET draining = true WHERE id = $1",
                    &[&self.instance.id],
                )
                .await
            }
            Err(e) => Err(e),
        };
        if let Err(e) = set {
            tracing::warn!(error = %e, "cannot mark this instance draining");
        }
    }

    fn changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.instance.changes.subscribe())
    }

    async fn announce_change(&self) {
        // This instance's own watchers are told at once, not after the round trip.
        self.instance.changes.send_modify(|n| *n += 1);
        let sent = match self.conn().await {
            Ok(conn) => exec(&conn, "SELECT pg_notify($1, '')", &[&CHANGES_CHANNEL]).await,
            Err(e) => Err(e),
        };
        if let Err(e) = sent {
            tracing::warn!(error = %e, "NOTIFY of a change failed");
        }
    }

    fn call_opened(&self, call_id: &str, org_id: &str, call: &str) {
        self.instance.call_opened(call_id, org_id, call);
    }

    fn call_ended(&self, call_id: &str) {
        self.instance.call_ended(call_id);
    }

    async fn remote_calls(&self, org_id: &str) -> Vec<RemoteCall> {
        self.instance.caught_up().await;
        let listed = match self.conn().await {
            Ok(conn) => {
                rows(
                    &conn,
                    "SELECT c.instance_id, c.call FROM live_calls c
                     JOIN instances i ON i.id = c.instance_id
                     WHERE c.org_id = $1 AND c.instance_id <> $2
                       AND i.heartbeat_ms
                           > (extract(epoch from clock_timestamp()) * 1000)::bigint - $3",
                    &[&org_id, &self.instance.id, &INSTANCE_STALE_MS],
                )
                .await
            }
            Err(e) => Err(e),
        };
        match listed {
            Ok(rows) => rows
                .iter()
                .map(|r| RemoteCall {
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
        self.instance.publish_live(org_id, event);
    }

    fn remote_live(&self) -> Option<tokio::sync::broadcast::Receiver<(String, String)>> {
        Some(self.instance.live.subscribe())
    }
}

impl Drop for PgStore {
    fn drop(&mut self) {
        // Its rows go when its heartbeat is found stale; `stop_instance` withdraws them at once.
        self.instance.abandon();
    }
}
