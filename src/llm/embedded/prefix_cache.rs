//! Evaluated prompts kept for reuse: the context's own tokens and snapshots of earlier
//! prompts, so a request evaluates only what follows the longest prefix it shares.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use llama_cpp_2::context::session::{LlamaStateSeqFlags, SeqState};
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::token::LlamaToken;

use super::*;
use crate::llm::LlmError;

/// Fewest tokens worth keeping a snapshot of, or worth restoring one for.
pub(super) const MIN_SNAPSHOT_TOKENS: usize = 64;

/// A saved sequence: whose it is, the tokens it holds and llama.cpp's state of them.
pub(super) struct Snapshot {
    pub(super) owner: Option<String>,
    pub(super) tokens: Vec<LlamaToken>,
    pub(super) prompt_len: usize,
    pub(super) state: SeqState,
}

/// What the model's context holds (sequence 0) and snapshots of earlier prompts, least
/// recently used first, bounded in count and bytes.
///
/// Before a prompt is evaluated, [`PrefixCache::prepare`] finds the longest prefix it shares
/// with the context or with a snapshot. When a snapshot shares more, the context is saved as
/// a snapshot (if it holds enough to be worth it) and the snapshot is restored in its place.
/// When the context is about to lose much of what it holds to an unrelated prompt, it is saved
/// first. The KV cache past the shared prefix is removed and only the rest is evaluated.
///
/// Everything kept has an owner, the tenant whose request evaluated it ([`Generation::tenant`]),
/// and a request reuses only its own tenant's tokens or the service's own (`None`: the warm-ups
/// of the analysis instructions, which hold nothing of any organisation). So how fast a first
/// token comes cannot tell one organisation what another's prompt begins with.
pub struct PrefixCache {
    /// Whose tokens the context holds.
    pub(super) owner: Option<String>,
    /// The tokens the context holds.
    pub(super) live: Vec<LlamaToken>,
    /// How many of them were the prompt (the rest were generated).
    pub(super) prompt_len: usize,
    pub(super) saved: VecDeque<Snapshot>,
    pub(super) entries: usize,
    pub(super) budget: usize,
    pub(super) bytes: usize,
    pub(super) counters: Arc<Counters>,
}

impl PrefixCache {
    pub(super) fn new(entries: usize, budget: usize, counters: Arc<Counters>) -> Self {
        Self {
            counters,
            owner: None,
            live: Vec::new(),
            prompt_len: 0,
            saved: VecDeque::new(),
            entries,
            budget,
            bytes: 0,
        }
    }

