//! The model's thread: loads the model and its context once, then serves requests (and
//! warm-ups) side by side on the context's sequences, one evaluation per step for all of
//! them (continuous batching), handing each its text within a bounded wait for its reader.

use std::num::NonZeroU32;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};
use llama_cpp_2::context::params::{KvCacheType, LlamaContextParams};
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;
use std::time::Instant;
use tokio::sync::oneshot;

use super::*;
use crate::llm::{Generation, LlmError};

/// The next piece of work: a request whenever one waits, else a warm-up; `None` once the
/// model stops (`quit` is set, and the request queue has no sender left).
pub(super) fn next_job(
    jobs: &Receiver<Job>,
    warm: &Receiver<Generation>,
    quit: &AtomicBool,
) -> Option<Job> {
    let warm_up = |generation| Job {
        generation,
        deltas: None,
        done: None,
    };
    if quit.load(Ordering::SeqCst) {
        return None;
    }
    if let Ok(job) = jobs.try_recv() {
        return Some(job);
    }
    if let Ok(generation) = warm.try_recv() {
        return Some(warm_up(generation));
    }
    crossbeam_channel::select! {
        recv(jobs) -> job => job.ok(),
        recv(warm) -> generation => generation.ok().map(warm_up),
    }
}

pub(super) fn worker(
    path: &Path,
    config: &EmbeddedConfig,
    jobs: &Receiver<Job>,
    warm: &Receiver<Generation>,
    quit: &AtomicBool,
    ready: &Sender<Result<(), LlmError>>,
    counters: Arc<Counters>,
) {
    let loaded = (|| {
        // Before the engine starts: with no backend loaded, it would load one by itself.
        let features = cpu_backend()?;
        let amx = features.split(", ").any(|f| f == "AMX_INT8 = 1");
        let draft = config
            .draft_tokens
            .unwrap_or(if amx { AMX_DRAFT_TOKENS } else { 0 });
        let keys = config.key_cache.unwrap_or(crate::config::KeyCache::Q8_0);
        tracing::debug!(
            draft,
            ?keys,
            "tokens drafted ahead of structured answers, key cache"
        );
        let mut backend = LlamaBackend::init().map_err(engine)?;
        backend.void_logs();
        let mut model_params = std::pin::pin!(LlamaModelParams::default());
        if !config.repack_weights {
            // Every tensor in plain CPU memory: none goes to the repacking buffer type.
            model_params.as_mut().add_cpu_buft_override(c".");
        }
        let model = LlamaModel::load_from_file(&backend, path, &model_params)
            .map_err(|e| LlmError::Engine(format!("cannot load {}: {e}", path.display())))?;
        let template = model.chat_template(None).map_err(engine)?;
        Ok::<_, LlmError>((backend, model, template, draft as usize, keys))
    })();
    let (backend, model, template, draft, keys) = match loaded {
        Ok(loaded) => loaded,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let sequences = config.sequences.max(1);
    let window = config.context_tokens as usize;
    let cells = kv_cells(
        &KvShape::of(&model, keys),
        config.kv_cache_bytes,
        window + draft + 1,
        sequences,
    );
    let capacity = PROMPT_CHUNK + sequences * (draft + 1);
    let params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(cells as u32))
        .with_n_batch(capacity as u32)
        .with_n_ubatch(config.micro_batch.clamp(1, PROMPT_CHUNK as u32))
        .with_n_seq_max(sequences as u32)
        // One pool of cells for every sequence: a sequence takes what its request needs, and
        // a prompt one holds can be shared with another by reference.
        .with_kv_unified(true)
        .with_n_threads(config.threads as i32)
        .with_n_threads_batch(config.threads as i32)
        .with_type_k(match keys {
            crate::config::KeyCache::F16 => KvCacheType::F16,
            crate::config::KeyCache::Q8_0 => KvCacheType::Q8_0,
        });
    // llama.cpp's own values of `llama_flash_attn_type`.
    let params = params.with_flash_attention_policy(i32::from(config.flash_attention));
    let mut ctx = match model.new_context(&backend, params) {
        Ok(ctx) => ctx,
        Err(e) => {
            let _ = ready.send(Err(engine(e)));
            return;
        }
    };
    tracing::info!(
        sequences,
        cells,
        window,
        "embedded model ready: requests served side by side"
    );
    let _ = ready.send(Ok(()));
    let mut cache = PrefixCache::new(
        sequences,
        cells,
        config.prefix_cache_entries,
        config.prefix_cache_bytes,
        counters,
    );
    let decoder = Decoder {
        model: &model,
        template: &template,
        draft_tokens: draft,
        force_schema_text: config.force_schema_text,
        window,
    };
    let mut batcher = Batcher {
        decoder: &decoder,
        ctx: &mut ctx,
        cache: &mut cache,
        batch: LlamaBatch::new(capacity, 1),
        capacity,
        shared_prefill: config.micro_batch.clamp(1, PROMPT_CHUNK as u32) as usize,
        prompt_cost: PromptCost::new(),
        sequences,
        live_seen: None,
        waiting: Vec::new(),
        running: Vec::new(),
    };
    batcher.run(jobs, warm, quit);
}

