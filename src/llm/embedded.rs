//! The embedded model: llama.cpp through `llama-cpp-2`, running a GGUF chat model (Qwen2.5
//! Instruct by default) with the chat template stored in the file.
//!
//! One dedicated thread owns the model and its context and runs one generation at a time;
//! requests wait in a bounded queue in front of it. A request that finds the queue full fails
//! at once with [`LlmError::Busy`] instead of waiting without bound.
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
use std::collections::VecDeque;
use std::num::NonZeroU32;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};
use llama_cpp_2::context::params::{KvCacheType, LlamaContextParams};
use llama_cpp_2::context::session::{LlamaStateSeqFlags, SeqState};
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::{LlamaChatMessage, LlamaChatTemplate, LlamaModel};
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::data::LlamaTokenData;
use llama_cpp_2::token::data_array::LlamaTokenDataArray;
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::vocab::LlamaVocab;
use tokio::sync::oneshot;

use super::{
    Completion, Deltas, FinishReason, Generation, LlmError, Message, Provider, Role, ToolCall,
    Usage,
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
    /// Context window in tokens (prompt + answer).
    pub context_tokens: u32,
    /// Requests that may wait for the model.
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
        let (jobs, rx) = bounded::<Job>(config.queue.max(1));
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
    /// [`WARM_QUEUE`] of them wait already.
    pub fn warm(&self, messages: Vec<Message>) {
        let _ = self.warm.try_send(Generation {
            messages,
            tools: Vec::new(),
            sampling: super::Sampling {
                max_tokens: 0,
                ..super::Sampling::default()
            },
            json_schema: None,
            response_format: None,
            odds: None,
        });
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

    fn prefill(&self, messages: Vec<Message>) {
        self.warm(messages);
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

/// The next piece of work: a request whenever one waits, else a warm-up; `None` once the
/// model stops (`quit` is set, and the request queue has no sender left).
fn next_job(jobs: &Receiver<Job>, warm: &Receiver<Generation>, quit: &AtomicBool) -> Option<Job> {
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

fn worker(
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
    let params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(config.context_tokens))
        .with_n_batch(PROMPT_CHUNK as u32)
        .with_n_ubatch(config.micro_batch.clamp(1, PROMPT_CHUNK as u32))
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
    let _ = ready.send(Ok(()));
    let mut cache = PrefixCache::new(
        config.prefix_cache_entries,
        config.prefix_cache_bytes,
        counters,
    );
    while let Some(Job {
        generation,
        deltas,
        done,
    }) = next_job(jobs, warm, quit)
    {
        // A requester that has gone (a REST client that hung up) gets no model time.
        if done.as_ref().is_some_and(oneshot::Sender::is_closed) {
            continue;
        }
        // A request is given up when its requester has gone; a warm-up yields as soon as a
        // request waits (what it evaluated so far stays in the context for reuse); both
        // when the model stops.
        let abandoned = || {
            quit.load(Ordering::SeqCst)
                || match &done {
                    Some(done) => done.is_closed(),
                    None => !jobs.is_empty(),
                }
        };
        let result = generate(
            &Decoder {
                model: &model,
                template: &template,
                draft_tokens: draft,
            },
            &mut ctx,
            &mut cache,
            generation,
            deltas.as_ref(),
            &abandoned,
        );
        match done {
            Some(done) => {
                let _ = done.send(result);
            }
            None => match result {
                Err(LlmError::Cancelled { .. }) => {
                    tracing::debug!("a warm-up yielded to a request");
                }
                // A live call longer than the window: its analyses shorten the transcript.
                Err(e @ LlmError::ContextOverflow { .. }) => {
                    tracing::debug!(error = %e, "a warm-up does not fit the window");
                }
                Err(e) => tracing::warn!(error = %e, "warming the model up failed"),
                Ok(_) => {
                    cache.counters.warmed.fetch_add(1, Ordering::Relaxed);
                }
            },
        }
    }
    // Stopped: requests still queued are answered, not left waiting.
    while let Ok(job) = jobs.try_recv() {
        if let Some(done) = job.done {
            let _ = done.send(Err(LlmError::Engine("the model thread stopped".into())));
        }
    }
}

/// How long the model waits for a reader of its deltas that takes none before it gives the
/// generation up: the model is shared, and a client that stopped reading must not hold it.
const DELTA_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Text of the answer, past the gate: added to `answer` (white space aside) when odds are
/// taken, and streamed as far as the gate lets it. Whether a stop string ended the answer.
fn shown(
    text: &str,
    answer: Option<&mut String>,
    gate: &mut StreamGate,
    deltas: Option<&tokio::sync::mpsc::Sender<String>>,
) -> Result<bool, LlmError> {
    if let Some(answer) = answer {
        answer.extend(text.chars().filter(|c| !c.is_whitespace()));
    }
    let (emit, stopped) = gate.push(text);
    if !emit.is_empty() {
        if let Some(tx) = deltas {
            send_delta(tx, emit)?;
        }
    }
    Ok(stopped)
}

/// Hands a delta to its reader, waiting at most [`DELTA_WAIT`] for room; a reader that has
/// gone or stalls cancels the generation.
fn send_delta(tx: &tokio::sync::mpsc::Sender<String>, text: String) -> Result<(), LlmError> {
    send_within(tx, text, DELTA_WAIT)
}

fn send_within(
    tx: &tokio::sync::mpsc::Sender<String>,
    text: String,
    wait: std::time::Duration,
) -> Result<(), LlmError> {
    use tokio::sync::mpsc::error::TrySendError;
    let deadline = std::time::Instant::now() + wait;
    let mut text = text;
    loop {
        match tx.try_send(text) {
            Ok(()) => return Ok(()),
            Err(TrySendError::Closed(_)) => {
                return Err(LlmError::Cancelled {
                    usage: Usage::default(),
                })
            }
            Err(TrySendError::Full(back)) => {
                if std::time::Instant::now() >= deadline {
                    tracing::warn!(
                        wait_s = wait.as_secs_f64(),
                        "a stream reader took no delta; generation stopped"
                    );
                    return Err(LlmError::Cancelled {
                        usage: Usage::default(),
                    });
                }
                text = back;
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
    }
}

/// Loads llama.cpp's CPU backend, once per process, before the engine starts: the module built
/// for the best instruction set this CPU has (AMX, AVX-512 VNNI, AVX-512, AVX2...), as its own
/// `ggml_backend_score` rates it. Modules are looked for next to the executable, then in
/// `../lib/callstream` from it (`scripts/install.sh`), then in the directory the build put
/// them in; never in the working directory.
/// Returns the features of the module loaded, such as `AVX512 = 1`.
pub fn cpu_backend() -> Result<&'static str, LlmError> {
    static LOADED: std::sync::OnceLock<Result<String, String>> = std::sync::OnceLock::new();
    LOADED
        .get_or_init(load_cpu_backend)
        .as_deref()
        .map_err(|e| LlmError::Engine(e.clone()))
}

fn load_cpu_backend() -> Result<String, String> {
    unsafe extern "C" fn quiet(
        _level: llama_cpp_sys_2::ggml_log_level,
        _text: *const std::ffi::c_char,
        _user_data: *mut std::ffi::c_void,
    ) {
    }
    // SAFETY: a callback that does nothing; llama.cpp would log each load to stderr.
    unsafe { llama_cpp_sys_2::llama_log_set(Some(quiet), std::ptr::null_mut()) };
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf));
    let installed = beside.as_ref().map(|dir| dir.join("../lib/callstream"));
    let dirs: Vec<std::path::PathBuf> = beside
        .into_iter()
        .chain(installed)
        .chain(llama_cpp_sys_2::BACKENDS_DIR.map(Into::into))
        .collect();
    let Some(module) = dirs.iter().find_map(|dir| best_cpu_module(dir)) else {
        let dirs: Vec<_> = dirs.iter().map(|d| d.display().to_string()).collect();
        return Err(format!(
            "no llama.cpp CPU module for this CPU in {}",
            dirs.join(" or ")
        ));
    };
    let path = c_path(&module).ok_or_else(|| format!("bad path {}", module.display()))?;
    // SAFETY: a NUL-terminated path; the registry lookups take NUL-terminated names, and the
    // features array the CPU backend returns is static and ends with a null name.
    let features = unsafe {
        let reg = llama_cpp_sys_2::ggml_backend_load(path.as_ptr());
        if reg.is_null() {
            return Err(format!("cannot load {}", module.display()));
        }
        let get = llama_cpp_sys_2::ggml_backend_reg_get_proc_address(
            reg,
            c"ggml_backend_get_features".as_ptr(),
        );
        let get = std::mem::transmute::<
            *mut std::ffi::c_void,
            llama_cpp_sys_2::ggml_backend_get_features_t,
        >(get);
        let mut features = Vec::new();
        if let Some(get) = get {
            let mut feature = get(reg);
            while !feature.is_null() && !(*feature).name.is_null() {
                let name = std::ffi::CStr::from_ptr((*feature).name).to_string_lossy();
                let value = std::ffi::CStr::from_ptr((*feature).value).to_string_lossy();
                features.push(format!("{name} = {value}"));
                feature = feature.add(1);
            }
        }
        features.join(", ")
    };
    tracing::info!(module = %module.display(), %features, "llama.cpp CPU backend loaded");
    Ok(features)
}

/// The CPU module in `dir` (`libggml-cpu-<level>.so`) its own score rates highest
/// on this CPU; a module that cannot run here rates 0 and is not a candidate.
fn best_cpu_module(dir: &Path) -> Option<std::path::PathBuf> {
    let mut best: Option<(i32, std::path::PathBuf)> = None;
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if !name.starts_with("libggml-cpu-") || !name.ends_with(".so") {
            continue;
        }
        let path = entry.path();
        let Some(c) = c_path(&path) else { continue };
        // SAFETY: the module is opened only to call its `int ggml_backend_score(void)`, which
        // reads CPUID (llama.cpp's own loader does the same), then closed.
        let score = unsafe {
            let handle = libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
            if handle.is_null() {
                continue;
            }
            let score = libc::dlsym(handle, c"ggml_backend_score".as_ptr());
            let score = if score.is_null() {
                0
            } else {
                let score: extern "C" fn() -> std::ffi::c_int = std::mem::transmute(score);
                score()
            };
            libc::dlclose(handle);
            score
        };
        if score > 0 && best.as_ref().is_none_or(|(s, _)| score > *s) {
            best = Some((score, path));
        }
    }
    best.map(|(_, path)| path)
}

fn c_path(path: &Path) -> Option<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(path.as_os_str().as_bytes()).ok()
}

