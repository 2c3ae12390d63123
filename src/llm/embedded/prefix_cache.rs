//! Evaluated prompts kept for reuse, and the context's cells shared between its sequences:
//! what each sequence holds, snapshots of earlier prompts, and how a new request is placed so
//! that it evaluates only what follows the longest prefix it shares with any of them.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use llama_cpp_2::context::session::{LlamaStateSeqFlags, SeqState};
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::token::LlamaToken;

use super::*;
use crate::llm::LlmError;

/// Fewest tokens worth keeping a snapshot of, or worth restoring or copying one for.
pub(super) const MIN_SNAPSHOT_TOKENS: usize = 64;

/// Fewest tokens worth reusing at all: less is a chat template's opening, not a prompt.
const MIN_REUSE: usize = 32;

/// A saved sequence: whose it is, the tokens it holds and llama.cpp's state of them.
pub(super) struct Snapshot {
    pub(super) owner: Option<String>,
    pub(super) tokens: Vec<LlamaToken>,
    pub(super) prompt_len: usize,
    pub(super) state: SeqState,
}

/// What one sequence of the context holds.
#[derive(Debug, Default)]
pub(super) struct Held {
    /// Whose tokens they are.
    pub(super) owner: Option<String>,
    /// The tokens in the sequence's cells, in order from position 0.
    pub(super) tokens: Vec<LlamaToken>,
    /// How many of them were the prompt (the rest were generated).
    pub(super) prompt_len: usize,
    /// Cells the request running here may fill (its prompt and answer); 0 when idle.
    pub(super) reserved: usize,
    /// When it was last used (a counter), to evict the least recently used first.
    pub(super) used_at: u64,
}

impl Held {
    fn busy(&self) -> bool {
        self.reserved > 0
    }

    /// Cells it takes or may come to take.
    fn cells(&self) -> usize {
        self.reserved.max(self.tokens.len())
    }
}

/// Where a new request goes and what it finds evaluated there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Placed {
    /// The sequence.
    pub(super) seq: usize,
    /// Tokens of the request already evaluated in it.
    pub(super) reused: usize,
}

/// The context's sequences and the snapshots kept besides them, least recently used first,
/// bounded in count and bytes.
///
/// The context's cells are one pool shared by every sequence (llama.cpp's unified KV cache):
/// a request is placed only when its prompt and whole answer fit beside what the running
/// requests may fill ([`PrefixCache::place`]), idle sequences giving theirs up (saved as a
/// snapshot first when worth it) least recently used first. So a running request never
/// runs out of cells.
///
/// A request goes to the idle sequence that shares the longest prefix with it; that prefix
/// may also be copied from another sequence (a copy shares the cells) or restored from a
/// snapshot. The cells past the shared prefix are removed and only the rest is evaluated.
///
/// Everything kept has an owner, the tenant whose request evaluated it ([`Generation::tenant`]),
/// and a request reuses only its own tenant's tokens or the service's own (`None`: the warm-ups
/// of the analysis instructions, which hold nothing of any organisation). So how fast a first
/// token comes cannot tell one organisation what another's prompt begins with.
pub struct PrefixCache {
    pub(super) seqs: Vec<Held>,
    pub(super) saved: VecDeque<Snapshot>,
    pub(super) entries: usize,
    pub(super) budget: usize,
    pub(super) bytes: usize,
    /// Cells of the context, shared by every sequence.
    pub(super) cells: usize,
    pub(super) counters: Arc<Counters>,
    clock: u64,
}

impl PrefixCache {
    pub(super) fn new(
        sequences: usize,
        cells: usize,
        entries: usize,
        budget: usize,
        counters: Arc<Counters>,
    ) -> Self {
        Self {
            seqs: (0..sequences.max(1)).map(|_| Held::default()).collect(),
            saved: VecDeque::new(),
            entries,
            budget,
            bytes: 0,
            cells,
            counters,
            clock: 0,
        }
    }

    /// Whether `owner`'s tokens may be reused for `tenant`.
    fn usable(owner: &Option<String>, tenant: Option<&str>) -> bool {
        owner.is_none() || owner.as_deref() == tenant
    }

