//! The call history on PostgreSQL (tables `history_records`, `history_lines`,
//! `history_intents`; see `migrations/V6__history.sql`). Search is full text: each line's words
//! ([`crate::history::words`]) are added to the record's `tsvector`, and a query's words must
//! all match (`plainto_tsquery('simple', ...)`, GIN index).

use tokio_postgres::Row;

use super::{amount_i64, amount_u64, backend, exec, opt, rows, PgStore};
use crate::history::{Cursor, IntentEntry, Line, Page, Query, Record, RecordHead, RecordKind};
use crate::store::archive::Archive;
use crate::store::StoreError;

const HEAD_COLUMNS: &str = "head, ended_ms, intent, close_reason, billed_ms, started_ms";

fn corrupt(what: &str, e: serde_json::Error) -> StoreError {
    StoreError::Corrupt(what.to_owned(), e.to_string())
}

/// A listing's filters, `$3` to `$8`: after the cursor (start, id), from, to, connector,
/// intent; each off when its value is null.
const PAGE_FILTERS: &str = "AND ($3::bigint IS NULL OR started_ms < $3
                                 OR (started_ms = $3 AND id > $4::text))
     AND ($5::bigint IS NULL OR started_ms >= $5)
     AND ($6::bigint IS NULL OR started_ms < $6)
     AND ($7::text IS NULL OR connector = $7)
     AND ($8::text IS NULL OR intent = $8)";

/// Matches of a search up to which they are paged among themselves (see `records`).
const FEW_MATCHES: i64 = 2000;

/// A page of heads from rows of [`HEAD_COLUMNS`]; a full page has a cursor to go on.
fn page_of(found: &[Row], limit: i64) -> Result<Page, StoreError> {
    let heads = found.iter().map(head_from).collect::<Result<Vec<_>, _>>()?;
    let next = (heads.len() as i64 == limit)
        .then(|| heads.last())
        .flatten()
        .map(|h| Cursor {
            started_ms: h.started_ms,
            id: h.id.clone(),
        });
    Ok(Page { heads, next })
}

/// A head from a row of [`HEAD_COLUMNS`].
fn head_from(row: &Row) -> Result<RecordHead, StoreError> {
    let text: String = row.get(0);
    let mut head: RecordHead =
        serde_json::from_str(&text).map_err(|e| corrupt("history record", e))?;
    head.ended_ms = row.get(1);
    head.intent = row.get(2);
    head.close_reason = row.get(3);
    head.billed_ms = amount_u64(row.get(4));
    head.started_ms = row.get(5);
    Ok(head)
}

fn json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("history records are plain data and always serialize")
}

/// The words of `text`, joined as the text PostgreSQL turns into a `tsvector`.
fn search_text(text: &str) -> String {
    crate::history::words(text).join(" ")
}

#[async_trait::async_trait]
impl Archive for PgStore {
    async fn begin_record(&self, head: &RecordHead) -> Result<(), StoreError> {
        let conn = self.conn().await?;
        exec(
            &conn,
            "INSERT INTO history_records
                 (org_id, id, kind, started_ms, ended_ms, connector, intent, close_reason,
                  billed_ms, head)
             VALUES ($1, $2, $3, $4, NULL, $5, $6, NULL, 0, $7)
             ON CONFLICT (org_id, id) DO UPDATE SET
                 head = EXCLUDED.head, connector = EXCLUDED.connector, ended_ms = NULL,
                 close_reason = NULL",
            &[
                &head.org_id,
                &head.id,
                &head.kind.tag(),
                &head.started_ms,
                &head.connector,
                &head.intent,
                &json(head),
            ],
        )
        .await
        .map(drop)
    }