fn engine(e: impl std::fmt::Display) -> LlmError {
    LlmError::Engine(e.to_string())
}

/// The tools section Qwen2.5's chat template appends to the system message.
fn tools_section(tools: &[super::ToolSpec]) -> String {
    let mut s = String::from(
        "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    );
    for t in tools {
        let spec = serde_json::json!({"type": "function", "function": {
            "name": t.name, "description": t.description, "parameters": t.parameters}});
        s.push('\n');
        s.push_str(&spec.to_string());
    }
    s.push_str(
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments \
         within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \
         \"arguments\": <args-json-object>}\n</tool_call>",
    );
    s
}

/// The conversation as chat-template messages.
fn render(
    messages: &[Message],
    tools: &[super::ToolSpec],
) -> Result<Vec<LlamaChatMessage>, LlmError> {
    let mut out = Vec::with_capacity(messages.len() + 1);
    let mut system_done = false;
    for m in messages {
        let (role, content) = match m.role {
            Role::System if !system_done => {
                system_done = true;
                let mut content = m.content.clone();
                if !tools.is_empty() {
                    content.push_str(&tools_section(tools));
                }
                ("system", content)
            }
            Role::System => ("system", m.content.clone()),
            Role::User => ("user", m.content.clone()),
            Role::Assistant => {
                let mut content = m.content.clone();
                for call in &m.tool_calls {
                    let json = serde_json::json!({"name": call.name, "arguments": call.arguments});
                    content.push_str(&format!("\n{TOOL_OPEN}\n{json}\n{TOOL_CLOSE}"));
                }
                ("assistant", content)
            }
            Role::Tool => (
                "user",
                format!("<tool_response>\n{}\n</tool_response>", m.content),
            ),
        };
        out.push(LlamaChatMessage::new(role.into(), content).map_err(engine)?);
    }
    if !system_done && !tools.is_empty() {
        let content = format!("You are a helpful assistant.{}", tools_section(tools));
        out.insert(
            0,
            LlamaChatMessage::new("system".into(), content).map_err(engine)?,
        );
    }
    Ok(out)
}

/// The loaded model and how it decodes.
struct Decoder<'m> {
    model: &'m LlamaModel,
    template: &'m LlamaChatTemplate,
    /// Most tokens drafted ahead of a structured answer ([`EmbeddedConfig::draft_tokens`]).
    draft_tokens: usize,
}