/// The shape of the attention cache of a model: what one cell (a token of one sequence)
/// takes.
#[derive(Debug, Clone, Copy)]
pub(super) struct KvShape {
    layers: usize,
    /// Values per layer of a key (and of a value): heads sharing keys x head size.
    width: usize,
    /// Bytes per value of a key (f16: 2; q8_0: 34 per 32).
    key_bytes: f64,
}

impl KvShape {
    fn of(model: &LlamaModel, keys: crate::config::KeyCache) -> Self {
        let heads = model.n_head().max(1) as usize;
        Self {
            layers: model.n_layer() as usize,
            width: model.n_head_kv() as usize * (model.n_embd().max(1) as usize / heads),
            key_bytes: match keys {
                crate::config::KeyCache::F16 => 2.0,
                crate::config::KeyCache::Q8_0 => 34.0 / 32.0,
            },
        }
    }

    /// Bytes one cell takes (keys as configured, values in f16).
    pub(super) fn cell_bytes(&self) -> f64 {
        self.layers as f64 * self.width as f64 * (self.key_bytes + 2.0)
    }
}

/// Cells of the context: as many as `budget` bytes hold, but at least `one` (a request's
/// largest need) and at most what `sequences` such requests take, in llama.cpp's steps of 256.
pub(super) fn kv_cells(shape: &KvShape, budget: usize, one: usize, sequences: usize) -> usize {
    let fit = (budget as f64 / shape.cell_bytes().max(1.0)) as usize;
    let cells = fit.clamp(one, one * sequences.max(1));
    cells.div_ceil(256) * 256
}

/// Whether warm-up `earlier` is of no use once `later` is pending: the same organisation and
/// class, the same conversation up to its last message, which `later` continues (a call's
/// transcript with more lines).
fn superseded(earlier: &Generation, later: &Generation) -> bool {
    let (Some((last, before)), Some((later_last, later_before))) =
        (earlier.messages.split_last(), later.messages.split_last())
    else {
        return false;
    };
    earlier.tenant == later.tenant
        && earlier.class == later.class
        && before == later_before
        && last.role == later_last.role
        && later_last.content.starts_with(&last.content)
}

/// A sequence's class as a rank: live 0 (with a live call's transcript read ahead after the
/// call asked), interactive 1, a call's transcript read ahead before it asked 2 (an
/// organisation's warm-up of another class: a line or two at a time, read before files'
/// prompts so that a long one cannot hold it back), batch 3, the service's own warm-ups 4.
fn class_rank(s: &Sequence) -> u8 {
    use crate::llm::fair::Class;
    match (s.class, s.warm(), s.tenant.is_some()) {
        (Class::Live, _, _) => 0,
        (Class::Interactive, false, _) => 1,
        (_, true, true) => 2,
        (Class::Batch, false, _) => 3,
        (_, true, false) => 4,
    }
}

/// How a sequence's turn is ordered among prompts waiting to be read: live first, warm-ups
/// last, then by arrival.
fn rank(s: &Sequence) -> (u8, Instant) {
    (class_rank(s), s.arrived)
}

