//! The steps of one generation, as a state machine the decoder drives: the prompt read in
//! chunks after what is reused ([`Prefill`]), then the answer token by token ([`Steps`]):
//! which logits give the next token, what to evaluate after it (with drafted tokens), where
//! the context is cut back when a draft is refused, and what is left out when the request is
//! cancelled. No model is needed here; the tests drive it with a scripted one.

use std::collections::VecDeque;

use llama_cpp_2::token::LlamaToken;

use super::draft::draft;
use crate::llm::{LlmError, Usage};

/// The chunks a prompt of `len` tokens is read in, after the `reused` already evaluated,
/// `step` tokens at most each.
#[derive(Debug, Clone)]
pub(super) struct Prefill {
    len: usize,
    reused: usize,
    next: usize,
    step: usize,
}

/// One chunk of a prompt: positions `from..to`; the logits of the last are wanted when
/// `last` (it ends the prompt).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Chunk {
    pub(super) from: usize,
    pub(super) to: usize,
    pub(super) last: bool,
}

impl Prefill {
    pub(super) fn new(len: usize, reused: usize, step: usize) -> Self {
        let reused = reused.min(len);
        Self {
            len,
            reused,
            next: reused,
            step: step.max(1),
        }
    }

    /// The next chunk, at most `most` tokens (and at most the step); `None` once every token
    /// is taken or `most` is 0. A batch shared with other sequences takes what room it has.
    pub(super) fn take_upto(&mut self, most: usize) -> Option<Chunk> {
        if self.next >= self.len || most == 0 {
            return None;
        }
        let from = self.next;
        let to = (from + self.step.min(most)).min(self.len);
        self.next = to;
        Some(Chunk {
            from,
            to,
            last: to == self.len,
        })
    }

    /// Whether every token has been taken.
    pub(super) fn done(&self) -> bool {
        self.next >= self.len
    }

    /// Tokens found evaluated already.
    pub(super) fn reused(&self) -> usize {
        self.reused
    }

    /// Tokens not taken yet.
    pub(super) fn left(&self) -> usize {
        self.len - self.next
    }
}

impl Iterator for Prefill {
    type Item = Chunk;

    fn next(&mut self) -> Option<Chunk> {
        self.take_upto(self.step)
    }
}

/// The steps of one answer after its prompt: which batch entry's logits give the next token,
/// which tokens to evaluate after it, and how much of the context holds confirmed tokens. With
/// drafting, the token picked is evaluated together with a draft of the ones that may follow
/// it ([`draft`]); each drafted token the model then picks itself needs no evaluation of its
/// own (its logits were computed with the draft), and at the first it does not pick, the
/// rest of the draft is cut from the context. Without drafting, each token is evaluated alone.
/// No model is needed here: the decoder applies what each step asks for.
#[derive(Debug)]
pub(super) struct Steps {
    /// Most tokens drafted ahead (0: no drafting).
    most: usize,
    /// The prompt and the answer so far (kept only when drafting).
    seen: Vec<LlamaToken>,
    /// Context position of the next token to be confirmed.
    pos: usize,
    /// Batch entry whose logits give the next token.
    at: i32,
    /// Drafted tokens evaluated after `pos`, not yet confirmed.
    drafted: VecDeque<LlamaToken>,
    /// Drafted tokens evaluated.
    pub(super) checked: usize,
    /// Of those, the ones the model picked itself.
    pub(super) confirmed: usize,
    /// Evaluations after the prompt.
    pub(super) evaluations: usize,
    /// Tokens the schema forced, evaluated beside the token before them.
    pub(super) forced: usize,
}

/// What the decoder does after a token is picked.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// The token was drafted and is already evaluated: its logits are at [`Steps::at`].
    Confirmed,
    /// Cut the context back to `cut` positions (a draft refused), then evaluate `tokens` from
    /// position `from` (the first is the token picked, unless it was drafted and is evaluated
    /// already), with the logits of those from `outputs` on.
    Evaluate {
        cut: Option<usize>,
        from: usize,
        tokens: Vec<LlamaToken>,
        outputs: usize,
    },
}

impl Steps {
    /// After a prompt of `prompt` tokens whose last logits are batch entry `at`; `most` tokens
    /// drafted ahead at most (0: none).
    pub(super) fn new(prompt: &[LlamaToken], at: i32, most: usize) -> Self {
        Self {
            most,
            seen: if most > 0 {
                prompt.to_vec()
            } else {
                Vec::new()
            },
            pos: prompt.len(),
            at,
            drafted: VecDeque::new(),
            checked: 0,
            confirmed: 0,
            evaluations: 0,
            forced: 0,
        }
    }

