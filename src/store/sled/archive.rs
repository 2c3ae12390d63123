//! The call history in the embedded store. Every call blocks.
//!
//! Trees and their keys (`/` is a byte 0x2f after the organisation id; `inv` is
//! `u64::MAX - started_ms`, big-endian, so a forward scan is newest first):
//! - `history`: `org / kind inv id` -> JSON [`RecordHead`]
//! - `history_ids`: `org / id` -> `started_ms` (8 bytes BE), to find a head by id
//! - `history_lines`: `org / id / L offset_ms(8 BE) channel(2 BE)` -> JSON [`Line`], and
//!   `org / id / I at_ms(8 BE)` -> JSON [`IntentEntry`]
//! - `history_words`: `org / kind word 0x00 inv id` -> nothing: the inverted index of the
//!   transcripts' words ([`crate::history::words`]), newest first per word
//!
//! A search walks the postings of its longest word (the likeliest to be rare) newest first and
//! checks the other words by point lookups. Every listing reads at most [`MAX_SCAN`] entries;
//! a page cut short there still carries a cursor to go on from.

use serde::de::DeserializeOwned;

use crate::history::{Cursor, IntentEntry, Line, Page, Query, Record, RecordHead, RecordKind};
use crate::store::StoreError;

use super::codec::{backend, decode, encode, org_prefix};

/// Most entries (heads or postings) one listing reads.
pub const MAX_SCAN: usize = 20_000;

/// The history's trees.
pub struct Trees {
    db: sled::Db,
    heads: sled::Tree,
    ids: sled::Tree,
    lines: sled::Tree,
    words: sled::Tree,
}

fn inv(started_ms: i64) -> [u8; 8] {
    (u64::MAX - started_ms.max(0) as u64).to_be_bytes()
}

fn kind_prefix(org_id: &str, kind: RecordKind) -> Vec<u8> {
    let mut key = org_prefix(org_id);
    key.push(kind.tag() as u8);
    key
}

fn head_key(org_id: &str, kind: RecordKind, started_ms: i64, id: &str) -> Vec<u8> {
    let mut key = kind_prefix(org_id, kind);
    key.extend_from_slice(&inv(started_ms));
    key.extend_from_slice(id.as_bytes());
    key
}

fn id_key(org_id: &str, id: &str) -> Vec<u8> {
    let mut key = org_prefix(org_id);
    key.extend_from_slice(id.as_bytes());
    key
}

fn record_prefix(org_id: &str, id: &str) -> Vec<u8> {
    let mut key = id_key(org_id, id);
    key.push(b'/');
    key
}

fn line_key(org_id: &str, id: &str, line: &Line) -> Vec<u8> {
    let mut key = record_prefix(org_id, id);
    key.push(b'L');
    key.extend_from_slice(&(line.offset_ms() as u64).to_be_bytes());
    key.extend_from_slice(&(line.channel.min(u16::MAX as usize) as u16).to_be_bytes());
    key
}

fn word_prefix(org_id: &str, kind: RecordKind, word: &str) -> Vec<u8> {
    let mut key = kind_prefix(org_id, kind);
    key.extend_from_slice(word.as_bytes());
    key.push(0);
    key
}

fn posting(prefix: &[u8], started_ms: i64, id: &str) -> Vec<u8> {
    let mut key = prefix.to_vec();
    key.extend_from_slice(&inv(started_ms));
    key.extend_from_slice(id.as_bytes());
    key
}

/// The start and id in the tail of a head key or posting (`inv id` after `prefix`).
fn tail(prefix_len: usize, key: &[u8]) -> Option<(i64, String)> {
    let rest = key.get(prefix_len..)?;
    let (ts, id) = rest.split_at_checked(8)?;
    let started = u64::MAX - u64::from_be_bytes(ts.try_into().ok()?);
    Some((started as i64, String::from_utf8(id.to_vec()).ok()?))
}

fn values<T: DeserializeOwned>(
    tree: &sled::Tree,
    prefix: &[u8],
    what: &str,
) -> Result<Vec<T>, StoreError> {
    tree.scan_prefix(prefix)
        .values()
        .map(|v| decode(what, &v.map_err(backend)?))
        .collect()
}

impl Trees {
    /// Opens (or creates) the trees in `db`.
    pub fn open(db: &sled::Db) -> Result<Self, StoreError> {
        let tree = |name: &str| db.open_tree(name).map_err(backend);
        Ok(Self {
            heads: tree("history")?,
            ids: tree("history_ids")?,
            lines: tree("history_lines")?,
            words: tree("history_words")?,
            db: db.clone(),
        })
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.db.flush().map(drop).map_err(backend)
    }

    fn started(&self, org_id: &str, id: &str) -> Result<Option<i64>, StoreError> {
        Ok(self
            .ids
            .get(id_key(org_id, id))
            .map_err(backend)?
            .and_then(|v| Some(u64::from_be_bytes(v.as_ref().try_into().ok()?) as i64)))
    }

