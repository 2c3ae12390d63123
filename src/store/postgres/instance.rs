//! This process among the instances sharing the database: its heartbeat, what it hears from
//! the others (LISTEN), and the writes nobody waits for (call listings, reservations given
//! back, live-page events), applied in order by tasks of their own so that a call never waits
//! on the database to report a transcript or end.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use callstream_actors::usage::UsageKind;
use tokio::sync::{broadcast, mpsc, watch};

use super::{amount_i64, backend, exec, kind_i16, StoreError};

/// How often an instance writes its heartbeat.
const HEARTBEAT: Duration = Duration::from_secs(2);

/// An instance whose heartbeat is older than this (ms) is gone: its reservations and calls
/// no longer count, and the next sweep deletes them.
pub(super) const INSTANCE_STALE_MS: i64 = 15_000;

/// Channel of revocations and organisation changes.
pub(super) const CHANGES_CHANNEL: &str = "callstream_changes";

/// Channel of live-page events: `org id`, a tab, the event's JSON.
const LIVE_CHANNEL: &str = "callstream_live";

/// PostgreSQL refuses NOTIFY payloads from 8000 bytes on.
const MAX_NOTIFY_BYTES: usize = 7_900;

/// Live-page events queued for the other instances at most; past this they are dropped (the
/// pages that miss one reload their snapshot on the next).
const OUTGOING_EVENTS: usize = 4_096;

/// The database's clock in Unix ms: one clock for every instance.
pub(super) const DB_NOW_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

/// Takes `$4` off instance `$1`'s reservation of organisation `$2`'s pool `$3`.
pub(super) const RELEASE_SQL: &str = "UPDATE reservations SET amount = GREATEST(amount - $4, 0)
     WHERE instance_id = $1 AND org_id = $2 AND kind = $3";

/// A write nobody waits for.
enum Queued {
    CallOpened {
        call_id: String,
        org_id: String,
        call: String,
    },
    CallEnded(String),
    Release {
        org_id: String,
        kind: UsageKind,
        amount: u64,
    },
    LeavePlace {
        name: String,
        holder: String,
    },
}

/// This process's part in the instances' shared state.
pub(super) struct Instance {
    /// Its id among the instances.
    pub(super) id: String,
    pool: deadpool_postgres::Pool,
    config: tokio_postgres::Config,
    /// Set while the heartbeat task runs.
    started: AtomicBool,
    /// Tells the heartbeat task to stop.
    stop: watch::Sender<bool>,
    pub(super) changes: watch::Sender<u64>,
    pub(super) live: broadcast::Sender<(String, String)>,
    live_out: mpsc::Sender<String>,
    writes: mpsc::UnboundedSender<Queued>,
    /// Writes queued so far; and applied (or given up on) so far.
    queued: AtomicU64,
    applied: watch::Sender<u64>,
}

impl Instance {
    /// Starts the tasks that apply queued writes, on the current runtime.
    pub(super) fn new(pool: deadpool_postgres::Pool, config: tokio_postgres::Config) -> Self {
        let id = crate::store::new_id("inst_", 10);
        let (writes, queue) = mpsc::unbounded_channel();
        let (live_out, live_queue) = mpsc::channel(OUTGOING_EVENTS);
        let applied = watch::channel(0).0;
        tokio::spawn(apply_writes(
            pool.clone(),
            id.clone(),
            queue,
            applied.clone(),
        ));
        tokio::spawn(send_live_events(pool.clone(), live_queue));
        Self {
            id,
            pool,
            config,
            started: AtomicBool::new(false),
            stop: watch::channel(false).0,
            changes: watch::channel(0).0,
            live: broadcast::channel(1024).0,
            live_out,
            writes,
            queued: AtomicU64::new(0),
            applied,
        }
    }

    fn queue(&self, write: Queued) {
        self.queued.fetch_add(1, Ordering::AcqRel);
        if self.writes.send(write).is_err() {
            // The task is gone with the runtime: nothing of this instance's lasts anyway.
            self.applied.send_modify(|n| *n += 1);
        }
    }

    /// Waits until the writes queued before this call are applied: what this instance gave
    /// back is seen by its own next reservation.
    pub(super) async fn caught_up(&self) {
        let target = self.queued.load(Ordering::Acquire);
        let mut applied = self.applied.subscribe();
        // An error: the task is gone (the runtime is ending), and nothing more will be applied.
        let _ = applied.wait_for(|n| *n >= target).await;
    }

    pub(super) fn release(&self, org_id: &str, kind: UsageKind, amount: u64) {
        self.queue(Queued::Release {
            org_id: org_id.to_owned(),
            kind,
            amount,
        });
    }

