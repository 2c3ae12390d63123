//! One generation on one of the context's sequences, as the batch loop ([`super::worker`])
//! drives it: its prompt read in chunks after the longest prefix already evaluated, then its
//! answer token by token (with drafted tokens checked in one evaluation when under a grammar),
//! until a stop, the token limit or a cancellation. Each step it says what it wants evaluated
//! ([`Sequence::chunk`], [`Sequence::eval`]) and is handed the logits of the batch it was part
//! of ([`Sequence::answered`]). What it streams waits in its own outbox, so a reader that is
//! slow holds back its own sequence only.

use std::sync::atomic::Ordering;
use std::time::Instant;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::model::{LlamaChatTemplate, LlamaModel};
use llama_cpp_2::token::LlamaToken;
use tokio::sync::oneshot;

use super::*;
use crate::llm::fair::Class;
use crate::llm::pointer::pointer_at_end;
use crate::llm::{Completion, FinishReason, Generation, LlmError, Odds, PointOdds, Usage};

/// The loaded model and how it decodes.
pub(super) struct Decoder<'m> {
    pub(super) model: &'m LlamaModel,
    pub(super) template: &'m LlamaChatTemplate,
    /// Most tokens drafted ahead of a structured answer ([`EmbeddedConfig::draft_tokens`]).
    pub(super) draft_tokens: usize,
    /// Whether text a schema forces mid-answer is added without the model writing it.
    pub(super) force_schema_text: bool,
    /// Prompt and answer of one request, at most, in tokens.
    pub(super) window: usize,
}

/// Where a request's result goes.
pub(super) type Done = oneshot::Sender<Result<Completion, LlmError>>;

/// Where a sequence is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Its prompt is being read.
    Prompt,
    /// Its answer is being written.
    Answer,
    /// It is over; its result waits for its outbox to empty.
    Done,
}

/// One request being served.
pub(super) struct Sequence {
    /// The context sequence it runs on, once placed.
    pub(super) seq: usize,
    /// Its class: live prompts are read first.
    pub(super) class: Class,
    /// When it arrived, to read prompts of one class in arrival order.
    pub(super) arrived: Instant,
    /// Its organisation.
    pub(super) tenant: Option<String>,
    /// Where its result goes; `None` for a warm-up, whose result nobody waits for.
    done: Option<Done>,
    deltas: crate::llm::Deltas,
    /// The prompt and the answer's forced start.
    pub(super) tokens: Vec<LlamaToken>,
    prompt_len: usize,
    lead_len: usize,
    max_new: usize,
    draft_tokens: usize,
    prefill: Prefill,
    phase: Phase,
    picker: Picker,
    gate: StreamGate,
    steps: Option<Steps>,
    /// Batch entry of this sequence's first logits in the last evaluation.
    base: i32,
    /// What to evaluate next in the answer: from position, tokens, the first whose logits
    /// are wanted.
    next: Option<(usize, Vec<LlamaToken>, usize)>,
    /// The schema whose forced text is added without the model writing it, when it is.
    forces: Option<serde_json::Value>,
    /// The answer so far, as written, while `forces` is set.
    written: String,
    produced: usize,
    finish: FinishReason,
    answer: String,
    odds: Vec<PointOdds>,
    wanted: Option<Odds>,
    pending: Vec<u8>,
    /// Text for the reader, in order, not yet taken.
    outbox: Outbox,
    result: Option<Result<Completion, LlmError>>,
    started: Instant,
}

impl Sequence {
    /// Readies `generation` (its prompt tokenized, the answer's forced start, the grammar):
    /// a request that cannot run fails here, before it takes a sequence.
    pub(super) fn new(
        decoder: &Decoder<'_>,
        generation: Generation,
        deltas: crate::llm::Deltas,
        done: Option<Done>,
    ) -> Result<Self, (LlmError, Option<Done>)> {
        let (tokens, prompt_len, lead_len, max_new, picker, lead) =
            match Self::ready(decoder, &generation) {
                Ok(ready) => ready,
                Err(e) => return Err((e, done)),
            };
        let warm = done.is_none();
        let step = if warm { WARM_CHUNK } else { PROMPT_CHUNK };
        let drafting = decoder.draft_tokens > 0 && matches!(picker, Picker::GreedyGrammar(_));
        // Under greedy decoding only: a sampler chain's state is not probed token by token.
        let forces = generation
            .json_schema
            .clone()
            .filter(|_| decoder.force_schema_text && matches!(picker, Picker::GreedyGrammar(_)));
        let markers: &[&str] = if generation.tools.is_empty() {
            &[]
        } else {
            &[TOOL_OPEN]
        };
        let mut sequence = Self {
            seq: 0,
            class: generation.class,
            arrived: Instant::now(),
            tenant: generation.tenant.clone(),
            done,
            deltas,
            prompt_len,
            lead_len,
            max_new,
            draft_tokens: if drafting { decoder.draft_tokens } else { 0 },
            prefill: Prefill::new(tokens.len(), 0, step),
            tokens,
            phase: Phase::Prompt,
            picker,
            gate: StreamGate::new(&generation.sampling.stop, markers),
            steps: None,
            base: 0,
            next: None,
            forces,
            written: String::new(),
            produced: 0,
            finish: FinishReason::Length,
            answer: String::new(),
            odds: Vec::new(),
            wanted: generation.odds,
            pending: Vec::new(),
            outbox: Outbox::default(),
            result: None,
            started: Instant::now(),
        };
        // A stop string within the answer's forced start (a client's schema and stop strings)
        // ends the answer there, as one the model wrote would.
        if let Some(lead) = lead {
            if sequence.show(&lead) {
                sequence.finish = FinishReason::Stop;
            }
        }
        Ok(sequence)
    }