/// Prompt tokens a step reads of a prompt of a lower class than an answer being written: the
/// answer's next token waits for the whole step, so a long prompt of lower rank is read a few
/// tokens at a time beside it (and still progresses).
const YIELD_CHUNK: usize = 16;

/// Longest a step that reads prompts should take, by what else it carries: a request that
/// arrives meanwhile (a live call's `analyze`) waits for the step to end, and answers being
/// written wait for it before their next token. Prompt chunks are sized by the measured cost of
/// a prompt token: a 512-token chunk takes about 15 s on two AVX2 cores, about 4 s on two AMX ones.
const STEP_ALONE: std::time::Duration = std::time::Duration::from_millis(1000);
/// The same beside answers being written (at most `llm.micro_batch` tokens too).
const STEP_BESIDE_ANSWERS: std::time::Duration = std::time::Duration::from_millis(500);
/// The same for the service's own warm-ups (start-up prompts), which only save later work.
const STEP_WARM_UP: std::time::Duration = std::time::Duration::from_millis(300);
/// How long after a live request arrived calls count as streaming: meanwhile a step that
/// reads only prompts of lower classes takes [`STEP_BESIDE_ANSWERS`], not [`STEP_ALONE`], as the
/// next live `analyze` waits for the step under way.
const LIVE_RECENT: std::time::Duration = std::time::Duration::from_secs(60);

/// What one prompt token costs to read, time-averaged over steps that read prompts only.
#[derive(Debug, Clone, Copy)]
struct PromptCost {
    secs_per_token: f64,
}

impl PromptCost {
    /// Until measured: 100 tokens a second.
    fn new() -> Self {
        Self {
            secs_per_token: 0.01,
        }
    }

    /// Learns from a step that read `tokens` prompt tokens (and nothing else) in `took`.
    fn observe(&mut self, tokens: usize, took: std::time::Duration) {
        if tokens >= 8 {
            let sample = took.as_secs_f64() / tokens as f64;
            self.secs_per_token = 0.7 * self.secs_per_token + 0.3 * sample;
        }
    }

    /// The most prompt tokens one step should read to last about `budget`: at least 8, at
    /// most `most`.
    fn chunk(&self, budget: std::time::Duration, most: usize) -> usize {
        let fit = budget.as_secs_f64() / self.secs_per_token.max(1e-6);
        (fit as usize).clamp(8.min(most), most)
    }
}

/// The loop that serves the model's sequences side by side: each step, one evaluation
/// carries the next token of every sequence writing its answer and, in the room left, a
/// chunk of the prompts being read (live first). A step takes as long as its largest part, so
/// what is read beside answers is bounded: a prompt's chunk is smaller while answers are
/// written ([`Batcher::shared_prefill`]), a prompt of lower class than an answer being written
/// is read [`YIELD_CHUNK`] tokens a step (a warm-up not at all beside a request), and while a live
/// analysis runs, nothing of a lower class is read at all (it waits a second or two).
struct Batcher<'a, 'm, 'c> {
    decoder: &'a Decoder<'m>,
    ctx: &'a mut LlamaContext<'c>,
    cache: &'a mut PrefixCache,
    batch: LlamaBatch<'static>,
    capacity: usize,
    /// Prompt tokens read per step while answers are being written.
    shared_prefill: usize,
    /// What a prompt token costs here, which sizes every prompt chunk.
    prompt_cost: PromptCost,
    sequences: usize,
    /// When the last live request (or a live call's read-ahead, asked or not) arrived.
    live_seen: Option<Instant>,
    /// Readied, waiting for a sequence (or for cells).
    waiting: Vec<Sequence>,
    running: Vec<Sequence>,
}