    /// The batch entry whose logits give the next token.
    pub(super) fn at(&self) -> i32 {
        self.at
    }

    /// `token` was picked, with `room` tokens left to write after it, and the schema forces
    /// `forced` after it (already written): what to do next. Forced tokens are evaluated with
    /// the token, in one step, and only the last one's logits are wanted; nothing is drafted
    /// after them.
    pub(super) fn picked(&mut self, token: LlamaToken, room: usize, forced: &[LlamaToken]) -> Step {
        if self.most > 0 {
            self.seen.push(token);
            self.seen.extend_from_slice(forced);
        }
        if !forced.is_empty() {
            let mut tokens = Vec::with_capacity(1 + forced.len());
            if self.drafted.front() == Some(&token) {
                // Evaluated with the draft: the forced tokens follow it.
                self.drafted.pop_front();
                self.confirmed += 1;
                self.pos += 1;
            } else {
                tokens.push(token);
            }
            let cut = (!self.drafted.is_empty()).then_some(self.pos);
            self.drafted.clear();
            tokens.extend_from_slice(forced);
            let from = self.pos;
            self.pos += tokens.len();
            self.at = tokens.len() as i32 - 1;
            self.evaluations += 1;
            self.forced += forced.len();
            return Step::Evaluate {
                cut,
                from,
                outputs: tokens.len() - 1,
                tokens,
            };
        }
        if self.drafted.front() == Some(&token) {
            self.drafted.pop_front();
            self.confirmed += 1;
            self.at += 1;
            self.pos += 1;
            return Step::Confirmed;
        }
        let cut = (!self.drafted.is_empty()).then_some(self.pos);
        self.drafted.clear();
        let ahead = draft(&self.seen, self.most.min(room));
        self.checked += ahead.len();
        self.evaluations += 1;
        let from = self.pos;
        let mut tokens = Vec::with_capacity(1 + ahead.len());
        tokens.push(token);
        tokens.extend_from_slice(&ahead);
        self.pos += 1;
        self.at = 0;
        self.drafted = ahead.into();
        Step::Evaluate {
            cut,
            from,
            tokens,
            outputs: 0,
        }
    }

    /// The answer is over: where to cut the context back to when drafted tokens past its end
    /// are in it.
    pub(super) fn finish(&mut self) -> Option<usize> {
        let cut = (!self.drafted.is_empty()).then_some(self.pos);
        self.drafted.clear();
        cut
    }
}