    pub(super) fn call_opened(&self, call_id: &str, org_id: &str, call: &str) {
        self.queue(Queued::CallOpened {
            call_id: call_id.to_owned(),
            org_id: org_id.to_owned(),
            call: call.to_owned(),
        });
    }

    pub(super) fn leave_place(&self, name: &str, holder: &str) {
        self.queue(Queued::LeavePlace {
            name: name.to_owned(),
            holder: holder.to_owned(),
        });
    }

    pub(super) fn call_ended(&self, call_id: &str) {
        self.queue(Queued::CallEnded(call_id.to_owned()));
    }

    pub(super) fn publish_live(&self, org_id: &str, event: &str) {
        let payload = format!("{}\t{org_id}\t{event}", self.id);
        if payload.len() > MAX_NOTIFY_BYTES {
            tracing::debug!(
                bytes = payload.len(),
                "live event too large to share; skipped"
            );
            return;
        }
        if self.live_out.try_send(payload).is_err() {
            tracing::debug!("live events queue full; an event for other instances is dropped");
        }
    }

    /// Writes the first heartbeat and starts the task that keeps it up and listens.
    pub(super) async fn start(&self) {
        if self.started.swap(true, Ordering::AcqRel) {
            return;
        }
        // The first heartbeat is written before this returns, so the instance's reservations
        // count from its first request.
        let first = match self.pool.get().await {
            Ok(conn) => heartbeat(&conn, &self.id).await,
            Err(e) => Err(super::pool_error(e)),
        };
        if let Err(e) = first {
            tracing::warn!(error = %e, "first instance heartbeat failed");
        }
        self.stop.send_replace(false);
        tokio::spawn(background(
            self.config.clone(),
            self.id.clone(),
            self.stop.subscribe(),
            self.changes.clone(),
            self.live.clone(),
        ));
    }

    /// Stops the heartbeat and withdraws the instance's rows.
    pub(super) async fn stop(&self) {
        if !self.started.swap(false, Ordering::AcqRel) {
            return;
        }
        self.stop.send_replace(true);
        self.caught_up().await;
        if let Err(e) = self.withdraw().await {
            tracing::warn!(error = %e, "cannot withdraw this instance; its rows expire in 15 s");
        }
    }

    async fn withdraw(&self) -> Result<(), StoreError> {
        let mut conn = self.pool.get().await.map_err(super::pool_error)?;
        let tx = conn.transaction().await.map_err(backend)?;
        for table in [
            "instances WHERE id",
            "reservations WHERE instance_id",
            "live_calls WHERE instance_id",
            "places WHERE instance_id",
        ] {
            exec(&tx, &format!("DELETE FROM {table} = $1"), &[&self.id]).await?;
        }
        tx.commit().await.map_err(backend)
    }

    /// Ends the heartbeat task without waiting (the store is being dropped).
    pub(super) fn abandon(&self) {
        self.stop.send_replace(true);
    }
}

/// Applies queued writes in order, until the store is dropped.
async fn apply_writes(
    pool: deadpool_postgres::Pool,
    instance: String,
    mut queue: mpsc::UnboundedReceiver<Queued>,
    applied: watch::Sender<u64>,
) {
    while let Some(write) = queue.recv().await {
        if let Err(e) = apply(&pool, &instance, &write).await {
            let what = match write {
                Queued::CallOpened { .. } => "list a call for other instances",
                Queued::CallEnded(_) => "unlist a call",
                // The reservation stays held until this instance's rows are cleared.
                Queued::Release { .. } => "give a reservation back",
                // The place stays taken until this instance's rows are cleared.
                Queued::LeavePlace { .. } => "give a place back",
            };
            tracing::warn!(error = %e, "cannot {what}");
        }
        applied.send_modify(|n| *n += 1);
    }
}

async fn apply(
    pool: &deadpool_postgres::Pool,
    instance: &str,
    write: &Queued,
) -> Result<(), StoreError> {
    let conn = pool.get().await.map_err(super::pool_error)?;
    match write {
        Queued::CallOpened {
            call_id,
            org_id,
            call,
        } => exec(
            &conn,
            "INSERT INTO live_calls (call_id, instance_id, org_id, call)
             VALUES ($1, $2, $3, $4)
             ON CONFLICT (call_id) DO UPDATE SET call = EXCLUDED.call",
            &[call_id, &instance, org_id, call],
        )
        .await
        .map(drop),
        Queued::CallEnded(call_id) => exec(
            &conn,
            "DELETE FROM live_calls WHERE call_id = $1",
            &[call_id],
        )
        .await
        .map(drop),
        Queued::LeavePlace { name, holder } => exec(
            &conn,
            "DELETE FROM places WHERE name = $1 AND holder = $2",
            &[name, holder],
        )
        .await
        .map(drop),
        Queued::Release {
            org_id,
            kind,
            amount,
        } => exec(
            &conn,
            RELEASE_SQL,
            &[&instance, org_id, &kind_i16(*kind), &amount_i64(*amount)],
        )
        .await
        .map(drop),
    }
}