    /// The prompt's tokens (with the answer's forced start), how many were the prompt and the
    /// start, the most tokens to write, the picker, and the start's text.
    #[allow(clippy::type_complexity)]
    fn ready(
        decoder: &Decoder<'_>,
        generation: &Generation,
    ) -> Result<(Vec<LlamaToken>, usize, usize, usize, Picker, Option<String>), LlmError> {
        let model = decoder.model;
        let chat = render(&generation.messages, &generation.tools)?;
        let prompt = model
            .apply_chat_template(decoder.template, &chat, true)
            .map_err(engine)?;
        let vocab = model.vocab();
        let mut tokens = vocab.tokenize(prompt.as_bytes(), true, true);
        let limit = decoder.window;
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
        let mut picker = Picker::new(model, generation)?;
        // The start every answer to the schema has is read with the prompt, not written a
        // token at a time.
        let prompt_len = tokens.len();
        let lead = match &generation.json_schema {
            Some(schema) if generation.sampling.max_tokens > 0 => lead_tokens(
                model,
                generation,
                schema,
                &mut picker,
                limit - prompt_len - 1,
            )?,
            _ => Vec::new(),
        };
        tokens.extend_from_slice(&lead);
        // Read with the prompt, it counts as prompt (it leaves `max_tokens` for the rest).
        let max_new =
            (generation.sampling.max_tokens as usize).min(limit - prompt_len - 1) - lead.len();
        let mut pending = Vec::new();
        for &token in &lead {
            pending.extend(vocab.token_to_piece(token, false, None));
        }
        let text = take_utf8(&mut pending);
        Ok((
            tokens,
            prompt_len,
            lead.len(),
            max_new,
            picker,
            (!lead.is_empty()).then_some(text),
        ))
    }

    /// Cells the request may fill: its prompt, its answer and a draft past it.
    pub(super) fn need(&self) -> usize {
        self.tokens.len() + self.max_new + self.draft_tokens + 1
    }

    /// A warm-up: nobody waits for its result.
    pub(super) fn warm(&self) -> bool {
        self.done.is_none()
    }

    /// It was placed on `seq`, where `reused` of its tokens are evaluated already.
    pub(super) fn placed(&mut self, seq: usize, reused: usize) {
        self.seq = seq;
        let step = if self.warm() {
            WARM_CHUNK
        } else {
            PROMPT_CHUNK
        };
        self.prefill = Prefill::new(self.tokens.len(), reused, step);
        self.started = Instant::now();
    }

    /// Whether it is over (its result may still wait for its reader).
    pub(super) fn over(&self) -> bool {
        self.phase == Phase::Done
    }

    /// Whether it is reading its prompt.
    pub(super) fn reading(&self) -> bool {
        self.phase == Phase::Prompt
    }

    /// Whether it is writing its answer (and not held back by its reader).
    pub(super) fn writing(&self) -> bool {
        self.phase == Phase::Answer && self.outbox.is_empty() && self.next.is_some()
    }

    /// The next chunk of its prompt, at most `most` tokens; `None` once it is read.
    pub(super) fn chunk(&mut self, most: usize) -> Option<(Chunk, &[LlamaToken])> {
        let chunk = self.prefill.take_upto(most)?;
        Some((chunk, &self.tokens[chunk.from..chunk.to]))
    }

    /// What its answer needs evaluated now: from position, tokens, and the first of them
    /// whose logits are wanted (those after it are wanted too).
    pub(super) fn eval(&self) -> Option<(usize, &[LlamaToken], usize)> {
        self.next
            .as_ref()
            .map(|(from, t, outputs)| (*from, t.as_slice(), *outputs))
    }