fn generate(
    decoder: &Decoder<'_>,
    ctx: &mut LlamaContext<'_>,
    cache: &mut PrefixCache,
    generation: Generation,
    deltas: Option<&tokio::sync::mpsc::Sender<String>>,
    abandoned: &dyn Fn() -> bool,
) -> Result<Completion, LlmError> {
    let Decoder {
        model,
        template,
        draft_tokens,
    } = *decoder;
    let chat = render(&generation.messages, &generation.tools)?;
    let prompt = model
        .apply_chat_template(template, &chat, true)
        .map_err(engine)?;
    let vocab = model.vocab();
    let tokens = vocab.tokenize(prompt.as_bytes(), true, true);
    let limit = ctx.n_ctx() as usize;
    // A structured answer cut short by the window would not parse: it needs room for all of
    // `max_tokens`. Other answers may stop at the window's end (finish reason `length`).
    let room = if generation.json_schema.is_some() {
        generation.sampling.max_tokens as usize
    } else {
        1
    };
    if tokens.len() + room.max(1) >= limit {
        return Err(LlmError::ContextOverflow {
            prompt: tokens.len(),
            limit,
        });
    }
    // Before the prompt: a schema the grammar cannot hold costs the model nothing.
    let mut picker = Picker::new(model, &generation)?;
    // The start every answer to the schema has is read with the prompt, not written a token
    // at a time.
    let prompt_len = tokens.len();
    let mut tokens = tokens;
    let lead = match &generation.json_schema {
        Some(schema) if generation.sampling.max_tokens > 0 => lead_tokens(
            model,
            &generation,
            schema,
            &mut picker,
            limit - prompt_len - 1,
        )?,
        _ => Vec::new(),
    };
    // Read with the prompt, it counts as prompt (it leaves `max_tokens` for the rest: fewer).
    tokens.extend_from_slice(&lead);
    let max_new =
        (generation.sampling.max_tokens as usize).min(limit - prompt_len - 1) - lead.len();

    let started = std::time::Instant::now();
    let reused = cache.prepare(ctx, &tokens);
    let step = if generation.sampling.max_tokens == 0 {
        WARM_CHUNK
    } else {
        PROMPT_CHUNK
    };
    let mut batch = LlamaBatch::new(PROMPT_CHUNK, 1);
    for (chunk_index, chunk) in tokens[reused..].chunks(step).enumerate() {
        let base = reused + chunk_index * step;
        if chunk_index > 0 && abandoned() {
            // Counted as evaluated when the prompt was prepared; the rest never was.
            cache
                .counters
                .evaluated
                .fetch_sub((tokens.len() - base) as u64, Ordering::Relaxed);
            return Err(spent(
                LlmError::Cancelled {
                    usage: Usage::default(),
                },
                tokens.len(),
                0,
            ));
        }
        batch.clear();
        for (i, &t) in chunk.iter().enumerate() {
            let last = base + i == tokens.len() - 1;
            batch
                .add(t, (base + i) as i32, &[0], last)
                .map_err(engine)?;
        }
        cache.decode(ctx, &mut batch, chunk)?;
    }
    tracing::debug!(
        prompt = prompt_len,
        lead = lead.len(),
        reused,
        kept = cache.saved.len(),
        kept_mib = cache.bytes >> 20,
        ms = started.elapsed().as_millis() as u64,
        "prompt evaluated"
    );

    let s = &generation.sampling;

    let markers: &[&str] = if generation.tools.is_empty() {
        &[]
    } else {
        &[TOOL_OPEN]
    };
    let mut gate = StreamGate::new(&s.stop, markers);
    let mut pending = Vec::new();
    let mut produced = 0usize;
    let mut finish = FinishReason::Length;
    let mut pos = tokens.len() as i32;
    // The answer so far without its white space, and the odds taken in it, when odds are
    // asked for.
    let mut answer = String::new();
    let mut odds = Vec::new();
    // A stop string within the answer's start (a client's schema and stop strings) ends the
    // answer there, as one the model wrote would.
    let mut stopped_in_lead = false;
    let weighed = generation.odds.is_some();
    if !lead.is_empty() {
        for &token in &lead {
            pending.extend(vocab.token_to_piece(token, false, None));
        }
        let text = take_utf8(&mut pending);
        if shown(&text, weighed.then_some(&mut answer), &mut gate, deltas)
            .map_err(|e| spent(e, tokens.len(), produced))?
        {
            finish = FinishReason::Stop;
            stopped_in_lead = true;
        }
    }
    // Drafting: only greedy decoding under a grammar, whose every token is the model's own
    // best, checks a draft by picking as usual from each drafted token's logits.
    let drafting = draft_tokens > 0 && matches!(picker, Picker::GreedyGrammar(_));
    // The prompt and the answer so far, where drafts are looked up.
    let mut seen: Vec<LlamaToken> = if drafting { tokens.clone() } else { Vec::new() };
    // Batch entry whose logits give the next token, and the drafted tokens evaluated after
    // it (in the context at `pos` on), not yet confirmed.
    let mut at = batch.n_tokens() - 1;
    let mut drafted: VecDeque<LlamaToken> = VecDeque::new();
    let (mut checked, mut confirmed, mut evaluations) = (0usize, 0usize, 0usize);
    while !stopped_in_lead && produced < max_new {
        if abandoned() {
            return Err(spent(
                LlmError::Cancelled {
                    usage: Usage::default(),
                },
                tokens.len(),
                produced,
            ));
        }
        // At a point where words are weighed, the first token of the likeliest word other than
        // one the model gave less than its floor, to be written instead of the model's pick.
        let mut instead = None;
        if let Some(wanted) = &generation.odds {
            if !wanted.after.is_empty() && answer.ends_with(&wanted.after) {
                if let Some(weighed) = picker.weigh(ctx, at, &vocab, &wanted.words) {
                    instead = wanted
                        .floor
                        .filter(|&(word, least)| weighed.odds.get(word).is_some_and(|p| *p < least))
                        .and_then(|(word, _)| weighed.first_other_than(word));
                    odds.push(weighed.odds);
                    if wanted.only {
                        finish = FinishReason::Stop;
                        break;
                    }
                }
            }
        }
        let token = match instead {
            Some(token) => picker.accept(token),
            None => picker.pick(ctx, at),
        };
        if vocab.is_eog(token) {
            finish = FinishReason::Stop;
            break;
        }
        produced += 1;
        pending.extend(vocab.token_to_piece(token, false, None));
        let text = take_utf8(&mut pending);
        if shown(&text, weighed.then_some(&mut answer), &mut gate, deltas)
            .map_err(|e| spent(e, tokens.len(), produced))?
        {
            finish = FinishReason::Stop;
            break;
        }
        if drafting {
            seen.push(token);
        }
        // The draft's next token is this one: already evaluated, its logits come next.
        if drafted.front() == Some(&token) {
            drafted.pop_front();
            confirmed += 1;
            at += 1;
            pos += 1;
            continue;
        }
        if !drafted.is_empty() {
            cache.truncate(ctx, pos as usize)?;
            drafted.clear();
        }
        let ahead = if drafting {
            draft(&seen, draft_tokens.min(max_new - produced))
        } else {
            Vec::new()
        };
        checked += ahead.len();
        evaluations += 1;
        batch.clear();
        batch.add(token, pos, &[0], true).map_err(engine)?;
        for (i, &t) in ahead.iter().enumerate() {
            batch
                .add(t, pos + 1 + i as i32, &[0], true)
                .map_err(engine)?;
        }
        let mut added = vec![token];
        added.extend_from_slice(&ahead);
        cache.decode(ctx, &mut batch, &added)?;
        pos += 1;
        at = 0;
        drafted = ahead.into();
    }
    // Drafted tokens past the answer's end are not part of what the context holds.
    if !drafted.is_empty() {
        cache.truncate(ctx, pos as usize)?;
    }
    if drafting {
        let counters = &cache.counters;
        counters
            .drafted
            .fetch_add(checked as u64, Ordering::Relaxed);
        counters
            .confirmed
            .fetch_add(confirmed as u64, Ordering::Relaxed);
        tracing::debug!(
            drafted = checked,
            confirmed,
            evaluations,
            "drafted tokens checked"
        );
    }
    tracing::debug!(
        produced,
        ms = started.elapsed().as_millis() as u64,
        "generation done"
    );
    let tail = gate.finish();
    if !tail.is_empty() {
        if let Some(tx) = deltas {
            send_delta(tx, tail).map_err(|e| spent(e, tokens.len(), produced))?;
        }
    }
    let (text, tool_calls) = split_tool_calls(gate.text());
    if !tool_calls.is_empty() {
        finish = FinishReason::ToolCalls;
    }
    Ok(Completion {
        text,
        odds,
        tool_calls,
        usage: Usage {
            prompt_tokens: tokens.len() as u64,
            completion_tokens: produced as u64,
            total_tokens: (tokens.len() + produced) as u64,
        },
        finish,
    })
}