/// A cancellation carries what the prompt and the tokens produced so far cost.
pub(super) fn spent(e: LlmError, prompt: usize, produced: usize) -> LlmError {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A scripted model: from any context, the next token is a fixed function of the last
    /// one (the logits are scripted), so an answer is known in advance.
    fn next(context: &[LlamaToken]) -> LlamaToken {
        let last = context.last().map_or(0, |t| t.0);
        LlamaToken(match last {
            // A cycle the prompt shows, so drafts from it are right...
            1 => 2,
            2 => 3,
            3 => 4,
            4 => 1,
            // ...and one it does not: after 9 comes 7, though the prompt had 9 then 5.
            9 => 7,
            7 => 1,
            _ => 9,
        })
    }

    /// Decodes `max_new` tokens after `prompt` as the decoder does, on a simulated context
    /// (the tokens whose logits are computed): the answer, the context at the end, and the
    /// steps' counts.
    fn decode(
        prompt: &[LlamaToken],
        max_new: usize,
        most: usize,
    ) -> (Vec<LlamaToken>, Vec<LlamaToken>, Steps) {
        decode_forced(prompt, max_new, most, |_| Vec::new())
    }

    /// [`decode`], with the tokens `force` gives after each token picked written after it.
    fn decode_forced(
        prompt: &[LlamaToken],
        max_new: usize,
        most: usize,
        force: impl Fn(LlamaToken) -> Vec<LlamaToken>,
    ) -> (Vec<LlamaToken>, Vec<LlamaToken>, Steps) {
        let mut context = prompt.to_vec();
        // The logits of each evaluated batch entry: the context up to and with it.
        let mut batch: Vec<Vec<LlamaToken>> = vec![context.clone()];
        let mut steps = Steps::new(prompt, 0, most);
        let mut answer = Vec::new();
        while answer.len() < max_new {
            let token = next(&batch[steps.at() as usize]);
            answer.push(token);
            let mut forced = force(token);
            forced.truncate(max_new - answer.len());
            answer.extend_from_slice(&forced);
            match steps.picked(token, max_new - answer.len(), &forced) {
                Step::Confirmed => {}
                Step::Evaluate {
                    cut,
                    from,
                    tokens,
                    outputs,
                } => {
                    assert!(outputs < tokens.len(), "the last token's logits are wanted");
                    if let Some(cut) = cut {
                        context.truncate(cut);
                    }
                    assert_eq!(from, context.len(), "evaluated where the context ends");
                    batch.clear();
                    for t in tokens {
                        context.push(t);
                        batch.push(context.clone());
                    }
                }
            }
        }
        if let Some(cut) = steps.finish() {
            context.truncate(cut);
        }
        (answer, context, steps)
    }

    #[test]
    fn drafting_never_changes_the_answer_and_leaves_only_confirmed_tokens() {
        let t = |v: &[i32]| v.iter().map(|&x| LlamaToken(x)).collect::<Vec<_>>();
        let prompt = t(&[8, 1, 2, 3, 4, 1, 2, 9, 5, 6, 8]);
        let (plain, plain_context, plain_steps) = decode(&prompt, 12, 0);
        // 8 -> 9 -> 7 -> 1 -> 2 -> 3 -> 4 -> 1 ...
        assert_eq!(&plain[..4], t(&[9, 7, 1, 2]).as_slice());
        assert_eq!(plain_steps.evaluations, 12);
        assert_eq!(plain_steps.checked, 0);
        for most in [1, 2, 4, 8] {
            let (answer, context, steps) = decode(&prompt, 12, most);
            assert_eq!(answer, plain, "most {most}");
            // What the context holds is the prompt and the answer, every token evaluated once
            // and nothing drafted past the answer's end.
            assert_eq!(context, plain_context, "most {most}");
            assert_eq!(context[prompt.len()..], answer[..], "most {most}");
            // Confirmed drafts saved evaluations: one per token, less those confirmed.
            assert_eq!(
                steps.evaluations + steps.confirmed,
                answer.len(),
                "most {most}"
            );
            assert!(steps.confirmed <= steps.checked);
            assert!(
                steps.confirmed > 0,
                "the cycle the prompt shows is drafted: most {most}"
            );
        }
    }

    #[test]
    fn forced_tokens_are_evaluated_with_the_token_before_them_and_the_answer_goes_on_from_the_last()
    {
        let t = |v: &[i32]| v.iter().map(|&x| LlamaToken(x)).collect::<Vec<_>>();
        let prompt = t(&[8, 1, 2, 3, 4, 1, 2, 9, 5, 6, 8]);
        // After every 2 the schema forces 3 and 4 (what the script would pick too), after 7 a
        // 5 the script would not pick: the answer goes on from what was forced.
        let force = |token: LlamaToken| match token.0 {
            2 => t(&[3, 4]),
            7 => t(&[5]),
            _ => Vec::new(),
        };
        let (plain, ..) = decode(&prompt, 12, 0);
        let (forced, _, undrafted) = decode_forced(&prompt, 12, 0, force);
        // 8 -> 9 -> 7 [5] -> 9 -> 7 [5] ...: the forced 5 changes what follows.
        assert_eq!(&forced[..4], t(&[9, 7, 5, 9]).as_slice());
        assert_ne!(forced, plain);
        assert_eq!(undrafted.evaluations + undrafted.forced, forced.len());
        assert_eq!(undrafted.forced, 4);
        for most in [0, 2, 8] {
            let (answer, context, steps) = decode_forced(&prompt, 12, most, force);
            // Drafting never changes the answer, and the context holds it and nothing more.
            assert_eq!(answer, forced, "most {most}");
            assert_eq!(context[prompt.len()..], answer[..], "most {most}");
            assert_eq!(steps.forced, 4, "most {most}");
        }
        // A cycle through 2: each 2 picked brings 3 and 4 in the same step.
        let prompt = t(&[1, 2, 3, 4, 1]);
        let (answer, context, steps) = decode_forced(&prompt, 9, 0, force);
        assert_eq!(answer, t(&[2, 3, 4, 1, 2, 3, 4, 1, 2]));
        assert_eq!(context[prompt.len()..], answer[..]);
        assert_eq!((steps.evaluations, steps.forced), (5, 4));
    }

    #[test]
    fn a_refused_draft_is_cut_from_the_context_at_the_token_it_got_wrong() {
        let t = |v: &[i32]| v.iter().map(|&x| LlamaToken(x)).collect::<Vec<_>>();
        let prompt = t(&[9, 5, 6, 1, 9]);
        let mut steps = Steps::new(&prompt, 4, 4);
        // Nothing seen follows "9 7" (or a longer tail): the token is evaluated alone.
        let first = steps.picked(LlamaToken(7), 8, &[]);
        assert_eq!(
            first,
            Step::Evaluate {
                cut: None,
                from: 5,
                tokens: t(&[7]),
                outputs: 0
            }
        );
        let steps_prompt = t(&[1, 9, 5, 6, 1, 9]);
        let mut steps = Steps::new(&steps_prompt, 5, 4);
        // The model picks 5 after "1 9": "1 9 5" was seen, followed by 6 1 9 5, drafted.
        match steps.picked(LlamaToken(5), 8, &[]) {
            Step::Evaluate {
                cut, from, tokens, ..
            } => {
                assert_eq!((cut, from), (None, 6));
                assert_eq!(tokens, t(&[5, 6, 1, 9, 5]));
            }
            other => panic!("{other:?}"),
        }
        // The model confirms 6, then picks 2 where 1 was drafted: the context is cut back to
        // just after 6 (the confirmed), and 2 is evaluated there.
        assert_eq!(steps.picked(LlamaToken(6), 8, &[]), Step::Confirmed);
        assert_eq!(steps.at(), 1);
        match steps.picked(LlamaToken(2), 8, &[]) {
            Step::Evaluate {
                cut, from, tokens, ..
            } => {
                assert_eq!(cut, Some(8));
                assert_eq!(from, 8);
                assert_eq!(tokens[0], LlamaToken(2));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!((steps.checked, steps.confirmed), (4, 1));
        // No room left: nothing is drafted, and at the end nothing is left to cut.
        let mut last = Steps::new(&steps_prompt, 5, 4);
        match last.picked(LlamaToken(5), 0, &[]) {
            Step::Evaluate { tokens, .. } => assert_eq!(tokens, t(&[5])),
            other => panic!("{other:?}"),
        }
        assert_eq!(last.finish(), None);
    }

    #[test]
    fn a_prompt_is_read_in_chunks_after_what_is_reused_and_a_cancel_gives_back_the_rest() {
        let chunks: Vec<Chunk> = Prefill::new(1100, 100, 512).collect();
        assert_eq!(
            chunks,
            [
                Chunk {
                    from: 100,
                    to: 612,
                    last: false
                },
                Chunk {
                    from: 612,
                    to: 1100,
                    last: true
                },
            ]
        );
        // Stopped after the first chunk, the second's tokens were never evaluated.
        let mut prefill = Prefill::new(1100, 100, 512);
        assert_eq!(prefill.take_upto(512), Some(chunks[0]));
        assert_eq!(prefill.left(), 488);
        assert!(!prefill.done());
        // A batch shared with others takes what room it has: a smaller chunk, never a larger.
        assert_eq!(
            prefill.take_upto(100),
            Some(Chunk {
                from: 612,
                to: 712,
                last: false
            })
        );
        assert_eq!(prefill.take_upto(0), None);
        assert_eq!(
            prefill.take_upto(10_000).map(|c| (c.to, c.last)),
            Some((1100, true))
        );
        assert!(prefill.done());
        assert_eq!(prefill.reused(), 100);
        // Everything but the last token reused: one chunk of one, with its logits.
        assert_eq!(
            Prefill::new(10, 9, 512).collect::<Vec<_>>(),
            [Chunk {
                from: 9,
                to: 10,
                last: true
            }]
        );
        assert_eq!(Prefill::new(10, 10, 512).count(), 0);
    }

    #[test]
    fn a_cancellation_carries_what_was_spent_and_other_errors_pass_through() {
        let cancelled = LlmError::Cancelled {
            usage: Usage::default(),
        };
        match spent(cancelled, 120, 7) {
            LlmError::Cancelled { usage } => assert_eq!(
                usage,
                Usage {
                    prompt_tokens: 120,
                    completion_tokens: 7,
                    total_tokens: 127
                }
            ),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            spent(LlmError::Engine("x".into()), 120, 7),
            LlmError::Engine(_)
        ));
    }
}