impl Batcher<'_, '_, '_> {
    fn run(&mut self, jobs: &Receiver<Job>, warm: &Receiver<Generation>, quit: &AtomicBool) {
        // Warm-ups not started yet, oldest first; at most WARM_QUEUE, the oldest dropped.
        let mut pending: std::collections::VecDeque<Generation> = Default::default();
        loop {
            if self.running.is_empty() && self.waiting.is_empty() && pending.is_empty() {
                match next_job(jobs, warm, quit) {
                    Some(job) => self.accept(job),
                    None => break,
                }
            }
            if quit.load(Ordering::SeqCst) {
                break;
            }
            while let Ok(job) = jobs.try_recv() {
                self.accept(job);
            }
            while let Ok(generation) = warm.try_recv() {
                // What the new one reads ahead covers an earlier one of the same call.
                pending.retain(|earlier| !superseded(earlier, &generation));
                pending.push_back(generation);
                if pending.len() > WARM_QUEUE {
                    pending.pop_front();
                }
            }
            if let Some(generation) = self.next_warm_up(&mut pending) {
                self.accept(Job {
                    generation,
                    deltas: None,
                    done: None,
                });
            }
            self.place();
            self.tend();
            if !self.step() {
                // Every running sequence waits for its reader (or nothing runs): wait a
                // moment for room, or for new work.
                match jobs.recv_timeout(std::time::Duration::from_millis(2)) {
                    Ok(job) => self.accept(job),
                    Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                        if self.running.is_empty() && self.waiting.is_empty() {
                            break;
                        }
                    }
                    Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
                }
            }
        }
        // Stopped: what runs is given up (with what it cost), what waits is answered.
        for mut s in self.running.drain(..) {
            s.cancel(&self.cache.counters);
            let result = s
                .take_result()
                .expect("a cancelled sequence has its result");
            s.deliver(result, &self.cache.counters);
        }
        for s in self.waiting.drain(..) {
            s.deliver(
                Err(LlmError::Engine("the model thread stopped".into())),
                &self.cache.counters,
            );
        }
    }

    /// The warm-up to start now, if any, one at a time of each kind: a live call's transcript
    /// (live work) whenever a sequence is idle; a call's transcript before it asked while no
    /// request waits; the service's own while nothing waits and no other warm-up runs.
    fn next_warm_up(
        &self,
        pending: &mut std::collections::VecDeque<Generation>,
    ) -> Option<Generation> {
        if self.running.len() >= self.sequences {
            return None;
        }
        let live = |g: &Generation| g.class == crate::llm::fair::Class::Live;
        let live_running = self
            .running
            .iter()
            .any(|s| s.warm() && s.class == crate::llm::fair::Class::Live);
        if !live_running {
            if let Some(i) = pending.iter().position(live) {
                return pending.remove(i);
            }
        }
        if !self.waiting.is_empty() {
            return None;
        }
        // A call's transcript before it asked: not held back by the service's own warm-up,
        // which reads nothing while requests are served.
        let ahead = |g: &Generation| !live(g) && g.tenant.is_some();
        let ahead_running = self
            .running
            .iter()
            .any(|s| s.warm() && s.tenant.is_some() && s.class != crate::llm::fair::Class::Live);
        if !ahead_running {
            if let Some(i) = pending.iter().position(ahead) {
                return pending.remove(i);
            }
        }
        if !self.running.iter().any(Sequence::warm) {
            if let Some(i) = pending.iter().position(|g| !live(g)) {
                return pending.remove(i);
            }
        }
        None
    }

    /// Readies a new job; one that cannot run is answered at once.
    fn accept(&mut self, job: Job) {
        // A requester that has gone (a REST client that hung up) gets no model time.
        if job.done.as_ref().is_some_and(oneshot::Sender::is_closed) {
            return;
        }
        match Sequence::new(self.decoder, job.generation, job.deltas, job.done) {
            Ok(s) => {
                // A call's transcript kept ready, asked or not, is a call streaming too.
                if s.class == crate::llm::fair::Class::Live || (s.warm() && s.tenant.is_some()) {
                    self.live_seen = Some(Instant::now());
                }
                self.waiting.push(s);
            }
            Err((e, Some(done))) => {
                let _ = done.send(Err(e));
            }
            Err((e, None)) => tracing::debug!(error = %e, "a warm-up cannot run"),
        }
    }

    /// Gives waiting requests an idle sequence, live first, as cells allow.
    fn place(&mut self) {
        self.waiting.sort_by_key(rank);
        let mut i = 0;
        while i < self.waiting.len() && self.running.len() < self.sequences {
            let s = &self.waiting[i];
            match self
                .cache
                .place(self.ctx, s.tenant.as_deref(), &s.tokens, s.need())
            {
                Some(placed) => {
                    let mut s = self.waiting.remove(i);
                    tracing::debug!(
                        rank = class_rank(&s),
                        warm = s.warm(),
                        seq = placed.seq,
                        reused = placed.reused,
                        tokens = s.tokens.len(),
                        "placed"
                    );
                    s.placed(placed.seq, placed.reused);
                    self.running.push(s);
                }
                None => i += 1,
            }
        }
    }

    /// Hands text to readers, gives up what was abandoned, and delivers what is over.
    fn tend(&mut self) {
        let requests_wait = self.waiting.iter().any(|s| !s.warm());
        let now = Instant::now();
        let counters = self.cache.counters.clone();
        for s in &mut self.running {
            let reader_gone = s.flush(now).is_err();
            if s.over() {
                // Its result is still delivered (with what it cost); its text has nobody left.
                if reader_gone {
                    s.drop_text();
                }
            } else if reader_gone || s.abandoned(requests_wait) {
                s.cancel(&counters);
            }
        }
        let mut i = 0;
        while i < self.running.len() {
            match self.running[i].take_result() {
                Some(result) => {
                    let s = self.running.swap_remove(i);
                    self.cache.release(s.seq);
                    s.deliver(result, &counters);
                }
                None => i += 1,
            }
        }
    }

    /// One evaluation for every sequence that has something to evaluate. False when none had.
    fn step(&mut self) -> bool {
        self.batch.clear();
        // (running index, batch entry of its logits or -1, tokens added)
        let mut parts: Vec<(usize, i32, Vec<LlamaToken>)> = Vec::new();
        for (i, s) in self.running.iter().enumerate() {
            if !s.writing() {
                continue;
            }
            let (from, tokens, outputs) =
                s.eval().expect("a writing sequence has tokens to evaluate");
            let at = self.batch.n_tokens();
            for (k, &t) in tokens.iter().enumerate() {
                let logits = k >= outputs;
                if let Err(e) = self
                    .batch
                    .add(t, (from + k) as i32, &[s.seq as i32], logits)
                {
                    tracing::error!(error = %e, "the batch is full");
                    break;
                }
            }
            parts.push((i, at, tokens.to_vec()));
        }
        let writers = parts.len();
        let live = self.running.iter().any(|s| class_rank(s) == 0 && !s.over());
        let calls_streaming = self.live_seen.is_some_and(|t| t.elapsed() < LIVE_RECENT);
        let mut room = if parts.is_empty() {
            let budget = if calls_streaming && !live {
                STEP_BESIDE_ANSWERS
            } else {
                STEP_ALONE
            };
            self.prompt_cost.chunk(budget, PROMPT_CHUNK)
        } else {
            self.prompt_cost
                .chunk(STEP_BESIDE_ANSWERS, self.shared_prefill)
        }
        .min(self.capacity.saturating_sub(self.batch.n_tokens() as usize));
        let mut readers: Vec<usize> = (0..self.running.len())
            .filter(|&i| self.running[i].reading())
            .collect();
        readers.sort_by_key(|&i| rank(&self.running[i]));
        let best_writer = parts
            .iter()
            .map(|(i, _, _)| class_rank(&self.running[*i]))
            .min();
        // A warm-up only saves later work, and every token read beside an answer delays that
        // answer's next one (on CPUs without matrix units, about in proportion): it reads
        // nothing while a request is served.
        let requests = self.running.iter().any(|s| !s.warm() && !s.over());
        for i in readers {
            if room == 0 {
                break;
            }
            let class = class_rank(&self.running[i]);
            let most = if (live && class > 0) || (class == 4 && requests) {
                0
            } else if class == 4 {
                self.prompt_cost.chunk(STEP_WARM_UP, WARM_CHUNK)
            } else if best_writer.is_some_and(|w| w < class) {
                YIELD_CHUNK
            } else {
                room
            };
            let seq = self.running[i].seq as i32;
            let Some((chunk, tokens)) = self.running[i].chunk(room.min(most)) else {
                continue;
            };
            let tokens = tokens.to_vec();
            let mut at = -1;
            for (k, &t) in tokens.iter().enumerate() {
                let last = chunk.last && k + 1 == tokens.len();
                if last {
                    at = self.batch.n_tokens();
                }
                if let Err(e) = self.batch.add(t, (chunk.from + k) as i32, &[seq], last) {
                    tracing::error!(error = %e, "the batch is full");
                    break;
                }
            }
            room -= tokens.len();
            parts.push((i, at, tokens));
        }
        if parts.is_empty() {
            return false;
        }
        let started = Instant::now();
        let decoded = self.ctx.decode(&mut self.batch);
        if writers == 0 {
            self.prompt_cost
                .observe(self.batch.n_tokens() as usize, started.elapsed());
        }
        match decoded {
            Ok(()) => {
                for (i, at, tokens) in parts {
                    let s = &mut self.running[i];
                    self.cache.decoded(s.seq, &tokens);
                    s.answered(self.decoder.model, self.ctx, self.cache, at);
                }
            }
            Err(e) => {
                // Nothing half-evaluated is ever reused: every sequence of the batch is
                // emptied and its request fails.
                tracing::error!(error = %e, sequences = parts.len(), "evaluation failed");
                for (i, _, _) in parts {
                    let seq = self.running[i].seq;
                    self.cache.forget(self.ctx, seq);
                    self.running[i].fail(engine(&e));
                }
            }
        }
        true
    }
}