/// The text every answer to `schema` starts with, written compactly: an object's first
/// property when it is required (the grammar keeps the schema's order of properties), then
/// the start of its value, into objects, arrays that cannot be empty, and strings (and enums
/// of strings) up to their opening quote; of `anyOf` branches, what all their starts share.
/// It ends where the schema leaves the answer open (an optional first property, a number, a
/// `$ref`...).
fn lead_text(schema: &serde_json::Value) -> String {
    lead_within(schema, 16)
}

/// [`lead_text`] at most `depth` levels down.
fn lead_within(schema: &serde_json::Value, depth: usize) -> String {
    let mut out = String::new();
    let mut at = schema;
    for _ in 0..depth {
        if let Some(branches) = at.get("anyOf").and_then(serde_json::Value::as_array) {
            let leads: Vec<Vec<char>> = branches
                .iter()
                .map(|b| lead_within(b, depth - 1).chars().collect())
                .collect();
            if let Some((first, rest)) = leads.split_first() {
                let shared = rest.iter().fold(first.len(), |n, other| {
                    first
                        .iter()
                        .zip(other)
                        .take(n)
                        .take_while(|(a, b)| a == b)
                        .count()
                });
                out.extend(&first[..shared]);
            }
            break;
        }
        if let Some(values) = at.get("enum").and_then(serde_json::Value::as_array) {
            if !values.is_empty() && values.iter().all(serde_json::Value::is_string) {
                out.push('"');
            }
            break;
        }
        match at.get("type").and_then(serde_json::Value::as_str) {
            Some("object") => {
                out.push('{');
                let Some((name, inner)) = at
                    .get("properties")
                    .and_then(serde_json::Value::as_object)
                    .and_then(|p| p.iter().next())
                else {
                    break;
                };
                let required = at
                    .get("required")
                    .and_then(serde_json::Value::as_array)
                    .is_some_and(|r| r.iter().any(|n| n.as_str() == Some(name)));
                if !required {
                    break;
                }
                out.push_str(&serde_json::Value::from(name.as_str()).to_string());
                out.push(':');
                at = inner;
            }
            Some("array") => {
                out.push('[');
                let least = at.get("minItems").and_then(serde_json::Value::as_u64);
                match at.get("items") {
                    Some(items) if least.unwrap_or(0) > 0 => at = items,
                    _ => break,
                }
            }
            Some("string") => {
                out.push('"');
                break;
            }
            _ => break,
        }
    }
    out
}