    fn head(&self, org_id: &str, id: &str) -> Result<Option<(Vec<u8>, RecordHead)>, StoreError> {
        let (Some(started), Some(kind)) = (self.started(org_id, id)?, crate::history::kind_of(id))
        else {
            return Ok(None);
        };
        let key = head_key(org_id, kind, started, id);
        match self.heads.get(&key).map_err(backend)? {
            Some(v) => Ok(Some((key, decode("history record", &v)?))),
            None => Ok(None),
        }
    }

    fn index(&self, head: &RecordHead, text: &str) -> Result<(), StoreError> {
        for word in crate::history::words(text) {
            let prefix = word_prefix(&head.org_id, head.kind, &word);
            self.words
                .insert(posting(&prefix, head.started_ms, &head.id), &[])
                .map_err(backend)?;
        }
        Ok(())
    }

    /// Starts or continues a record.
    pub fn begin(&self, head: &RecordHead) -> Result<(), StoreError> {
        let mut head = head.clone();
        if let Some((key, kept)) = self.head(&head.org_id, &head.id)? {
            head.started_ms = kept.started_ms;
            head.billed_ms = kept.billed_ms;
            head.intent = head.intent.or(kept.intent);
            self.heads.insert(key, encode(&head)).map_err(backend)?;
        } else {
            let key = head_key(&head.org_id, head.kind, head.started_ms, &head.id);
            self.heads.insert(key, encode(&head)).map_err(backend)?;
            self.ids
                .insert(
                    id_key(&head.org_id, &head.id),
                    &(head.started_ms.max(0) as u64).to_be_bytes(),
                )
                .map_err(backend)?;
        }
        self.flush()
    }

    /// Appends lines to a record that exists.
    pub fn add_lines(&self, org_id: &str, id: &str, lines: &[Line]) -> Result<(), StoreError> {
        let Some((_, head)) = self.head(org_id, id)? else {
            return Ok(());
        };
        for line in lines {
            let key = line_key(org_id, id, line);
            if self
                .lines
                .compare_and_swap(&key, None::<&[u8]>, Some(encode(line)))
                .map_err(backend)?
                .is_ok()
            {
                self.index(&head, &line.text)?;
            }
        }
        self.flush()
    }

    /// Appends an intent update.
    pub fn add_intent(
        &self,
        org_id: &str,
        id: &str,
        entry: &IntentEntry,
    ) -> Result<(), StoreError> {
        let Some((key, mut head)) = self.head(org_id, id)? else {
            return Ok(());
        };
        let mut at = entry.at_ms.max(0) as u64;
        loop {
            let mut k = record_prefix(org_id, id);
            k.push(b'I');
            k.extend_from_slice(&at.to_be_bytes());
            let put = self
                .lines
                .compare_and_swap(&k, None::<&[u8]>, Some(encode(entry)))
                .map_err(backend)?;
            if put.is_ok() {
                break;
            }
            at += 1;
        }
        if let Some(top) = crate::history::top_intent(&entry.result) {
            head.intent = Some(top);
            self.heads.insert(key, encode(&head)).map_err(backend)?;
        }
        self.flush()
    }

    /// Ends a call.
    pub fn end(
        &self,
        org_id: &str,
        id: &str,
        ended_ms: i64,
        reason: &str,
        billed_ms: u64,
    ) -> Result<(), StoreError> {
        let Some((key, mut head)) = self.head(org_id, id)? else {
            return Ok(());
        };
        head.ended_ms = Some(ended_ms);
        head.close_reason = Some(reason.to_owned());
        head.billed_ms = head.billed_ms.saturating_add(billed_ms);
        self.heads.insert(key, encode(&head)).map_err(backend)?;
        self.flush()
    }

    /// Stores a whole record.
    pub fn put(&self, record: &Record) -> Result<(), StoreError> {
        let head = &record.head;
        self.erase(&head.org_id, &head.id)?;
        let key = head_key(&head.org_id, head.kind, head.started_ms, &head.id);
        self.heads.insert(key, encode(head)).map_err(backend)?;
        self.ids
            .insert(
                id_key(&head.org_id, &head.id),
                &(head.started_ms.max(0) as u64).to_be_bytes(),
            )
            .map_err(backend)?;
        for line in &record.transcript {
            self.lines
                .insert(line_key(&head.org_id, &head.id, line), encode(line))
                .map_err(backend)?;
            self.index(head, &line.text)?;
        }
        self.flush()
    }

    /// One record.
    pub fn record(&self, org_id: &str, id: &str) -> Result<Option<Record>, StoreError> {
        let Some((_, head)) = self.head(org_id, id)? else {
            return Ok(None);
        };
        let prefix = record_prefix(org_id, id);
        let mut line_prefix = prefix.clone();
        line_prefix.push(b'L');
        let mut intent_prefix = prefix;
        intent_prefix.push(b'I');
        let mut transcript: Vec<Line> = values(&self.lines, &line_prefix, "history line")?;
        transcript.sort_by_key(|a| (a.offset_ms(), a.channel));
        Ok(Some(Record {
            head,
            transcript,
            intents: values(&self.lines, &intent_prefix, "history intent")?,
        }))
    }

