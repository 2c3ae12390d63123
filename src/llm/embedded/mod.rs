//! The embedded model: llama.cpp through `llama-cpp-2`, running a GGUF chat model (Qwen2.5
//! Instruct by default) with the chat template stored in the file.
//!
//! One dedicated thread owns the model and its context and serves several requests side by
//! side, each on a sequence of the context: every step, one evaluation carries the next token
//! of each answer being written and a chunk of the prompts being read (continuous batching,
//! `worker.rs`). Requests wait in a bounded queue in front of it; a request that finds the
//! queue full fails at once with [`LlmError::Busy`] instead of waiting without bound. Which
//! organisation's request goes next is decided before that queue, by the fair queue
//! ([`crate::llm::fair`]).
//!
//! Tool use follows the format Qwen2.5 was trained on: tools are described in the system
//! message inside `<tools>` tags, the model answers a call as `<tool_call>{json}</tool_call>`,
//! and results go back as `<tool_response>` user turns. While the model's text could still be
//! the start of a tool call or of a stop string it is held back, so a client never sees markup.
//!
//! Evaluated prompts are reused ([`PrefixCache`]): a request evaluates only the tokens after
//! the longest prefix it shares with the prompt in the context or with a kept snapshot of an
//! earlier one. A profile's system prompt is the same for every transcript, a live call's
//! transcript grows at its end, and a chat gains a turn at a time.
//!
//! The model is stopped before the process exits ([`Provider::stop`], and on drop): the
//! thread gives up what it evaluates at its next chunk or token and frees the engine. A
//! llama.cpp thread still decoding when the process exits crashes it, as the exit tears
//! down the engine's static state under that thread.

use parking_lot::Mutex;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};
use tokio::sync::oneshot;

use super::{Completion, Deltas, Generation, LlmError, Message, Provider};

mod backend;
mod draft;
mod forced;
mod gate;
mod lead;
mod picker;
mod prefix_cache;
mod prompt;
mod sequence;
mod steps;
mod worker;

pub use backend::cpu_backend;
pub use gate::{split_tool_calls, StreamGate};
pub use prefix_cache::PrefixCache;
// The parts of one engine, each in its own file, see one another through this module.
#[allow(unused_imports)]
use self::{
    backend::*, draft::*, forced::*, gate::*, lead::*, picker::*, prefix_cache::*, prompt::*,
    sequence::*, steps::*, worker::*,
};

const TOOL_OPEN: &str = "<tool_call>";
const TOOL_CLOSE: &str = "</tool_call>";
/// Prompt tokens decoded per llama.cpp call.
const PROMPT_CHUNK: usize = 512;
/// Prompt tokens decoded per llama.cpp call by a warm-up: smaller, as a warm-up in progress
/// finishes its chunk before it yields to a request or to the model stopping.
const WARM_CHUNK: usize = 128;

/// Settings of the embedded model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbeddedConfig {
    /// CPU threads for one generation.
    pub threads: u32,
    /// Context window of one request in tokens (prompt + answer).
    pub context_tokens: u32,
    /// Requests served side by side (the context's sequences).
    pub sequences: usize,
    /// Memory of the attention cache, shared by the sequences, bytes: how many tokens of
    /// prompts and answers the running requests may hold in all (at least one request's window,
    /// at most every sequence's).
    pub kv_cache_bytes: usize,
    /// Requests that may wait for the model besides those running.
    pub queue: usize,
    /// Snapshots of evaluated prompts kept besides the context's own.
    pub prefix_cache_entries: usize,
    /// Memory the snapshots may take, bytes.
    pub prefix_cache_bytes: usize,
    /// llama.cpp's fused attention kernel; off, attention runs as separate matrix products,
    /// which on two AVX2 cores generates about 25% faster (docs/benchmarks.md).
    pub flash_attention: bool,
    /// Prompt tokens evaluated in one pass (llama.cpp's `n_ubatch`, at most [`PROMPT_CHUNK`]):
    /// attention's score matrices grow with it, the passes over the weights shrink.
    pub micro_batch: u32,
    /// Most tokens drafted ahead of a structured answer (see [`draft`]) and checked in one
    /// batch with the token they follow; 0 drafts none. `None`: [`AMX_DRAFT_TOKENS`] where the
    /// CPU module loaded has AMX, where checking several tokens costs about what one does,
    /// and none elsewhere, where each costs nearly a token's own evaluation (docs/benchmarks.md).
    pub draft_tokens: Option<u32>,
    /// Whether the text a schema forces in the middle of an answer is added without the
    /// model writing it (see [`forced_text`]).
    pub force_schema_text: bool,
    /// The type of the attention keys kept per evaluated token. With `q8_0` the scores
    /// (keys x queries) are 8-bit integer products, which CPUs with VNNI do several times
    /// faster than llama.cpp's f16 products in f32; the values stay f16 (llama.cpp quantizes
    /// them only under flash attention). `None`: q8_0.
    pub key_cache: Option<crate::config::KeyCache>,
    /// llama.cpp's repacking of weights into interleaved rows at load (its `CPU_REPACK`
    /// buffers); off, the weights stay as in the file and batches go to llama.cpp's tiled
    /// K-quant products instead.
    pub repack_weights: bool,
}