/// [`lead_text`] of the generation's schema as tokens, accepted by the picker's grammar; none
/// when the grammar would refuse one of them (checked on a grammar of its own first, as a
/// refused token cannot be taken back), or when they would not leave room for the answer.
fn lead_tokens(
    model: &LlamaModel,
    generation: &Generation,
    schema: &serde_json::Value,
    picker: &mut Picker,
    room: usize,
) -> Result<Vec<LlamaToken>, LlmError> {
    let text = lead_text(schema);
    if text.is_empty() {
        return Ok(Vec::new());
    }
    let lead = model.vocab().tokenize(text.as_bytes(), false, false);
    if lead.len() >= (generation.sampling.max_tokens as usize).min(room) {
        return Ok(Vec::new());
    }
    let mut probe = Picker::new(model, generation)?;
    for &token in &lead {
        if !probe.allows(token) {
            tracing::debug!(lead = %text, "the grammar refuses the answer's lead");
            return Ok(Vec::new());
        }
        probe.accept(token);
    }
    for &token in &lead {
        picker.accept(token);
    }
    Ok(lead)
}

/// What the model gives each of a few words at a point of its answer ([`Picker::weigh`]).
struct Weighed {
    /// The probability of each word.
    odds: Vec<f32>,
    /// The likeliest token that starts each word there, if the grammar allows one.
    first: Vec<Option<LlamaToken>>,
}

impl Weighed {
    /// The first token of the likeliest word other than word `refused`.
    fn first_other_than(&self, refused: usize) -> Option<LlamaToken> {
        (0..self.odds.len())
            .filter(|&i| i != refused)
            .filter_map(|i| self.first[i].map(|token| (self.odds[i], token)))
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, token)| token)
    }
}

/// Chooses each generated token.
enum Picker {
    /// The sampling chain, applied to the whole vocabulary at every step.
    Chain(LlamaSampler),
    /// Greedy decoding under a grammar: the model's best token is checked against the grammar
    /// alone, and the grammar filters the whole vocabulary (about 150,000 tokens, each matched
    /// against the grammar's stacks) only when it refuses that token. Same tokens as the
    /// chain, a fraction of the work: structured answers are mostly the model's first choice.
    GreedyGrammar(LlamaSampler),
}

impl Picker {
    fn new(model: &LlamaModel, generation: &Generation) -> Result<Self, LlmError> {
        let s = &generation.sampling;
        let grammar = match &generation.json_schema {
            Some(schema) => {
                // The analyses' schemas always convert; a client's may use what the grammar
                // cannot express (the converter names no reason).
                fn unexpressed(_: impl std::fmt::Display) -> LlmError {
                    LlmError::Schema(
                        "the schema uses JSON Schema the model's grammar cannot express".into(),
                    )
                }
                let grammar = llama_cpp_2::json_schema_to_grammar(&schema.to_string())
                    .map_err(unexpressed)?;
                Some(LlamaSampler::grammar(model, &grammar, "root").map_err(unexpressed)?)
            }
            None => None,
        };
        let penalised = s.frequency_penalty != 0.0 || s.presence_penalty != 0.0;
        let greedy = s.temperature <= 0.0;
        let grammar = match grammar {
            Some(grammar) if greedy && !penalised => return Ok(Picker::GreedyGrammar(grammar)),
            other => other,
        };
        let mut chain: Vec<LlamaSampler> = grammar.into_iter().collect();
        if penalised {
            chain.push(LlamaSampler::penalties(
                model.n_vocab(),
                64,
                1.0,
                s.frequency_penalty,
                s.presence_penalty,
            ));
        }
        if greedy {
            chain.push(LlamaSampler::greedy());
        } else {
            chain.push(LlamaSampler::top_p(s.top_p, 1));
            chain.push(LlamaSampler::temp(s.temperature));
            let seed = s.seed.map_or_else(rand::random::<u32>, |v| v as u32);
            chain.push(LlamaSampler::dist(seed));
        }
        Ok(Picker::Chain(LlamaSampler::chain_simple(chain)))
    }

    /// The probability the model gives each of `words` as what comes next, from the logits of
    /// batch entry `idx`, normalised over the tokens the grammar allows there: a token counts
    /// for a word when its text starts that word or the word starts it (`partial"`); and each
    /// word's likeliest such token. Only under a grammar with greedy decoding (the analyses'
    /// case); `None` otherwise.
    fn weigh(
        &mut self,
        ctx: &LlamaContext<'_>,
        idx: i32,
        vocab: &LlamaVocab,
        words: &[String],
    ) -> Option<Weighed> {
        let Picker::GreedyGrammar(grammar) = self else {
            return None;
        };
        let mut all = ctx.token_data_array_ith(idx);
        grammar.apply(&mut all);
        let allowed: Vec<(LlamaToken, f32)> = all
            .data
            .iter()
            .filter(|d| d.logit().is_finite())
            .map(|d| (d.id(), d.logit()))
            .collect();
        let top = allowed
            .iter()
            .map(|a| a.1)
            .fold(f32::NEG_INFINITY, f32::max);
        let mut mass = vec![0f32; words.len()];
        let mut first: Vec<Option<(LlamaToken, f32)>> = vec![None; words.len()];
        let mut total = 0f32;
        for (token, logit) in allowed {
            let p = (logit - top).exp();
            total += p;
            let bytes = vocab.token_to_piece(token, false, None);
            let piece = String::from_utf8_lossy(&bytes);
            let piece: &str = piece.as_ref();
            if piece.is_empty() {
                continue;
            }
            if let Some(i) = words
                .iter()
                .position(|w| w.starts_with(piece) || piece.starts_with(w.as_str()))
            {
                mass[i] += p;
                if first[i].is_none_or(|(_, best)| logit > best) {
                    first[i] = Some((token, logit));
                }
            }
        }
        (total > 0.0).then(|| Weighed {
            odds: mass.into_iter().map(|m| m / total).collect(),
            first: first
                .into_iter()
                .map(|f| f.map(|(token, _)| token))
                .collect(),
        })
    }

