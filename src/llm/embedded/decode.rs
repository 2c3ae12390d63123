//! One generation: the prompt read in chunks after the longest prefix already evaluated, then
//! token by token (with drafted tokens checked in one evaluation when under a grammar), until
//! a stop, the token limit or a cancellation. What to evaluate at each step is decided by the
//! state machine in `steps.rs`; this file applies it to the model.

use std::sync::atomic::Ordering;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::{LlamaChatTemplate, LlamaModel};

use super::*;
use crate::llm::pointer::pointer_at_end;
use crate::llm::{Completion, FinishReason, Generation, LlmError, PointOdds, Usage};

/// The loaded model and how it decodes.
pub(super) struct Decoder<'m> {
    pub(super) model: &'m LlamaModel,
    pub(super) template: &'m LlamaChatTemplate,
    /// Most tokens drafted ahead of a structured answer ([`EmbeddedConfig::draft_tokens`]).
    pub(super) draft_tokens: usize,
}

pub(super) fn generate(
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
    let reused = cache.prepare(ctx, generation.tenant.as_deref(), &tokens);
    let step = if generation.sampling.max_tokens == 0 {
        WARM_CHUNK
    } else {
        PROMPT_CHUNK
    };
    let mut batch = LlamaBatch::new(PROMPT_CHUNK, 1);
    let mut prefill = Prefill::new(tokens.len(), reused, step);
    while let Some(chunk) = prefill.next() {
        if prefill.may_stop_before(&chunk) && abandoned() {
            cache
                .counters
                .evaluated
                .fetch_sub(prefill.unread(&chunk) as u64, Ordering::Relaxed);
            return Err(spent(
                LlmError::Cancelled {
                    usage: Usage::default(),
                },
                tokens.len(),
                0,
            ));
        }
        batch.clear();
        let read = &tokens[chunk.from..chunk.to];
        for (i, &t) in read.iter().enumerate() {
            let last = chunk.last && chunk.from + i == chunk.to - 1;
            batch
                .add(t, (chunk.from + i) as i32, &[0], last)
                .map_err(engine)?;
        }
        cache.decode(ctx, &mut batch, read)?;
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
    let mut steps = Steps::new(
        &tokens,
        batch.n_tokens() - 1,
        if drafting { draft_tokens } else { 0 },
    );
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
                if let Some(weighed) = picker.weigh(ctx, steps.at(), &vocab, &wanted.words) {
                    instead = wanted
                        .floor
                        .filter(|&(word, least)| weighed.odds.get(word).is_some_and(|p| *p < least))
                        .and_then(|(word, _)| weighed.first_other_than(word));
                    odds.push(PointOdds {
                        at: pointer_at_end(&answer),
                        p: weighed.odds,
                    });
                    if wanted.only {
                        finish = FinishReason::Stop;
                        break;
                    }
                }
            }
        }
        let token = match instead {
            Some(token) => picker.accept(token),
            None => picker.pick(ctx, steps.at()),
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
        match steps.picked(token, max_new - produced) {
            // Drafted and already evaluated: its logits come next.
            Step::Confirmed => {}
            Step::Evaluate { cut, from, tokens } => {
                if let Some(cut) = cut {
                    cache.truncate(ctx, cut)?;
                }
                batch.clear();
                for (i, &t) in tokens.iter().enumerate() {
                    batch
                        .add(t, (from + i) as i32, &[0], true)
                        .map_err(engine)?;
                }
                cache.decode(ctx, &mut batch, &tokens)?;
            }
        }
    }
    // Drafted tokens past the answer's end are not part of what the context holds.
    if let Some(cut) = steps.finish() {
        cache.truncate(ctx, cut)?;
    }
    if drafting {
        let counters = &cache.counters;
        counters
            .drafted
            .fetch_add(steps.checked as u64, Ordering::Relaxed);
        counters
            .confirmed
            .fetch_add(steps.confirmed as u64, Ordering::Relaxed);
        tracing::debug!(
            drafted = steps.checked,
            confirmed = steps.confirmed,
            evaluations = steps.evaluations,
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