/// Tokens drafted by default where the CPU module loaded has AMX.
pub const AMX_DRAFT_TOKENS: u32 = 8;

struct Job {
    generation: Generation,
    deltas: Deltas,
    /// Where the result goes; `None` for a warm-up, whose result nobody waits for.
    done: Option<oneshot::Sender<Result<Completion, LlmError>>>,
}

/// Warm-ups that may wait for the model; past that they are dropped (a warm-up only saves
/// later work, and the next one for the same conversation covers what a dropped one would).
const WARM_QUEUE: usize = 64;

/// How long dropping the model waits for its thread to stop (a decode in progress finishes
/// its chunk of [`PROMPT_CHUNK`] tokens first).
const DROP_WAIT: Duration = Duration::from_secs(10);

/// The embedded llama.cpp model behind its queue.
pub struct EmbeddedLlm {
    /// Taken when the model stops: a request then fails at once, one queued before is
    /// answered, never left waiting, and the thread, if it waits for work, wakes up.
    jobs: Mutex<Option<Sender<Job>>>,
    warm: Sender<Generation>,
    name: String,
    stats: Arc<Counters>,
    /// Set when the model stops: work in progress gives up at its next chunk or token.
    stopping: Arc<AtomicBool>,
    /// Disconnected once the thread has freed the engine and ended.
    ended: Receiver<()>,
}

/// Prompt tokens the model evaluated and reused from earlier prompts, since it was loaded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PromptStats {
    /// Tokens evaluated.
    pub evaluated: u64,
    /// Tokens found already evaluated (in the context or a kept snapshot).
    pub reused: u64,
    /// Warm-ups evaluated to their end (a warm-up yields to a request that arrives).
    pub warmed: u64,
    /// Tokens drafted ahead of structured answers and checked.
    pub drafted: u64,
    /// Drafted tokens the model confirmed: each one a token evaluation saved.
    pub confirmed: u64,
}

#[derive(Default)]
struct Counters {
    evaluated: AtomicU64,
    reused: AtomicU64,
    warmed: AtomicU64,
    drafted: AtomicU64,
    confirmed: AtomicU64,
}

impl std::fmt::Debug for EmbeddedLlm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedLlm")
            .field("name", &self.name)
            .finish()
    }
}