    /// The idle sequence for `tokens` of `tenant`: the one that shares the longest prefix with
    /// them, else the least recently used; `None` when every sequence is busy.
    pub(super) fn choose(&self, tenant: Option<&str>, tokens: &[LlamaToken]) -> Option<usize> {
        self.seqs
            .iter()
            .enumerate()
            .filter(|(_, h)| !h.busy())
            .max_by_key(|(_, h)| {
                let shared = if Self::usable(&h.owner, tenant) {
                    common_prefix(&h.tokens, tokens)
                } else {
                    0
                };
                let shared = if shared < MIN_REUSE { 0 } else { shared };
                // Among those sharing nothing, the emptiest, then the least recently used.
                (
                    shared,
                    std::cmp::Reverse(h.tokens.len().min(1)),
                    std::cmp::Reverse(h.used_at),
                )
            })
            .map(|(i, _)| i)
    }

    /// Places a request of `tenant` for `tokens` that may fill `need` cells in all: on an idle
    /// sequence, with cells freed from other idle sequences if needed, and the context readied
    /// there ([`PrefixCache::prepare`]). `None`: no sequence is idle, or the running requests
    /// leave too few cells; it waits for one to finish.
    pub(super) fn place(
        &mut self,
        ctx: &mut LlamaContext<'_>,
        tenant: Option<&str>,
        tokens: &[LlamaToken],
        need: usize,
    ) -> Option<Placed> {
        let seq = self.choose(tenant, tokens)?;
        for victim in self.victims(seq, need)? {
            self.stash(ctx, victim);
            self.forget(ctx, victim);
        }
        let reused = self.prepare(ctx, seq, tenant, tokens);
        self.seqs[seq].reserved = need.max(1);
        Some(Placed { seq, reused })
    }

    /// The idle sequences other than `seq` that give up their cells, least recently used
    /// first, so that a request of `need` cells fits on `seq`; `None` when the running requests
    /// leave too few cells whatever the idle ones give up.
    pub(super) fn victims(&self, seq: usize, need: usize) -> Option<Vec<usize>> {
        let busy: usize = self.seqs.iter().filter(|h| h.busy()).map(Held::cells).sum();
        if busy + need > self.cells {
            return None;
        }
        let mut idle: Vec<usize> = (0..self.seqs.len())
            .filter(|&i| i != seq && !self.seqs[i].busy() && !self.seqs[i].tokens.is_empty())
            .collect();
        idle.sort_by_key(|&i| self.seqs[i].used_at);
        let mut taken: usize = busy
            + idle
                .iter()
                .map(|&i| self.seqs[i].tokens.len())
                .sum::<usize>();
        let mut out = Vec::new();
        for i in idle {
            if taken + need <= self.cells {
                break;
            }
            taken -= self.seqs[i].tokens.len();
            out.push(i);
        }
        Some(out)
    }