    /// Whether its requester has gone (or, for a warm-up, `yield_to` says a request needs
    /// its place).
    pub(super) fn abandoned(&self, yield_to: bool) -> bool {
        match &self.done {
            Some(done) => done.is_closed(),
            None => yield_to,
        }
    }

    /// Ends it as cancelled: what its prompt and answer cost so far goes with the error.
    pub(super) fn cancel(&mut self, counters: &Counters) {
        if self.phase == Phase::Prompt {
            // Counted as evaluated when it was placed: the part never read is given back.
            counters
                .evaluated
                .fetch_sub(self.prefill.left() as u64, Ordering::Relaxed);
        }
        self.outbox.clear();
        self.conclude(Err(spent(
            LlmError::Cancelled {
                usage: Usage::default(),
            },
            self.tokens.len(),
            self.produced,
        )));
    }

    /// Forgets the text its reader has not taken (the reader has gone).
    pub(super) fn drop_text(&mut self) {
        self.outbox.clear();
    }

    /// Fails it with `e`.
    pub(super) fn fail(&mut self, e: LlmError) {
        self.outbox.clear();
        self.conclude(Err(e));
    }

    fn conclude(&mut self, result: Result<Completion, LlmError>) {
        self.phase = Phase::Done;
        self.next = None;
        self.result = Some(result);
    }

    /// Hands waiting text to the reader as far as it takes it. `Err` when the reader has gone
    /// or took nothing for [`DELTA_WAIT`]: the generation is then given up.
    pub(super) fn flush(&mut self, now: Instant) -> Result<(), ()> {
        match &self.deltas {
            Some(tx) => self.outbox.flush(tx, now, DELTA_WAIT),
            None => {
                self.outbox.clear();
                Ok(())
            }
        }
    }

    /// The result, once it is over and its reader has every piece of text: the sequence is
    /// then done with.
    pub(super) fn take_result(&mut self) -> Option<Result<Completion, LlmError>> {
        if self.phase == Phase::Done && self.outbox.is_empty() {
            self.result.take()
        } else {
            None
        }
    }