impl EmbeddedLlm {
    /// Loads the GGUF at `path` on a new thread and returns once it is ready.
    pub fn load(path: &Path, config: EmbeddedConfig) -> Result<Self, LlmError> {
        let name = format!(
            "embedded:{}",
            path.file_name()
                .map_or_else(|| "model".into(), |n| n.to_string_lossy())
        );
        let (jobs, rx) = bounded::<Job>(config.queue.max(1) + config.sequences.max(1));
        let (warm, warm_rx) = bounded::<Generation>(WARM_QUEUE);
        let (ready_tx, ready_rx) = bounded::<Result<(), LlmError>>(1);
        let path = path.to_owned();
        let stats = Arc::new(Counters::default());
        let counters = stats.clone();
        let stopping = Arc::new(AtomicBool::new(false));
        let quit = stopping.clone();
        let (ending, ended) = bounded::<()>(0);
        std::thread::Builder::new()
            .name("llm".into())
            .spawn(move || {
                // Dropped last, once the worker has freed the engine and the queues are gone.
                let _ending = ending;
                let (rx, warm_rx, quit) = (rx, warm_rx, quit);
                worker(&path, &config, &rx, &warm_rx, &quit, &ready_tx, counters);
            })
            .map_err(|e| LlmError::Engine(format!("cannot start the model thread: {e}")))?;
        ready_rx
            .recv()
            .map_err(|_| LlmError::Engine("the model thread died while loading".into()))??;
        Ok(Self {
            jobs: Mutex::new(Some(jobs)),
            warm,
            name,
            stats,
            stopping,
            ended,
        })
    }

    /// Prompt tokens evaluated and reused so far.
    pub fn prompt_stats(&self) -> PromptStats {
        PromptStats {
            evaluated: self.stats.evaluated.load(Ordering::Relaxed),
            reused: self.stats.reused.load(Ordering::Relaxed),
            warmed: self.stats.warmed.load(Ordering::Relaxed),
            drafted: self.stats.drafted.load(Ordering::Relaxed),
            confirmed: self.stats.confirmed.load(Ordering::Relaxed),
        }
    }

    /// Evaluates the prompt of `messages` in the background, so that a request starting the
    /// same way (an analysis profile's prompt, a live call's transcript so far) finds it
    /// evaluated. Warm-ups take the model only while no request waits, and are dropped when
    /// [`WARM_QUEUE`] of them wait already. One of the live class is a live call's transcript
    /// kept ready for its next `analyze`, and is read as live work (before chats and files).
    /// An organisation's of another class (a call's transcript kept ready before the call has
    /// asked) is read after chats and before files' prompts; the service's own (at start)
    /// only while no request is served.
    pub fn warm(&self, messages: Vec<Message>, tenant: Option<String>, class: super::fair::Class) {
        let _ = self
            .warm
            .try_send(Generation::prompt_only(messages, tenant, class));
    }
}

#[async_trait::async_trait]
impl Provider for EmbeddedLlm {
    async fn generate(
        &self,
        generation: Generation,
        deltas: Deltas,
    ) -> Result<Completion, LlmError> {
        let (done, result) = oneshot::channel();
        let job = Job {
            generation,
            deltas,
            done: Some(done),
        };
        let sent = match self.jobs.lock().as_ref() {
            Some(jobs) => jobs.try_send(job),
            None => Err(TrySendError::Disconnected(job)),
        };
        match sent {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => return Err(LlmError::Busy),
            Err(TrySendError::Disconnected(_)) => {
                return Err(LlmError::Engine("the model thread stopped".into()))
            }
        }
        result
            .await
            .map_err(|_| LlmError::Engine("the model thread dropped the request".into()))?
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn keeps_to_any_schema(&self) -> bool {
        true
    }

    fn gives_odds(&self) -> bool {
        true
    }

    fn prefill(&self, messages: Vec<Message>, tenant: Option<String>, class: super::fair::Class) {
        self.warm(messages, tenant, class);
    }

    fn stop(&self, within: Duration) -> bool {
        self.stopping.store(true, Ordering::SeqCst);
        self.jobs.lock().take();
        // Nothing is ever sent: the receive ends when the thread drops its sender.
        !matches!(
            self.ended.recv_timeout(within),
            Err(crossbeam_channel::RecvTimeoutError::Timeout)
        )
    }
}

impl Drop for EmbeddedLlm {
    fn drop(&mut self) {
        if !self.stop(DROP_WAIT) {
            tracing::warn!("the model thread did not stop in time");
        }
    }
}

fn engine(e: impl std::fmt::Display) -> LlmError {
    LlmError::Engine(e.to_string())
}