    async fn add_lines(&self, org_id: &str, id: &str, lines: &[Line]) -> Result<(), StoreError> {
        if lines.is_empty() {
            return Ok(());
        }
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(backend)?;
        let mut words = String::new();
        for line in lines {
            let added = exec(
                &tx,
                "INSERT INTO history_lines (org_id, record_id, offset_ms, channel, line)
                 SELECT $1, $2, $3, $4, $5
                 WHERE EXISTS (SELECT 1 FROM history_records WHERE org_id = $1 AND id = $2)
                 ON CONFLICT DO NOTHING",
                &[
                    &org_id,
                    &id,
                    &line.offset_ms(),
                    &(line.channel.min(i16::MAX as usize) as i16),
                    &json(line),
                ],
            )
            .await?;
            if added > 0 {
                words.push(' ');
                words.push_str(&search_text(&line.text));
            }
        }
        if !words.trim().is_empty() {
            exec(
                &tx,
                "UPDATE history_records SET search = search || to_tsvector('simple', $3)
                 WHERE org_id = $1 AND id = $2",
                &[&org_id, &id, &words],
            )
            .await?;
        }
        tx.commit().await.map_err(backend)
    }

    async fn add_intent(
        &self,
        org_id: &str,
        id: &str,
        entry: &IntentEntry,
    ) -> Result<(), StoreError> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(backend)?;
        let added = exec(
            &tx,
            "INSERT INTO history_intents (org_id, record_id, at_ms, result)
             SELECT $1, $2, $3, $4
             WHERE EXISTS (SELECT 1 FROM history_records WHERE org_id = $1 AND id = $2)",
            &[&org_id, &id, &entry.at_ms, &json(&entry.result)],
        )
        .await?;
        if let (1.., Some(top)) = (added, crate::history::top_intent(&entry.result)) {
            exec(
                &tx,
                "UPDATE history_records SET intent = $3 WHERE org_id = $1 AND id = $2",
                &[&org_id, &id, &top],
            )
            .await?;
        }
        tx.commit().await.map_err(backend)
    }

    async fn end_record(
        &self,
        org_id: &str,
        id: &str,
        ended_ms: i64,
        close_reason: &str,
        billed_ms: u64,
    ) -> Result<(), StoreError> {
        let conn = self.conn().await?;
        exec(
            &conn,
            "UPDATE history_records
             SET ended_ms = $3, close_reason = $4, billed_ms = billed_ms + $5
             WHERE org_id = $1 AND id = $2",
            &[
                &org_id,
                &id,
                &ended_ms,
                &close_reason,
                &amount_i64(billed_ms),
            ],
        )
        .await
        .map(drop)
    }

    async fn put_record(&self, record: &Record) -> Result<(), StoreError> {
        let head = &record.head;
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(backend)?;
        exec(
            &tx,
            "DELETE FROM history_records WHERE org_id = $1 AND id = $2",
            &[&head.org_id, &head.id],
        )
        .await?;
        let words: Vec<String> = record
            .transcript
            .iter()
            .map(|l| search_text(&l.text))
            .collect();
        exec(
            &tx,
            "INSERT INTO history_records
                 (org_id, id, kind, started_ms, ended_ms, connector, intent, close_reason,
                  billed_ms, head, search)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, to_tsvector('simple', $11))",
            &[
                &head.org_id,
                &head.id,
                &head.kind.tag(),
                &head.started_ms,
                &head.ended_ms,
                &head.connector,
                &head.intent,
                &head.close_reason,
                &amount_i64(head.billed_ms),
                &json(head),
                &words.join(" "),
            ],
        )
        .await?;
        for line in &record.transcript {
            exec(
                &tx,
                "INSERT INTO history_lines (org_id, record_id, offset_ms, channel, line)
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
                &[
                    &head.org_id,
                    &head.id,
                    &line.offset_ms(),
                    &(line.channel.min(i16::MAX as usize) as i16),
                    &json(line),
                ],
            )
            .await?;
        }
        tx.commit().await.map_err(backend)
    }

    async fn load_record(&self, org_id: &str, id: &str) -> Result<Option<Record>, StoreError> {
        let conn = self.conn().await?;
        let Some(row) = opt(
            &conn,
            &format!("SELECT {HEAD_COLUMNS} FROM history_records WHERE org_id = $1 AND id = $2"),
            &[&org_id, &id],
        )
        .await?
        else {
            return Ok(None);
        };
        let head = head_from(&row)?;
        let transcript = rows(
            &conn,
            "SELECT line FROM history_lines WHERE org_id = $1 AND record_id = $2
             ORDER BY offset_ms, channel",
            &[&org_id, &id],
        )
        .await?
        .iter()
        .map(|r| serde_json::from_str(r.get(0)).map_err(|e| corrupt("history line", e)))
        .collect::<Result<Vec<Line>, _>>()?;
        let intents = rows(
            &conn,
            "SELECT at_ms, result FROM history_intents WHERE org_id = $1 AND record_id = $2
             ORDER BY seq",
            &[&org_id, &id],
        )
        .await?
        .iter()
        .map(|r| {
            Ok(IntentEntry {
                at_ms: r.get(0),
                result: serde_json::from_str(r.get(1)).map_err(|e| corrupt("history intent", e))?,
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
        Ok(Some(Record {
            head,
            transcript,
            intents,
        }))
    }

    async fn records(
        &self,
        org_id: &str,
        kind: RecordKind,
        query: &Query,
    ) -> Result<Page, StoreError> {
        let limit = query.limit.clamp(1, crate::history::MAX_PAGE) as i64;
        let conn = self.conn().await?;
        let (after_ms, after_id) = match &query.after {
            Some(c) => (Some(c.started_ms), Some(c.id.clone())),
            None => (None, None),
        };
        let words = query.words.join(" ");
        // Words said in few records (a name, an order number) are found through the full-text
        // index, then paged among themselves; words said in many are found by walking the
        // records newest first, where matches are dense. The planner's estimate for a word it
        // has no statistics on (0.5% of rows) would otherwise walk a large archive for a rare
        // word. Both statements are planned with their values (not prepared once per
        // connection), so that each plan fits its words.
        if !words.is_empty() {
            let matches = conn
                .query(
                    "SELECT id FROM history_records
                     WHERE org_id = $1 AND kind = $2 AND search @@ plainto_tsquery('simple', $3)
                     LIMIT $4",
                    &[&org_id, &kind.tag(), &words, &(FEW_MATCHES + 1)],
                )
                .await
                .map_err(backend)?;
            if (matches.len() as i64) <= FEW_MATCHES {
                let ids: Vec<String> = matches.iter().map(|r| r.get(0)).collect();
                let found = conn
                    .query(
                        &format!(
                            "SELECT {HEAD_COLUMNS}, id FROM history_records
                             WHERE org_id = $1 AND id = ANY($2)
                               {PAGE_FILTERS}
                             ORDER BY started_ms DESC, id
                             LIMIT $9"
                        ),
                        &[
                            &org_id,
                            &ids,
                            &after_ms,
                            &after_id,
                            &query.from_ms,
                            &query.to_ms,
                            &query.connector,
                            &query.intent,
                            &limit,
                        ],
                    )
                    .await
                    .map_err(backend)?;
                return page_of(&found, limit);
            }
        }
        let found = rows(
            &conn,
            &format!(
                "SELECT {HEAD_COLUMNS}, id FROM history_records
                 WHERE org_id = $1 AND kind = $2
                   {PAGE_FILTERS}
                   AND ($9 = '' OR search @@ plainto_tsquery('simple', $9))
                 ORDER BY started_ms DESC, id
                 LIMIT $10"
            ),
            &[
                &org_id,
                &kind.tag(),
                &after_ms,
                &after_id,
                &query.from_ms,
                &query.to_ms,
                &query.connector,
                &query.intent,
                &words,
                &limit,
            ],
        )
        .await?;
        page_of(&found, limit)
    }

    async fn delete_record(&self, org_id: &str, id: &str) -> Result<bool, StoreError> {
        let conn = self.conn().await?;
        let n = exec(
            &conn,
            "DELETE FROM history_records WHERE org_id = $1 AND id = $2",
            &[&org_id, &id],
        )
        .await?;
        Ok(n > 0)
    }

    async fn purge_records(
        &self,
        org_id: &str,
        before_ms: i64,
        most: usize,
    ) -> Result<usize, StoreError> {
        let conn = self.conn().await?;
        let n = exec(
            &conn,
            "DELETE FROM history_records WHERE (org_id, id) IN (
                 SELECT org_id, id FROM history_records
                 WHERE org_id = $1 AND started_ms < $2
                 ORDER BY started_ms LIMIT $3)",
            &[&org_id, &before_ms, &(most.min(i64::MAX as usize) as i64)],
        )
        .await?;
        Ok(n as usize)
    }
}