    /// Readies sequence `seq` for `tokens` of `tenant` and returns how many of them it already
    /// holds (always fewer than all: the last one is evaluated for its logits).
    pub(super) fn prepare(
        &mut self,
        ctx: &mut LlamaContext<'_>,
        seq: usize,
        tenant: Option<&str>,
        tokens: &[LlamaToken],
    ) -> usize {
        let own = if Self::usable(&self.seqs[seq].owner, tenant) {
            common_prefix(&self.seqs[seq].tokens, tokens)
        } else {
            0
        };
        // Another sequence's tokens, shared by copying (no cells are written).
        let other = self
            .seqs
            .iter()
            .enumerate()
            .filter(|(i, h)| *i != seq && Self::usable(&h.owner, tenant))
            .map(|(i, h)| (i, common_prefix(&h.tokens, tokens)))
            .max_by_key(|&(_, n)| n)
            .filter(|&(_, n)| n >= own + MIN_SNAPSHOT_TOKENS);
        let snapshot = self
            .saved
            .iter()
            .enumerate()
            .filter(|(_, s)| Self::usable(&s.owner, tenant))
            .map(|(i, s)| (i, common_prefix(&s.tokens, tokens)))
            .max_by_key(|&(i, n)| (n, i))
            .filter(|&(_, n)| n >= own + MIN_SNAPSHOT_TOKENS)
            .filter(|&(_, n)| other.is_none_or(|(_, o)| n > o));
        let mut reused = own;
        if let Some((from, n)) = other.filter(|_| snapshot.is_none()) {
            self.stash(ctx, seq);
            self.forget(ctx, seq);
            match ctx.copy_kv_cache_seq(from as i32, seq as i32, Some(0), Some(n as u32)) {
                Ok(()) => {
                    let (source, held) = pick_two(&mut self.seqs, from, seq);
                    held.tokens = source.tokens[..n].to_vec();
                    held.owner = source.owner.clone();
                    reused = n;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "a prompt could not be shared between sequences");
                    reused = 0;
                }
            }
        } else if let Some((i, n)) = snapshot {
            let snapshot = self
                .saved
                .remove(i)
                .expect("index from the iteration above");
            self.bytes -= snapshot.state.byte_len();
            self.stash(ctx, seq);
            self.forget(ctx, seq);
            match ctx.state_seq_set(&snapshot.state, seq as i32) {
                Ok(()) => {
                    reused = n;
                    let held = &mut self.seqs[seq];
                    held.tokens = snapshot.tokens;
                    held.prompt_len = snapshot.prompt_len;
                    held.owner = snapshot.owner;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "a kept prompt could not be restored");
                    self.forget(ctx, seq);
                    reused = 0;
                }
            }
        } else if self.seqs[seq].prompt_len.saturating_sub(own) >= MIN_SNAPSHOT_TOKENS {
            // The new prompt leaves the last one well before its end (another transcript, not
            // another task on the same one): keep it for its owner's next request.
            self.stash(ctx, seq);
        }
        let reused = if reused < MIN_REUSE {
            0
        } else {
            reused.min(tokens.len().saturating_sub(1))
        };
        let removed = ctx
            .clear_kv_cache_seq(Some(seq as u32), Some(reused as u32), None)
            .unwrap_or(false);
        let reused = if removed {
            self.seqs[seq].tokens.truncate(reused);
            reused
        } else {
            self.forget(ctx, seq);
            0
        };
        self.clock += 1;
        let held = &mut self.seqs[seq];
        held.prompt_len = tokens.len();
        held.used_at = self.clock;
        // What is kept of the sequence (the shared prefix) is the tenant's own or the
        // service's; from now on it holds the tenant's prompt.
        held.owner = tenant.map(str::to_owned);
        self.counters
            .reused
            .fetch_add(reused as u64, Ordering::Relaxed);
        self.counters
            .evaluated
            .fetch_add((tokens.len() - reused) as u64, Ordering::Relaxed);
        reused
    }

    /// The request on `seq` is over: its cells stay for reuse, no longer reserved.
    pub(super) fn release(&mut self, seq: usize) {
        self.clock += 1;
        let held = &mut self.seqs[seq];
        held.reserved = 0;
        held.used_at = self.clock;
    }

    /// `tokens` were evaluated on `seq`, after what it holds.
    pub(super) fn decoded(&mut self, seq: usize, tokens: &[LlamaToken]) {
        self.seqs[seq].tokens.extend_from_slice(tokens);
    }

    /// Empties sequence `seq`: nothing in it is reused.
    pub(super) fn forget(&mut self, ctx: &mut LlamaContext<'_>, seq: usize) {
        let _ = ctx.clear_kv_cache_seq(Some(seq as u32), None, None);
        let held = &mut self.seqs[seq];
        held.tokens.clear();
        held.prompt_len = 0;
    }

    /// Drops what `seq` holds from position `len` on (drafted tokens the model did not
    /// confirm); if llama.cpp cannot, the sequence is emptied.
    pub(super) fn truncate(
        &mut self,
        ctx: &mut LlamaContext<'_>,
        seq: usize,
        len: usize,
    ) -> Result<(), LlmError> {
        if len >= self.seqs[seq].tokens.len() {
            return Ok(());
        }
        match ctx.clear_kv_cache_seq(Some(seq as u32), Some(len as u32), None) {
            Ok(true) => {
                self.seqs[seq].tokens.truncate(len);
                Ok(())
            }
            _ => {
                self.forget(ctx, seq);
                Err(LlmError::Engine(
                    "drafted tokens could not be dropped".into(),
                ))
            }
        }
    }

    /// Saves what `seq` holds as a snapshot, if it is worth keeping, and drops the snapshots
    /// it makes redundant and the least recently used past the bounds.
    pub(super) fn stash(&mut self, ctx: &LlamaContext<'_>, seq: usize) {
        let held = &self.seqs[seq];
        if self.entries == 0 || held.tokens.len() < MIN_SNAPSHOT_TOKENS {
            return;
        }
        // Another sequence holding the same start already keeps it.
        if self
            .seqs
            .iter()
            .enumerate()
            .any(|(i, h)| i != seq && h.owner == held.owner && h.tokens.starts_with(&held.tokens))
        {
            return;
        }
        let state = match ctx.state_seq_get(seq as i32, LlamaStateSeqFlags::empty()) {
            Ok(state) if state.byte_len() <= self.budget => state,
            Ok(_) => return,
            Err(e) => {
                tracing::warn!(error = %e, "a sequence could not be saved for reuse");
                return;
            }
        };
        // A snapshot of the same owner that this one extends is no longer needed.
        let tokens = &held.tokens;
        let owner = &held.owner;
        let mut freed = 0;
        self.saved.retain(|s| {
            let redundant = &s.owner == owner && tokens.starts_with(&s.tokens);
            if redundant {
                freed += s.state.byte_len();
            }
            !redundant
        });
        self.bytes -= freed;
        self.bytes += state.byte_len();
        self.saved.push_back(Snapshot {
            owner: held.owner.clone(),
            tokens: held.tokens.clone(),
            prompt_len: held.prompt_len,
            state,
        });
        while self.saved.len() > self.entries || self.bytes > self.budget {
            match self.saved.pop_front() {
                Some(old) => self.bytes -= old.state.byte_len(),
                None => break,
            }
        }
    }
}