    /// Everything about a record, gone; whether it was there. Not flushed.
    fn erase(&self, org_id: &str, id: &str) -> Result<bool, StoreError> {
        let Some((key, head)) = self.head(org_id, id)? else {
            return Ok(false);
        };
        // Whoever removes the id erases the record: a purge and a delete (or two purges) that
        // meet on one record count it once.
        if self
            .ids
            .remove(id_key(org_id, id))
            .map_err(backend)?
            .is_none()
        {
            return Ok(false);
        }
        let prefix = record_prefix(org_id, id);
        let mut line_prefix = prefix.clone();
        line_prefix.push(b'L');
        let lines: Vec<Line> = values(&self.lines, &line_prefix, "history line")?;
        let mut seen = std::collections::HashSet::new();
        for line in &lines {
            for word in crate::history::words(&line.text) {
                if seen.insert(word.clone()) {
                    let p = word_prefix(org_id, head.kind, &word);
                    self.words
                        .remove(posting(&p, head.started_ms, id))
                        .map_err(backend)?;
                }
            }
        }
        for k in self.lines.scan_prefix(&prefix).keys() {
            self.lines.remove(k.map_err(backend)?).map_err(backend)?;
        }
        self.heads.remove(key).map_err(backend)?;
        Ok(true)
    }

    /// Erases a record.
    pub fn delete(&self, org_id: &str, id: &str) -> Result<bool, StoreError> {
        let gone = self.erase(org_id, id)?;
        self.flush()?;
        Ok(gone)
    }

    /// Erases records started before `before_ms`, oldest first.
    pub fn purge(&self, org_id: &str, before_ms: i64, most: usize) -> Result<usize, StoreError> {
        let mut old = Vec::new();
        for kind in [RecordKind::Call, RecordKind::File] {
            let prefix = kind_prefix(org_id, kind);
            for k in self.heads.scan_prefix(&prefix).keys().rev() {
                let k = k.map_err(backend)?;
                match tail(prefix.len(), &k) {
                    Some((started, id)) if started < before_ms => old.push(id),
                    _ => break,
                }
                if old.len() >= most {
                    break;
                }
            }
        }
        old.truncate(most);
        let mut n = 0;
        for id in &old {
            n += usize::from(self.erase(org_id, id)?);
        }
        if n > 0 {
            self.flush()?;
        }
        Ok(n)
    }

    /// A page of records.
    pub fn list(&self, org_id: &str, kind: RecordKind, query: &Query) -> Result<Page, StoreError> {
        let limit = query.limit.clamp(1, crate::history::MAX_PAGE);
        // The longest word drives the walk; the others are looked up.
        let mut words = query.words.clone();
        words.sort_by_key(|w| std::cmp::Reverse(w.len()));
        let (prefix, tree) = match words.first() {
            Some(w) => (word_prefix(org_id, kind, w), &self.words),
            None => (kind_prefix(org_id, kind), &self.heads),
        };
        let others: Vec<Vec<u8>> = words
            .iter()
            .skip(1)
            .map(|w| word_prefix(org_id, kind, w))
            .collect();
        // Where the walk starts: after the cursor, or at the newest record before `to`.
        let start = match (&query.after, query.to_ms) {
            (Some(c), _) => {
                let mut k = posting(&prefix, c.started_ms, &c.id);
                k.push(0);
                k
            }
            (None, Some(to)) => posting(&prefix, to.saturating_sub(1), ""),
            (None, None) => prefix.clone(),
        };
        let mut heads = Vec::new();
        let mut scanned = 0;
        let mut last = None;
        let mut more = false;
        for item in tree.range(start..) {
            let (k, v) = item.map_err(backend)?;
            if !k.starts_with(&prefix) {
                break;
            }
            let Some((started, id)) = tail(prefix.len(), &k) else {
                continue;
            };
            if query.from_ms.is_some_and(|f| started < f) {
                break;
            }
            scanned += 1;
            last = Some(Cursor {
                started_ms: started,
                id: id.clone(),
            });
            let mut all = true;
            for p in &others {
                if !self
                    .words
                    .contains_key(posting(p, started, &id))
                    .map_err(backend)?
                {
                    all = false;
                    break;
                }
            }
            if all {
                let head: RecordHead = if words.is_empty() {
                    decode("history record", &v)?
                } else {
                    match self
                        .heads
                        .get(head_key(org_id, kind, started, &id))
                        .map_err(backend)?
                    {
                        Some(v) => decode("history record", &v)?,
                        None => continue,
                    }
                };
                if query.admits(&head) {
                    heads.push(head);
                    if heads.len() == limit {
                        more = true;
                        break;
                    }
                }
            }
            if scanned >= MAX_SCAN {
                more = true;
                break;
            }
        }
        // Walked to the end of the listing (or of the store): no next page.
        Ok(Page {
            heads,
            next: if more { last } else { None },
        })
    }
}