    /// Readies the context for `tokens` of `tenant` and returns how many of them it already
    /// holds (always fewer than all: the last one is evaluated for its logits).
    pub(super) fn prepare(
        &mut self,
        ctx: &mut LlamaContext<'_>,
        tenant: Option<&str>,
        tokens: &[LlamaToken],
    ) -> usize {
        let usable = |owner: &Option<String>| owner.is_none() || owner.as_deref() == tenant;
        let in_context = if usable(&self.owner) {
            common_prefix(&self.live, tokens)
        } else {
            0
        };
        let best = self
            .saved
            .iter()
            .enumerate()
            .filter(|(_, s)| usable(&s.owner))
            .map(|(i, s)| (i, common_prefix(&s.tokens, tokens)))
            .max_by_key(|&(i, n)| (n, i));
        let mut reused = in_context;
        if let Some((i, n)) = best.filter(|&(_, n)| n >= in_context + MIN_SNAPSHOT_TOKENS) {
            let snapshot = self
                .saved
                .remove(i)
                .expect("index from the iteration above");
            self.bytes -= snapshot.state.byte_len();
            self.stash(ctx);
            ctx.clear_kv_cache();
            self.live.clear();
            match ctx.state_seq_set(&snapshot.state, 0) {
                Ok(()) => {
                    reused = n;
                    self.live = snapshot.tokens;
                    self.prompt_len = snapshot.prompt_len;
                    self.owner = snapshot.owner;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "a kept prompt could not be restored");
                    ctx.clear_kv_cache();
                    reused = 0;
                }
            }
        } else if self.prompt_len.saturating_sub(in_context) >= MIN_SNAPSHOT_TOKENS {
            // The new prompt leaves the last one well before its end (another transcript, not
            // another task on the same one): keep the context for its owner's next request.
            self.stash(ctx);
        }
        let reused = reused.min(tokens.len().saturating_sub(1));
        let removed = ctx
            .clear_kv_cache_seq(Some(0), Some(reused as u32), None)
            .unwrap_or(false);
        let reused = if removed {
            self.live.truncate(reused);
            reused
        } else {
            ctx.clear_kv_cache();
            self.live.clear();
            0
        };
        self.prompt_len = tokens.len();
        // What is kept of the context (the shared prefix) is the tenant's own or the
        // service's; from now on it holds the tenant's prompt.
        self.owner = tenant.map(str::to_owned);
        self.counters
            .reused
            .fetch_add(reused as u64, Ordering::Relaxed);
        self.counters
            .evaluated
            .fetch_add((tokens.len() - reused) as u64, Ordering::Relaxed);
        reused
    }

    /// Evaluates `batch`, which adds `tokens` to the context; on failure the context is
    /// emptied, so that nothing half-evaluated is ever reused.
    pub(super) fn decode(
        &mut self,
        ctx: &mut LlamaContext<'_>,
        batch: &mut LlamaBatch<'_>,
        tokens: &[LlamaToken],
    ) -> Result<(), LlmError> {
        match ctx.decode(batch) {
            Ok(()) => {
                self.live.extend_from_slice(tokens);
                Ok(())
            }
            Err(e) => {
                self.forget(ctx);
                Err(engine(e))
            }
        }
    }

    /// Empties the context: nothing in it is reused.
    pub(super) fn forget(&mut self, ctx: &mut LlamaContext<'_>) {
        ctx.clear_kv_cache();
        self.live.clear();
        self.prompt_len = 0;
    }

    /// Drops what the context holds from position `len` on (drafted tokens the model did not
    /// confirm); if llama.cpp cannot, the context is emptied.
    pub(super) fn truncate(
        &mut self,
        ctx: &mut LlamaContext<'_>,
        len: usize,
    ) -> Result<(), LlmError> {
        if len >= self.live.len() {
            return Ok(());
        }
        match ctx.clear_kv_cache_seq(Some(0), Some(len as u32), None) {
            Ok(true) => {
                self.live.truncate(len);
                Ok(())
            }
            _ => {
                self.forget(ctx);
                Err(LlmError::Engine(
                    "drafted tokens could not be dropped".into(),
                ))
            }
        }
    }

    /// Saves what the context holds as a snapshot, if it is worth keeping, and drops the
    /// snapshots it makes redundant and the least recently used past the bounds.
    pub(super) fn stash(&mut self, ctx: &LlamaContext<'_>) {
        if self.entries == 0 || self.live.len() < MIN_SNAPSHOT_TOKENS {
            return;
        }
        let state = match ctx.state_seq_get(0, LlamaStateSeqFlags::empty()) {
            Ok(state) if state.byte_len() <= self.budget => state,
            Ok(_) => return,
            Err(e) => {
                tracing::warn!(error = %e, "the context could not be saved for reuse");
                return;
            }
        };
        // A snapshot of the same owner that this one extends is no longer needed.
        let live = &self.live;
        let owner = &self.owner;
        let mut freed = 0;
        self.saved.retain(|s| {
            let redundant = &s.owner == owner && live.starts_with(&s.tokens);
            if redundant {
                freed += s.state.byte_len();
            }
            !redundant
        });
        self.bytes -= freed;
        self.bytes += state.byte_len();
        self.saved.push_back(Snapshot {
            owner: self.owner.clone(),
            tokens: self.live.clone(),
            prompt_len: self.prompt_len,
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
