//! The model's thread: takes the next request (or warm-up) from the queue, loads the model
//! and its context once, runs each generation, and hands its text to the request's reader
//! within a bounded wait.

use std::num::NonZeroU32;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};
use llama_cpp_2::context::params::{KvCacheType, LlamaContextParams};
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::LlamaModel;
use tokio::sync::oneshot;

use super::*;
use crate::llm::{Generation, LlmError, Usage};

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
pub(super) const DELTA_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Text of the answer, past the gate: added to `answer` (white space aside) when odds are
/// taken, and streamed as far as the gate lets it. Whether a stop string ended the answer.
pub(super) fn shown(
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
pub(super) fn send_delta(
    tx: &tokio::sync::mpsc::Sender<String>,
    text: String,
) -> Result<(), LlmError> {
    send_within(tx, text, DELTA_WAIT)
}

pub(super) fn send_within(
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
}
