//! How the next token is picked: greedy under a grammar (with odds taken at marked points),
//! or sampled with the request's settings.

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::data::LlamaTokenData;
use llama_cpp_2::token::data_array::LlamaTokenDataArray;
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::vocab::LlamaVocab;

use crate::llm::{Generation, LlmError};

/// What the model gives each of a few words at a point of its answer ([`Picker::weigh`]).
pub(super) struct Weighed {
    /// The probability of each word.
    pub(super) odds: Vec<f32>,
    /// The likeliest token that starts each word there, if the grammar allows one.
    pub(super) first: Vec<Option<LlamaToken>>,
}

impl Weighed {
    /// The first token of the likeliest word other than word `refused`.
    pub(super) fn first_other_than(&self, refused: usize) -> Option<LlamaToken> {
        (0..self.odds.len())
            .filter(|&i| i != refused)
            .filter_map(|i| self.first[i].map(|token| (self.odds[i], token)))
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, token)| token)
    }
}

/// Chooses each generated token.
pub(super) enum Picker {
    /// The sampling chain, applied to the whole vocabulary at every step.
    Chain(LlamaSampler),
    /// Greedy decoding under a grammar: the model's best token is checked against the grammar
    /// alone, and the grammar filters the whole vocabulary (about 150,000 tokens, each matched
    /// against the grammar's stacks) only when it refuses that token. Same tokens as the
    /// chain, a fraction of the work: structured answers are mostly the model's first choice.
    GreedyGrammar(LlamaSampler),
}

impl Picker {
    pub(super) fn new(model: &LlamaModel, generation: &Generation) -> Result<Self, LlmError> {
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
    pub(super) fn weigh(
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
    pub(super) fn allows(&mut self, token: LlamaToken) -> bool {
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
    pub(super) fn accept(&mut self, token: LlamaToken) -> LlamaToken {
        match self {
            Picker::GreedyGrammar(grammar) => grammar.accept(token),
            Picker::Chain(chain) => chain.accept(token),
        }
        token
    }

    /// The token after the logits of batch entry `idx`, accepted by the samplers.
    pub(super) fn pick(&mut self, ctx: &LlamaContext<'_>, idx: i32) -> LlamaToken {
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