    /// Whether the grammar lets `token` come next (always, without one).
    fn allows(&mut self, token: LlamaToken) -> bool {
        let sampler = match self {
            Picker::GreedyGrammar(grammar) => grammar,
            Picker::Chain(chain) => chain,
        };
        let mut one = LlamaTokenDataArray::new(vec![LlamaTokenData::new(token, 0.0, 0.0)], false);
        sampler.apply(&mut one);
        one.data[0].logit().is_finite()
    }

    /// `token`, written in place of the model's pick: accepted by the grammar. Only for a
    /// token the grammar allows ([`Picker::weigh`], [`Picker::allows`]).
    fn accept(&mut self, token: LlamaToken) -> LlamaToken {
        match self {
            Picker::GreedyGrammar(grammar) => grammar.accept(token),
            Picker::Chain(chain) => chain.accept(token),
        }
        token
    }

    /// The token after the logits of batch entry `idx`, accepted by the samplers.
    fn pick(&mut self, ctx: &LlamaContext<'_>, idx: i32) -> LlamaToken {
        match self {
            Picker::Chain(chain) => chain.sample(ctx, idx),
            Picker::GreedyGrammar(grammar) => {
                let logits = ctx.get_logits_ith(idx);
                let best = logits
                    .iter()
                    .enumerate()
                    .max_by(|a, b| a.1.total_cmp(b.1))
                    .map_or(0, |(i, _)| i);
                let token = LlamaToken(best as i32);
                let mut one = LlamaTokenDataArray::new(
                    vec![LlamaTokenData::new(token, logits[best], 0.0)],
                    false,
                );
                grammar.apply(&mut one);
                let token = if one.data[0].logit().is_finite() {
                    token
                } else {
                    let mut all = ctx.token_data_array_ith(idx);
                    grammar.apply(&mut all);
                    all.sample_token_greedy()
                };
                grammar.accept(token);
                token
            }
        }
    }
}

/// Fewest tokens worth keeping a snapshot of, or worth restoring one for.
const MIN_SNAPSHOT_TOKENS: usize = 64;

/// A saved sequence: the tokens it holds and llama.cpp's state of them.
struct Snapshot {
    tokens: Vec<LlamaToken>,
    prompt_len: usize,
    state: SeqState,
}

/// What the model's context holds (sequence 0) and snapshots of earlier prompts, least
/// recently used first, bounded in count and bytes.
///
/// Before a prompt is evaluated, [`PrefixCache::prepare`] finds the longest prefix it shares
/// with the context or with a snapshot. When a snapshot shares more, the context is saved as
/// a snapshot (if it holds enough to be worth it) and the snapshot is restored in its place.
/// When the context is about to lose much of what it holds to an unrelated prompt, it is saved
/// first. The KV cache past the shared prefix is removed and only the rest is evaluated.
pub struct PrefixCache {
    /// The tokens the context holds.
    live: Vec<LlamaToken>,
    /// How many of them were the prompt (the rest were generated).
    prompt_len: usize,
    saved: VecDeque<Snapshot>,
    entries: usize,
    budget: usize,
    bytes: usize,
    counters: Arc<Counters>,
}

impl PrefixCache {
    fn new(entries: usize, budget: usize, counters: Arc<Counters>) -> Self {
        Self {
            counters,
            live: Vec::new(),
            prompt_len: 0,
            saved: VecDeque::new(),
            entries,
            budget,
            bytes: 0,
        }
    }