/// How long the model waits for a reader of its deltas that takes none before it gives the
/// generation up: the model is shared, and a client that stopped reading must not hold it.
pub(super) const DELTA_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Text for one reader, in order, handed over as far as the reader takes it: a reader that
/// is slow holds back its own sequence, never the others'.
#[derive(Debug, Default)]
pub(super) struct Outbox {
    queue: std::collections::VecDeque<String>,
    /// Since when the reader has taken nothing while text waits.
    blocked_since: Option<Instant>,
}

impl Outbox {
    pub(super) fn push(&mut self, text: String) {
        self.queue.push_back(text);
    }

    pub(super) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    pub(super) fn clear(&mut self) {
        self.queue.clear();
    }

    /// Hands what waits to `tx` as far as it has room, at `now`. `Err` when the reader has
    /// gone, or has taken nothing for `wait` while text waited: the generation is given up.
    pub(super) fn flush(
        &mut self,
        tx: &tokio::sync::mpsc::Sender<String>,
        now: Instant,
        wait: std::time::Duration,
    ) -> Result<(), ()> {
        use tokio::sync::mpsc::error::TrySendError;
        while let Some(text) = self.queue.pop_front() {
            match tx.try_send(text) {
                Ok(()) => self.blocked_since = None,
                Err(TrySendError::Closed(_)) => return Err(()),
                Err(TrySendError::Full(back)) => {
                    self.queue.push_front(back);
                    let since = *self.blocked_since.get_or_insert(now);
                    if now.duration_since(since) >= wait {
                        tracing::warn!(
                            wait_s = wait.as_secs_f64(),
                            "a stream reader took no delta; generation stopped"
                        );
                        return Err(());
                    }
                    return Ok(());
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::fair::Class;
    use crate::llm::{Message, Role};
    use std::time::Duration;

    fn warm_up(tenant: Option<&str>, class: Class, transcript: &str) -> Generation {
        Generation::prompt_only(
            vec![
                Message::new(Role::System, "Classify the intent."),
                Message::new(Role::User, format!("Transcript:\n{transcript}")),
            ],
            tenant.map(str::to_owned),
            class,
        )
    }

    #[test]
    fn a_warm_up_is_superseded_only_by_the_same_calls_longer_transcript() {
        let line = "Customer: my router keeps dropping.\n";
        let two = format!("{line}Agent: let me check.\n");
        let earlier = warm_up(Some("org_a"), Class::Batch, line);
        assert!(superseded(
            &earlier,
            &warm_up(Some("org_a"), Class::Batch, &two)
        ));
        assert!(superseded(
            &earlier,
            &warm_up(Some("org_a"), Class::Batch, line)
        ));
        // Another organisation, another class, another transcript: both are kept.
        assert!(!superseded(
            &earlier,
            &warm_up(Some("org_b"), Class::Batch, &two)
        ));
        assert!(!superseded(
            &earlier,
            &warm_up(Some("org_a"), Class::Live, &two)
        ));
        assert!(!superseded(
            &warm_up(Some("org_a"), Class::Batch, &two),
            &earlier
        ));
        let mut other_prompt = warm_up(Some("org_a"), Class::Batch, &two);
        other_prompt.messages[0].content = "Summarise.".into();
        assert!(!superseded(&earlier, &other_prompt));
        // The service's own (no organisation) is not a call's.
        assert!(!superseded(
            &warm_up(None, Class::Batch, ""),
            &warm_up(Some("org_a"), Class::Batch, line)
        ));
    }

    #[test]
    fn a_step_reads_as_many_prompt_tokens_as_fit_its_time_on_this_cpu() {
        let ms = Duration::from_millis;
        let mut cost = PromptCost::new();
        // Until measured, 100 tokens a second.
        assert_eq!(cost.chunk(STEP_WARM_UP, WARM_CHUNK), 30);
        assert_eq!(cost.chunk(STEP_ALONE, PROMPT_CHUNK), 100);
        // Two AVX2 cores: 48 tokens in 1.4 s.
        for _ in 0..20 {
            cost.observe(48, ms(1400));
        }
        assert_eq!(cost.chunk(STEP_WARM_UP, WARM_CHUNK), 10);
        assert_eq!(cost.chunk(STEP_ALONE, PROMPT_CHUNK), 34);
        assert_eq!(cost.chunk(STEP_BESIDE_ANSWERS, 128), 17);
        // A step of a few tokens teaches nothing (an answer's step, not a prompt's cost).
        cost.observe(2, Duration::from_secs(5));
        assert_eq!(cost.chunk(STEP_ALONE, PROMPT_CHUNK), 34);
        // A fast CPU: 512 tokens in 0.4 s; each kind capped at its own most.
        for _ in 0..20 {
            cost.observe(512, ms(400));
        }
        assert_eq!(cost.chunk(STEP_WARM_UP, WARM_CHUNK), WARM_CHUNK);
        assert_eq!(cost.chunk(STEP_ALONE, PROMPT_CHUNK), PROMPT_CHUNK);
        assert_eq!(cost.chunk(STEP_BESIDE_ANSWERS, 128), 128);
        // Never below a few tokens, however slow.
        for _ in 0..20 {
            cost.observe(10, Duration::from_secs(60));
        }
        assert_eq!(cost.chunk(STEP_WARM_UP, WARM_CHUNK), 8);
    }

    #[test]
    fn a_slow_reader_holds_its_text_in_order_and_a_stalled_or_gone_one_ends_it() {
        let t0 = Instant::now();
        let secs = |s: u64| t0 + Duration::from_secs(s);
        let wait = Duration::from_secs(10);
        let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(1);
        let mut outbox = Outbox::default();
        for piece in ["a", "b", "c"] {
            outbox.push(piece.into());
        }
        // Room for one: the rest waits, in order.
        outbox.flush(&tx, secs(0), wait).unwrap();
        assert!(!outbox.is_empty());
        assert_eq!(rx.try_recv().unwrap(), "a");
        outbox.flush(&tx, secs(1), wait).unwrap();
        // The reader takes nothing more: within the wait, counted from when "c" first found
        // no room (1 s), the text stays; past it, the generation ends.
        outbox.flush(&tx, secs(5), wait).unwrap();
        outbox.flush(&tx, secs(10), wait).unwrap();
        assert!(outbox.flush(&tx, secs(11), wait).is_err());
        assert_eq!(rx.try_recv().unwrap(), "b");
        // A reader that takes something starts the wait again.
        let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(1);
        let mut outbox = Outbox::default();
        outbox.push("x".into());
        outbox.push("y".into());
        outbox.flush(&tx, secs(0), wait).unwrap();
        assert_eq!(rx.try_recv().unwrap(), "x");
        outbox.flush(&tx, secs(9), wait).unwrap();
        outbox.push("z".into());
        outbox.flush(&tx, secs(9), wait).unwrap();
        outbox.flush(&tx, secs(15), wait).unwrap();
        assert_eq!(rx.try_recv().unwrap(), "y");
        // A reader that has gone ends it at once.
        drop(rx);
        assert!(outbox.flush(&tx, secs(16), wait).is_err());
    }
}