/// `seqs[a]` to read and `seqs[b]` to write, `a != b`.
fn pick_two(seqs: &mut [Held], a: usize, b: usize) -> (&Held, &mut Held) {
    assert_ne!(a, b, "a sequence is never copied onto itself");
    if a < b {
        let (left, right) = seqs.split_at_mut(b);
        (&left[a], &mut right[0])
    } else {
        let (left, right) = seqs.split_at_mut(a);
        (&right[0], &mut left[b])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(from: i32, n: usize) -> Vec<LlamaToken> {
        (0..n as i32).map(|i| LlamaToken(from + i)).collect()
    }

    fn cache(cells: usize) -> PrefixCache {
        PrefixCache::new(3, cells, 4, 1 << 20, Arc::new(Counters::default()))
    }

    #[test]
    fn a_request_goes_where_its_prefix_is_if_its_tenant_may_reuse_it() {
        let mut c = cache(10_000);
        c.seqs[0] = Held {
            owner: Some("org_a".into()),
            tokens: tokens(0, 200),
            prompt_len: 200,
            reserved: 0,
            used_at: 1,
        };
        c.seqs[1] = Held {
            owner: None,
            tokens: tokens(5_000, 100),
            prompt_len: 100,
            reserved: 0,
            used_at: 2,
        };
        let mut asked = tokens(0, 150);
        asked.extend(tokens(9_000, 10));
        // A's own prompt: where it is.
        assert_eq!(c.choose(Some("org_a"), &asked), Some(0));
        // The same tokens for B: not A's sequence; the empty one.
        assert_eq!(c.choose(Some("org_b"), &asked), Some(2));
        // The service's own tokens are anyone's.
        assert_eq!(c.choose(Some("org_b"), &tokens(5_000, 80)), Some(1));
        // A tiny shared start (a template's opening) is not worth choosing for.
        assert_eq!(c.choose(Some("org_a"), &tokens(0, 10)), Some(2));
        // A busy sequence is never chosen; among those sharing nothing, the least recently
        // used.
        c.seqs[2].reserved = 500;
        assert_eq!(c.choose(Some("org_b"), &asked), Some(0));
        c.seqs[0].reserved = 300;
        c.seqs[1].reserved = 300;
        assert_eq!(c.choose(Some("org_a"), &asked), None);
    }

    #[test]
    fn cells_are_freed_from_idle_sequences_least_recently_used_first_never_from_running_ones() {
        let mut c = cache(1_000);
        let held = |n: usize, used_at: u64, reserved: usize| Held {
            owner: None,
            tokens: tokens(0, n),
            prompt_len: n,
            reserved,
            used_at,
        };
        c.seqs[0] = held(300, 5, 0);
        c.seqs[1] = held(300, 1, 0);
        c.seqs[2] = held(0, 0, 0);
        // 400 cells fit beside both idle sequences.
        assert_eq!(c.victims(2, 400), Some(vec![]));
        // 500 need the least recently used one's cells.
        assert_eq!(c.victims(2, 500), Some(vec![1]));
        assert_eq!(c.victims(2, 1_000), Some(vec![1, 0]));
        // A running request's cells are never taken: past them, the request waits.
        c.seqs[0].reserved = 600;
        assert_eq!(c.victims(2, 400), Some(vec![1]));
        assert_eq!(c.victims(2, 401), None);
    }
}