    /// Readies the context for `tokens` and returns how many of them it already holds
    /// (always fewer than all: the last one is evaluated for its logits).
    fn prepare(&mut self, ctx: &mut LlamaContext<'_>, tokens: &[LlamaToken]) -> usize {
        let in_context = common_prefix(&self.live, tokens);
        let best = self
            .saved
            .iter()
            .enumerate()
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
    fn decode(
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
    fn forget(&mut self, ctx: &mut LlamaContext<'_>) {
        ctx.clear_kv_cache();
        self.live.clear();
        self.prompt_len = 0;
    }

    /// Drops what the context holds from position `len` on (drafted tokens the model did not
    /// confirm); if llama.cpp cannot, the context is emptied.
    fn truncate(&mut self, ctx: &mut LlamaContext<'_>, len: usize) -> Result<(), LlmError> {
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
    fn stash(&mut self, ctx: &LlamaContext<'_>) {
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
        // A snapshot that this one extends is no longer needed.
        let live = &self.live;
        let mut freed = 0;
        self.saved.retain(|s| {
            let redundant = live.starts_with(&s.tokens);
            if redundant {
                freed += s.state.byte_len();
            }
            !redundant
        });
        self.bytes -= freed;
        self.bytes += state.byte_len();
        self.saved.push_back(Snapshot {
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

/// Longest run of the latest tokens looked up, and shortest.
const DRAFT_MATCH: (usize, usize) = (4, 2);

/// Up to `most` tokens that may come next in `seen` (the prompt and the answer so far), looked
/// up in `seen` itself: what followed the latest earlier occurrence of its last 4 tokens (or
/// 3, or 2). A structured answer repeats much of its prompt: quotes of the transcript, the
/// field names and layout of the worked examples. Empty when nothing matches.
fn draft(seen: &[LlamaToken], most: usize) -> Vec<LlamaToken> {
    let (longest, shortest) = DRAFT_MATCH;
    if most == 0 {
        return Vec::new();
    }
    for n in (shortest..=longest.min(seen.len().saturating_sub(1))).rev() {
        let tail = &seen[seen.len() - n..];
        // Latest occurrence that is not the tail itself.
        if let Some(start) = (0..seen.len() - n).rev().find(|&i| &seen[i..i + n] == tail) {
            let from = start + n;
            let until = (from + most).min(seen.len());
            if from < until {
                return seen[from..until].to_vec();
            }
        }
    }
    Vec::new()
}

/// How many leading tokens `a` and `b` share.
fn common_prefix(a: &[LlamaToken], b: &[LlamaToken]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// A cancellation carries what the prompt and the tokens produced so far cost.
fn spent(e: LlmError, prompt: usize, produced: usize) -> LlmError {
    match e {
        LlmError::Cancelled { .. } => LlmError::Cancelled {
            usage: Usage {
                prompt_tokens: prompt as u64,
                completion_tokens: produced as u64,
                total_tokens: (prompt + produced) as u64,
            },
        },
        other => other,
    }
}

/// Takes the longest valid UTF-8 prefix out of `pending` (a token may end mid-character).
fn take_utf8(pending: &mut Vec<u8>) -> String {
    let valid = match std::str::from_utf8(pending) {
        Ok(s) => s.len(),
        Err(e) if e.error_len().is_none() => e.valid_up_to(),
        // Invalid bytes in the middle: replace them rather than stall.
        Err(_) => {
            let s = String::from_utf8_lossy(pending).into_owned();
            pending.clear();
            return s;
        }
    };
    let rest = pending.split_off(valid);
    String::from_utf8(std::mem::replace(pending, rest)).expect("checked valid above")
}

/// Decides what generated text may be shown yet: it stops at stop strings and at the start of
/// a tool call, and holds back any tail that could still become one of them.
#[derive(Debug)]
pub struct StreamGate {
    stops: Vec<String>,
    markers: Vec<String>,
    text: String,
    emitted: usize,
    closed: bool,
}

impl StreamGate {
    /// A gate for `stops` (generation ends there, the stop string is dropped) and `markers`
    /// (text from there on is kept but not shown).
    pub fn new(stops: &[String], markers: &[&str]) -> Self {
        Self {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            markers: markers.iter().map(|m| m.to_string()).collect(),
            text: String::new(),
            emitted: 0,
            closed: false,
        }
    }

    /// Adds generated text; returns what may be shown now and whether a stop string ended
    /// the generation.
    pub fn push(&mut self, piece: &str) -> (String, bool) {
        let search_from = self
            .emitted
            .saturating_sub(self.longest())
            .min(self.text.len());
        let search_from = floor_char(&self.text, search_from);
        self.text.push_str(piece);
        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|s| {
                self.text[search_from..]
                    .find(s.as_str())
                    .map(|i| i + search_from)
            })
            .min()
        {
            self.text.truncate(at);
            let emit = if self.closed {
                String::new()
            } else {
                self.text[self.emitted.min(at)..].to_owned()
            };
            self.emitted = self.text.len();
            self.closed = true;
            return (emit, true);
        }
        if self.closed {
            return (String::new(), false);
        }
        if let Some(at) = self
            .markers
            .iter()
            .filter_map(|m| {
                self.text[search_from..]
                    .find(m.as_str())
                    .map(|i| i + search_from)
            })
            .min()
        {
            let emit = self.text[self.emitted..at].to_owned();
            self.emitted = at;
            self.closed = true;
            return (emit, false);
        }
        // Hold back the longest tail that is a prefix of a stop string or marker.
        let mut safe = self.text.len();
        for pattern in self.stops.iter().chain(&self.markers) {
            for k in (1..pattern.len()).rev() {
                if pattern.is_char_boundary(k) && self.text.ends_with(&pattern[..k]) {
                    safe = safe.min(self.text.len() - k);
                    break;
                }
            }
        }
        let safe = floor_char(&self.text, safe.max(self.emitted));
        let emit = self.text[self.emitted..safe].to_owned();
        self.emitted = safe;
        (emit, false)
    }

    /// The end of generation: whatever was held back and may be shown.
    pub fn finish(&mut self) -> String {
        if self.closed {
            return String::new();
        }
        let emit = self.text[self.emitted..].to_owned();
        self.emitted = self.text.len();
        emit
    }

    /// Everything generated (up to a stop string).
    pub fn text(&self) -> &str {
        &self.text
    }

    fn longest(&self) -> usize {
        self.stops
            .iter()
            .chain(&self.markers)
            .map(String::len)
            .max()
            .unwrap_or(0)
    }
}

fn floor_char(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Splits `<tool_call>{...}</tool_call>` blocks off the text. Calls whose JSON does not parse
/// are dropped (the text before them still counts as the answer).
pub fn split_tool_calls(text: &str) -> (String, Vec<ToolCall>) {
    let Some(first) = text.find(TOOL_OPEN) else {
        return (text.trim().to_owned(), Vec::new());
    };
    let mut calls = Vec::new();
    let mut rest = &text[first..];
    while let Some(open) = rest.find(TOOL_OPEN) {
        let body_start = open + TOOL_OPEN.len();
        let (body, next) = match rest[body_start..].find(TOOL_CLOSE) {
            Some(close) => (
                &rest[body_start..body_start + close],
                &rest[body_start + close + TOOL_CLOSE.len()..],
            ),
            None => (&rest[body_start..], ""),
        };
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(body.trim()) {
            if let Some(name) = v.get("name").and_then(|n| n.as_str()) {
                calls.push(ToolCall {
                    id: format!("call_{}", calls.len()),
                    name: name.to_owned(),
                    arguments: v
                        .get("arguments")
                        .cloned()
                        .unwrap_or_else(|| serde_json::json!({})),
                });
            }
        }
        rest = next;
    }
    (text[..first].trim().to_owned(), calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stalled_or_gone_reader_frees_the_model() {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(1);
        send_within(&tx, "a".into(), std::time::Duration::from_millis(50)).unwrap();
        // Full, and nobody takes: the generation gives up after the wait.
        let started = std::time::Instant::now();
        let stalled = send_within(&tx, "b".into(), std::time::Duration::from_millis(50));
        assert!(matches!(stalled, Err(LlmError::Cancelled { .. })));
        assert!(started.elapsed() >= std::time::Duration::from_millis(50));
        assert_eq!(rx.try_recv().unwrap(), "a");
        drop(rx);
        assert!(matches!(
            send_within(&tx, "c".into(), std::time::Duration::from_secs(60)),
            Err(LlmError::Cancelled { .. })
        ));
    }

    fn run(gate: &mut StreamGate, pieces: &[&str]) -> (String, bool) {
        let mut shown = String::new();
        for p in pieces {
            let (emit, stopped) = gate.push(p);
            shown.push_str(&emit);
            if stopped {
                return (shown, true);
            }
        }
        shown.push_str(&gate.finish());
        (shown, false)
    }

    #[test]
    fn stop_strings_end_generation_and_are_not_shown() {
        let mut gate = StreamGate::new(&["END".into()], &[]);
        assert_eq!(
            run(&mut gate, &["Hello E", "N", "D and more"]),
            ("Hello ".into(), true)
        );
        assert_eq!(gate.text(), "Hello ");
        let mut gate = StreamGate::new(&["END".into()], &[]);
        assert_eq!(
            run(&mut gate, &["Hello E", "nd"]),
            ("Hello End".into(), false)
        );
    }

    #[test]
    fn tool_call_markup_is_never_shown() {
        let mut gate = StreamGate::new(&[], &[TOOL_OPEN]);
        let (shown, _) = run(
            &mut gate,
            &[
                "Let me check. <tool",
                "_call>\n{\"name\": \"x\", \"arguments\": {}}\n</tool_call>",
            ],
        );
        assert_eq!(shown, "Let me check. ");
        let (text, calls) = split_tool_calls(gate.text());
        assert_eq!(text, "Let me check.");
        assert_eq!(
            calls,
            vec![ToolCall {
                id: "call_0".into(),
                name: "x".into(),
                arguments: serde_json::json!({})
            }]
        );
    }

    #[test]
    fn split_handles_several_and_broken_calls() {
        let text = "<tool_call>{\"name\":\"a\",\"arguments\":{\"q\":1}}</tool_call>\n<tool_call>{not json}</tool_call><tool_call>{\"name\":\"b\"}";
        let (before, calls) = split_tool_calls(text);
        assert_eq!(before, "");
        assert_eq!(
            calls.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert_eq!(calls[0].arguments, serde_json::json!({"q": 1}));
        assert_eq!(split_tool_calls("plain").0, "plain");
    }

    #[test]
    fn an_answer_starts_with_what_every_answer_to_its_schema_starts_with() {
        use serde_json::json;
        let intent = json!({"type": "object", "properties": {
            "intents": {"type": "array", "minItems": 1, "items": {"type": "object",
                "properties": {"intent": {"type": "string", "enum": ["a", "b"]},
                    "confidence": {"type": "string"}},
                "required": ["intent", "confidence"]}},
            "reasoning": {"type": "string"}}, "required": ["intents", "reasoning"]});
        assert_eq!(lead_text(&intent), r#"{"intents":[{"intent":""#);
        // Branches that differ after the status's opening quote share only that much.
        let branch = |status: &str| {
            json!({"type": "object", "properties": {"status": {"enum": [status]},
                "summary": {"type": "string"}}, "required": ["status", "summary"]})
        };
        let record = json!({"type": "object", "properties": {
            "budget": {"anyOf": [branch("identified"), branch("partial")]}},
            "required": ["budget"]});
        assert_eq!(lead_text(&record), r#"{"budget":{"status":""#);
        // Where the start is open, the lead stops before it.
        let optional = json!({"type": "object", "properties": {"a": {"type": "string"}}});
        assert_eq!(lead_text(&optional), "{");
        let maybe_empty = json!({"type": "array", "items": {"type": "string"}});
        assert_eq!(lead_text(&maybe_empty), "[");
        let number = json!({"type": "object", "properties": {"n": {"type": "number"}},
            "required": ["n"]});
        assert_eq!(lead_text(&number), r#"{"n":"#);
        let apart = json!({"anyOf": [{"type": "string"}, {"type": "number"}]});
        assert_eq!(lead_text(&apart), "");
        assert_eq!(lead_text(&json!({"$ref": "#/$defs/x"})), "");
        // A schema nested past any real one ends the lead; it does not recurse without end.
        let mut deep = json!({"type": "string"});
        for _ in 0..100 {
            deep = json!({"anyOf": [deep]});
        }
        assert_eq!(lead_text(&deep), "");
    }

    #[test]
    fn drafts_follow_the_latest_earlier_occurrence_of_the_last_tokens() {
        let t = |v: &[i32]| v.iter().map(|&x| LlamaToken(x)).collect::<Vec<_>>();
        // The last four tokens seen before: what followed them, up to `most`.
        let seen = t(&[9, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4]);
        assert_eq!(draft(&seen, 3), t(&[5, 6, 7]));
        // Only the last two were seen before: the latest of their occurrences counts.
        let seen = t(&[1, 2, 7, 1, 2, 8, 5, 1, 2]);
        assert_eq!(draft(&seen, 2), t(&[8, 5]));
        // A draft stops where what is seen ends.
        let seen = t(&[1, 2, 3, 1, 2]);
        assert_eq!(draft(&seen, 8), t(&[3, 1, 2]));
        // Nothing seen before, too little seen, or no room: no draft.
        assert!(draft(&t(&[1, 2, 3, 4]), 8).is_empty());
        assert!(draft(&t(&[1, 1]), 8).is_empty());
        assert!(draft(&t(&[1, 2, 1, 2]), 0).is_empty());
        assert_eq!(draft(&t(&[1, 2, 1, 2]), 8), t(&[1, 2]));
    }

    #[test]
    fn utf8_is_assembled_across_tokens() {
        let mut pending = "é".as_bytes()[..1].to_vec();
        assert_eq!(take_utf8(&mut pending), "");
        pending.push("é".as_bytes()[1]);
        pending.extend_from_slice(b"!");
        assert_eq!(take_utf8(&mut pending), "é!");
        assert!(pending.is_empty());
    }

    #[test]
    fn multibyte_text_near_markers_does_not_panic() {
        let mut gate = StreamGate::new(&["«fin»".into()], &[TOOL_OPEN]);
        let (shown, stopped) = run(&mut gate, &["ça va ", "«", "fi", "n» après"]);
        assert_eq!((shown.as_str(), stopped), ("ça va ", true));
    }
}