/// Sends queued live-page events with NOTIFY, until the store is dropped.
async fn send_live_events(pool: deadpool_postgres::Pool, mut events: mpsc::Receiver<String>) {
    while let Some(payload) = events.recv().await {
        let sent = match pool.get().await {
            Ok(conn) => exec(
                &conn,
                "SELECT pg_notify($1, $2)",
                &[&LIVE_CHANNEL, &payload],
            )
            .await
            .map(drop),
            Err(e) => Err(super::pool_error(e)),
        };
        if let Err(e) = sent {
            tracing::warn!(error = %e, "sharing a live event failed; dropped");
        }
    }
}

/// The instance's background work, on a connection of its own: LISTEN for changes and live
/// events, write the heartbeat, delete what crashed instances left. Reconnects after errors;
/// each (re)connection counts as a change, so watchers re-check what they may have missed.
async fn background(
    config: tokio_postgres::Config,
    instance: String,
    mut stop: watch::Receiver<bool>,
    changes: watch::Sender<u64>,
    live: broadcast::Sender<(String, String)>,
) {
    let prefix = format!("{instance}\t");
    while !*stop.borrow() {
        let (client, mut connection) = match config.connect(tokio_postgres::NoTls).await {
            Ok(connected) => connected,
            Err(e) => {
                tracing::warn!(error = %e, "instance connection to PostgreSQL failed; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = stop.changed() => {}
                }
                continue;
            }
        };
        // The connection is driven by a task of its own, which hands notifications over.
        let (notices, mut heard) = mpsc::unbounded_channel();
        let driver = tokio::spawn(async move {
            let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(message) = futures_util::StreamExt::next(&mut messages).await {
                match message {
                    Ok(tokio_postgres::AsyncMessage::Notification(n)) => {
                        if notices.send(n).is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "LISTEN connection lost; reconnecting");
                        return;
                    }
                }
            }
        });
        let listening = client
            .batch_execute(&format!("LISTEN {CHANGES_CHANNEL}; LISTEN {LIVE_CHANNEL};"))
            .await;
        if let Err(e) = listening {
            tracing::warn!(error = %e, "LISTEN failed; retrying");
            driver.abort();
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        changes.send_modify(|n| *n += 1);
        let mut beat = tokio::time::interval(HEARTBEAT);
        loop {
            tokio::select! {
                _ = stop.changed() => {
                    if *stop.borrow() {
                        driver.abort();
                        return;
                    }
                }
                _ = beat.tick() => {
                    if let Err(e) = heartbeat(&client, &instance).await {
                        tracing::warn!(error = %e, "instance heartbeat failed; reconnecting");
                        break;
                    }
                }
                notice = heard.recv() => {
                    let Some(n) = notice else { break };
                    if n.channel() == CHANGES_CHANNEL {
                        changes.send_modify(|n| *n += 1);
                        continue;
                    }
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
        }
        driver.abort();
    }
}

/// Writes this instance's heartbeat (registering it again if a sweep removed it), and
/// deletes instances that stopped beating, with their reservations, calls and places.
async fn heartbeat(client: &tokio_postgres::Client, instance: &str) -> Result<(), StoreError> {
    client
        .execute(
            &format!(
                "INSERT INTO instances (id, started_ms, heartbeat_ms)
                 VALUES ($1, {DB_NOW_MS}, {DB_NOW_MS})
                 ON CONFLICT (id) DO UPDATE SET heartbeat_ms = EXCLUDED.heartbeat_ms"
            ),
            &[&instance],
        )
        .await
        .map_err(backend)?;
    client
        .batch_execute(&format!(
            "DELETE FROM instances WHERE heartbeat_ms < {DB_NOW_MS} - {INSTANCE_STALE_MS};
             DELETE FROM reservations r
                 WHERE NOT EXISTS (SELECT 1 FROM instances i WHERE i.id = r.instance_id);
             DELETE FROM live_calls c
                 WHERE NOT EXISTS (SELECT 1 FROM instances i WHERE i.id = c.instance_id);
             DELETE FROM places p
                 WHERE NOT EXISTS (SELECT 1 FROM instances i WHERE i.id = p.instance_id);"
        ))
        .await
        .map_err(backend)
}