    /// Sends `result` where it is awaited.
    pub(super) fn deliver(self, result: Result<Completion, LlmError>, counters: &Counters) {
        match self.done {
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
                    counters.warmed.fetch_add(1, Ordering::Relaxed);
                }
            },
        }
    }

    /// Text of the answer, past the gate: added to the answer (white space aside) when odds
    /// are taken, and queued for the reader as far as the gate lets it. Whether a stop string
    /// ended the answer.
    fn show(&mut self, text: &str) -> bool {
        if self.wanted.is_some() {
            self.answer
                .extend(text.chars().filter(|c| !c.is_whitespace()));
        }
        if self.forces.is_some() {
            self.written.push_str(text);
        }
        let (emit, stopped) = self.gate.push(text);
        if !emit.is_empty() && self.deltas.is_some() {
            self.outbox.push(emit);
        }
        stopped
    }

    /// The prompt chunk `chunk` was evaluated, its last token's logits at batch entry `at`
    /// when it ended the prompt; or the answer's tokens were, their first logits at `at`.
    /// Picks what follows as far as the logits go.
    pub(super) fn answered(
        &mut self,
        model: &LlamaModel,
        ctx: &mut LlamaContext<'_>,
        cache: &mut PrefixCache,
        at: i32,
    ) {
        if self.phase == Phase::Prompt {
            if !self.prefill.done() {
                return;
            }
            tracing::debug!(
                prompt = self.prompt_len,
                lead = self.lead_len,
                reused = self.prefill.reused(),
                seq = self.seq,
                ms = self.started.elapsed().as_millis() as u64,
                "prompt evaluated"
            );
            self.phase = Phase::Answer;
            self.steps = Some(Steps::new(&self.tokens, 0, self.draft_tokens));
            if self.finish == FinishReason::Stop {
                // A stop string in the answer's forced start: nothing more is written.
                self.complete(model, ctx, cache);
                return;
            }
        }
        self.base = at;
        self.next = None;
        if let Err(e) = self.write(model, ctx, cache) {
            self.fail(e);
        }
    }

    /// Writes tokens from the logits at hand until one needs an evaluation, or the answer ends.
    fn write(
        &mut self,
        model: &LlamaModel,
        ctx: &mut LlamaContext<'_>,
        cache: &mut PrefixCache,
    ) -> Result<(), LlmError> {
        let vocab = model.vocab();
        loop {
            if self.produced >= self.max_new {
                self.complete(model, ctx, cache);
                return Ok(());
            }
            let steps = self.steps.as_mut().expect("an answer has its steps");
            let at = self.base + steps.at();
            // At a point where words are weighed, the first token of the likeliest word other
            // than one the model gave less than its floor, to be written instead of its pick.
            let mut instead = None;
            if let Some(wanted) = &self.wanted {
                if !wanted.after.is_empty() && self.answer.ends_with(&wanted.after) {
                    if let Some(weighed) = self.picker.weigh(ctx, at, &vocab, &wanted.words) {
                        instead = wanted
                            .floor
                            .filter(|&(word, least)| {
                                weighed.odds.get(word).is_some_and(|p| *p < least)
                            })
                            .and_then(|(word, _)| weighed.first_other_than(word));
                        self.odds.push(PointOdds {
                            at: pointer_at_end(&self.answer),
                            p: weighed.odds,
                        });
                        if wanted.only {
                            self.finish = FinishReason::Stop;
                            self.complete(model, ctx, cache);
                            return Ok(());
                        }
                    }
                }
            }
            let token = match instead {
                Some(token) => self.picker.accept(token),
                None => self.picker.pick(ctx, at),
            };
            if vocab.is_eog(token) {
                self.finish = FinishReason::Stop;
                self.complete(model, ctx, cache);
                return Ok(());
            }
            self.produced += 1;
            self.pending
                .extend(vocab.token_to_piece(token, false, None));
            let text = take_utf8(&mut self.pending);
            if self.show(&text) {
                self.finish = FinishReason::Stop;
                self.complete(model, ctx, cache);
                return Ok(());
            }
            let (forced, stopped) = self.force(&vocab);
            if stopped {
                self.finish = FinishReason::Stop;
                self.complete(model, ctx, cache);
                return Ok(());
            }
            let room = self.max_new - self.produced;
            let steps = self.steps.as_mut().expect("an answer has its steps");
            match steps.picked(token, room, &forced) {
                // Drafted and already evaluated: its logits come next.
                Step::Confirmed => {}
                Step::Evaluate {
                    cut,
                    from,
                    tokens,
                    outputs,
                } => {
                    if let Some(cut) = cut {
                        cache.truncate(ctx, self.seq, cut)?;
                    }
                    self.next = Some((from, tokens, outputs));
                    return Ok(());
                }
            }
        }
    }

    /// The text the schema forces after the answer so far ([`forced_text`]), as tokens the
    /// grammar takes (up to the first it would refuse) and as far as the answer has room:
    /// written as the model's own are. Whether a stop string ended the answer in it.
    fn force(&mut self, vocab: &llama_cpp_2::vocab::LlamaVocab) -> (Vec<LlamaToken>, bool) {
        let Some(schema) = &self.forces else {
            return (Vec::new(), false);
        };
        let text = forced_text(schema, &self.written);
        if text.is_empty() {
            return (Vec::new(), false);
        }
        let room = self.max_new - self.produced;
        let mut taken = Vec::new();
        for token in vocab.tokenize(text.as_bytes(), false, false) {
            if taken.len() >= room || vocab.is_eog(token) || !self.picker.allows(token) {
                break;
            }
            self.picker.accept(token);
            self.pending
                .extend(vocab.token_to_piece(token, false, None));
            taken.push(token);
        }
        self.produced += taken.len();
        let text = take_utf8(&mut self.pending);
        let stopped = self.show(&text);
        (taken, stopped)
    }

    /// The answer is over: drafted tokens past it are cut, the held-back text released, the
    /// result made.
    fn complete(
        &mut self,
        model: &LlamaModel,
        ctx: &mut LlamaContext<'_>,
        cache: &mut PrefixCache,
    ) {
        let _ = model;
        if let Some(steps) = self.steps.as_mut() {
            // Drafted tokens past the answer's end are not part of what the sequence holds.
            if let Some(cut) = steps.finish() {
                if let Err(e) = cache.truncate(ctx, self.seq, cut) {
                    self.fail(e);
                    return;
                }
            }
            if self.draft_tokens > 0 {
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
        }
        let (evaluations, forced) = self
            .steps
            .as_ref()
            .map_or((0, 0), |s| (s.evaluations, s.forced));
        tracing::debug!(
            produced = self.produced,
            evaluations,
            forced,
            seq = self.seq,
            ms = self.started.elapsed().as_millis() as u64,
            "generation done"
        );
        let tail = self.gate.finish();
        if !tail.is_empty() && self.deltas.is_some() {
            self.outbox.push(tail);
        }
        let (text, tool_calls) = split_tool_calls(self.gate.text());
        let finish = if tool_calls.is_empty() {
            self.finish
        } else {
            FinishReason::ToolCalls
        };
        let prompt = self.tokens.len();
        let odds = std::mem::take(&mut self.odds);
        self.conclude(Ok(Completion {
            text,
            odds,
            tool_calls,
            usage: Usage {
                prompt_tokens: prompt as u64,
                completion_tokens: self.produced as u64,
                total_tokens: (prompt + self.produced) as u64,
            },
            finish,
        }));
    }
}
