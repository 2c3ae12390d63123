//! Whisper on CTranslate2 through `ct2rs`'s low-level API.
//!
//! Why the low-level API: the high-level wrapper prompts with a language and task token, which
//! an English-only (`*.en`) model was never trained with, and computes its own spectrogram. Here
//! the prompt is what the model expects (`<|startoftranscript|>` then, for multilingual models
//! only, the language and `<|transcribe|>`, then `<|notimestamps|>`) and the features come from
//! [`crate::audio::mel`], Whisper's front end.
//!
//! Each utterance is encoded once; the encoder output feeds both the beam search and the
//! cross-attention alignment that times the words.
//!
//! The window is variable: the features are padded to max(`min_window`, utterance) instead of
//! Whisper's fixed 30 s, since CTranslate2's encoder accepts fewer than 3000 frames and costs
//! less on them. Past `min_window` it grows in steps of [`WINDOW_STEP_FRAMES`] (5 s): how an
//! utterance is read depends on the window it is padded to, and a batch shares one window, so
//! the pool batches only utterances whose windows are equal ([`AsrEngine::window`]), and the
//! steps make that common.

use std::path::Path;

use ct2rs::sys::{ComputeType, Config, Device, StorageView, Whisper, WhisperOptions};

use super::guard;
use super::languages::model_languages;
use super::tokenizer::Vocabulary;
use super::{AsrEngine, AsrError, Language, Transcript, Word};
use crate::audio::mel::{LogMel, HOP, N_FRAMES, N_MELS, SAMPLE_RATE};

/// Step in which a window longer than the shortest grows, in mel frames (5 s). Windows of a
/// few steps are often equal, so utterances can still be batched (which only utterances of
/// one window are). The padding this adds is 2.5 s of a window on average; its cost alone
/// was not measured apart from the machine's (docs/benchmarks.md).
pub const WINDOW_STEP_FRAMES: usize = 500;

/// Encoder frames per second (one per 20 ms).
const ENCODER_FRAMES_PER_SEC: f64 = 50.0;

/// Longest text the decoder may write per second of window, in tokens (speech runs at about
/// 4; the bound stops a decoding loop early instead of at Whisper's 448 tokens).
const TOKENS_PER_SECOND: f64 = 12.0;
/// Tokens every window may have, however short.
const MIN_TOKENS: usize = 32;
/// Whisper's own limit on a decode.
const MAX_TOKENS: usize = 448;

/// Decoding settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WhisperSettings {
    /// Beam width; 1 is greedy.
    pub beam_size: usize,
    /// CPU threads for one decode. One per worker is right on a shared machine.
    pub threads: usize,
    /// Shortest encoder window, in seconds (up to 30): an utterance is padded to
    /// max(this, its length). 30 is Whisper's fixed window.
    pub min_window_secs: f64,
}

impl Default for WhisperSettings {
    fn default() -> Self {
        Self {
            beam_size: 2,
            threads: 1,
            min_window_secs: 10.0,
        }
    }
}

impl WhisperSettings {
    /// Mel frames of the window for an utterance of `samples` samples: the shortest window
    /// when it fits, else the utterance rounded up to a whole [`WINDOW_STEP_FRAMES`], at most
    /// Whisper's 30 s. A function of the utterance alone.
    pub fn window_frames(&self, samples: usize) -> usize {
        let min = (self.min_window_secs.clamp(0.0, 30.0) * SAMPLE_RATE as f64 / HOP as f64).ceil()
            as usize;
        let frames = LogMel::window_frames(samples, min);
        if frames <= LogMel::window_frames(0, min) {
            frames
        } else {
            frames.next_multiple_of(WINDOW_STEP_FRAMES).min(N_FRAMES)
        }
    }
}

/// A loaded Whisper model with its own scratch buffers.
pub struct WhisperEngine {
    model: Whisper,
    vocab: Vocabulary,
    languages: Vec<Language>,
    multilingual: bool,
    settings: WhisperSettings,
    mel: LogMel,
    features: Vec<f32>,
}

impl std::fmt::Debug for WhisperEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WhisperEngine")
            .field("multilingual", &self.multilingual)
            .field("settings", &self.settings)
            .finish()
    }
}

impl WhisperEngine {
    /// Loads the CTranslate2 model in `model_dir` (int8 on the CPU).
    pub fn load(model_dir: &Path, settings: WhisperSettings) -> Result<Self, AsrError> {
        let load_err = |message: String| AsrError::Load {
            path: model_dir.display().to_string(),
            message,
        };
        let vocab = Vocabulary::load(model_dir).map_err(|e| load_err(e.to_string()))?;
        let languages = model_languages(model_dir).map_err(|e| load_err(e.to_string()))?;
        let config = Config {
            device: Device::CPU,
            compute_type: ComputeType::INT8,
            num_threads_per_replica: settings.threads.max(1),
            ..Config::default()
        };
        let model = Whisper::new(model_dir, config).map_err(|e| load_err(e.to_string()))?;
        for special in [
            "<|startoftranscript|>",
            "<|notimestamps|>",
            "<|transcribe|>",
        ] {
            vocab
                .id(special)
                .ok_or_else(|| load_err(format!("the vocabulary has no {special} token")))?;
        }
        Ok(Self {
            multilingual: model.is_multilingual(),
            model,
            vocab,
            languages,
            settings,
            mel: LogMel::new(),
            features: Vec::new(),
        })
    }

    fn prompt(&self, language: &str) -> Result<Vec<String>, AsrError> {
        if !self.languages.iter().any(|l| l.code == language) {
            return Err(AsrError::Language(language.to_owned()));
        }
        let mut prompt = vec!["<|startoftranscript|>".to_owned()];
        if self.multilingual {
            prompt.push(format!("<|{language}|>"));
            prompt.push("<|transcribe|>".to_owned());
        }
        prompt.push("<|notimestamps|>".to_owned());
        Ok(prompt)
    }

    /// Splits text tokens into words (a new word starts at a token that begins with a space)
    /// and times them from the token alignment.
    fn words(&self, tokens: &[usize], alignment: &ct2rs::sys::WhisperAlignmentResult) -> Vec<Word> {
        let n = tokens.len();
        if n == 0 {
            return Vec::new();
        }
        let mut start = vec![i64::MAX; n];
        let mut end = vec![i64::MIN; n];
        for a in &alignment.alignments {
            if let Ok(t) = usize::try_from(a.token_x) {
                if t < n {
                    start[t] = start[t].min(a.frame_x);
                    end[t] = end[t].max(a.frame_x + 1);
                }
            }
        }
        // Tokens the path skipped take the end of the one before; times never go backwards.
        let mut last = 0i64;
        for t in 0..n {
            if start[t] == i64::MAX {
                start[t] = last;
                end[t] = last;
            }
            start[t] = start[t].max(last);
            end[t] = end[t].max(start[t]);
            last = end[t];
        }
        let mut words: Vec<Word> = Vec::new();
        let mut bytes = Vec::new();
        let mut first = 0;
        for t in 0..=n {
            let starts_word = t == n
                || (t > first
                    && self
                        .vocab
                        .token(tokens[t])
                        .is_some_and(|s| s.starts_with('Ġ')));
            if !starts_word {
                continue;
            }
            bytes.clear();
            for &id in &tokens[first..t] {
                self.vocab.token_bytes(id, &mut bytes);
            }
            let text = String::from_utf8_lossy(&bytes).trim().to_owned();
            let probs = alignment.text_token_probs.get(first..t).unwrap_or(&[]);
            let probability = if probs.is_empty() {
                0.0
            } else {
                probs.iter().sum::<f32>() / probs.len() as f32
            };
            if !text.is_empty() {
                words.push(Word {
                    text,
                    start: start[first] as f64 / ENCODER_FRAMES_PER_SEC,
                    end: end[t - 1] as f64 / ENCODER_FRAMES_PER_SEC,
                    probability,
                });
            }
            first = t;
        }
        words
    }
}

fn engine_error(e: impl std::fmt::Display) -> AsrError {
    AsrError::Engine(e.to_string())
}

impl AsrEngine for WhisperEngine {
    fn transcribe(
        &mut self,
        utterances: &[&[f32]],
        language: &str,
    ) -> Result<Vec<Transcript>, AsrError> {
        if utterances.is_empty() {
            return Ok(Vec::new());
        }
        let prompt = self.prompt(language)?;
        // The pool batches utterances of one window; a caller that mixes windows gets the
        // longest for all.
        let longest = utterances.iter().map(|u| u.len()).max().unwrap_or(0);
        let frames = self.settings.window_frames(longest);
        let per = N_MELS * frames;
        let started = std::time::Instant::now();
        self.features.resize(per * utterances.len(), 0.0);
        for (audio, out) in utterances.iter().zip(self.features.chunks_exact_mut(per)) {
            self.mel.compute_into(audio, out);
        }
        let batch = utterances.len();
        let features = StorageView::new(&[batch, N_MELS, frames], &mut self.features, Device::CPU)
            .map_err(engine_error)?;
        let mel_ms = started.elapsed().as_millis();
        let encoded = self.model.encode(&features, false).map_err(engine_error)?;
        let encode_ms = started.elapsed().as_millis() - mel_ms;
        let window_secs = (frames * HOP) as f64 / SAMPLE_RATE as f64;
        let options = WhisperOptions {
            beam_size: self.settings.beam_size.max(1),
            return_scores: true,
            return_no_speech_prob: true,
            max_length: ((MIN_TOKENS as f64 + window_secs * TOKENS_PER_SECOND) as usize)
                .min(MAX_TOKENS),
            ..WhisperOptions::default()
        };
        let mut results = self
            .model
            .generate(&encoded, &vec![prompt.clone(); batch], &options)
            .map_err(engine_error)?;
        let generate_ms = started.elapsed().as_millis() - mel_ms - encode_ms;
        // A decode that fell into a loop ("Thank you. Thank you. ...") usually lost the words
        // after the loop's start: decode the whole batch again with repeats held back (no
        // 4-word phrase twice, repeated tokens penalised) and keep the new readings of the
        // looped ones. Rare, so the second pass is not worth splitting the batch for.
        let looped: Vec<usize> = results
            .iter()
            .enumerate()
            .filter(|(_, r)| {
                r.sequences_ids
                    .first()
                    .is_some_and(|ids| guard::has_loop(&self.vocab.decode(ids)))
            })
            .map(|(i, _)| i)
            .collect();
        if !looped.is_empty() {
            let careful = WhisperOptions {
                no_repeat_ngram_size: 4,
                repetition_penalty: 1.2,
                ..options.clone()
            };
            let again = self
                .model
                .generate(&encoded, &vec![prompt.clone(); batch], &careful)
                .map_err(engine_error)?;
            for (i, r) in again.into_iter().enumerate() {
                if looped.contains(&i) {
                    results[i] = r;
                }
            }
        }

        let texts: Vec<Vec<usize>> = results
            .iter()
            .map(|r| {
                r.sequences_ids
                    .first()
                    .map(|ids| {
                        ids.iter()
                            .copied()
                            .filter(|&id| self.vocab.is_text(id))
                            .collect()
                    })
                    .unwrap_or_default()
            })
            .collect();
        let num_frames: Vec<usize> = utterances
            .iter()
            .map(|u| (u.len() / HOP).clamp(1, frames.min(N_FRAMES)))
            .collect();
        let start: Vec<usize> = prompt.iter().filter_map(|t| self.vocab.id(t)).collect();
        let before_align = started.elapsed().as_millis();
        let alignments = if texts.iter().any(|t| !t.is_empty()) {
            self.model
                .align(&encoded, &start, &texts, &num_frames, 7)
                .map_err(engine_error)?
        } else {
            Vec::new()
        };

        tracing::debug!(
            batch,
            frames,
            mel_ms,
            encode_ms,
            generate_ms,
            again = looped.len(),
            align_ms = started.elapsed().as_millis() - before_align,
            tokens = texts.iter().map(Vec::len).sum::<usize>(),
            total_ms = started.elapsed().as_millis(),
            "speech decoded"
        );
        let mut out = Vec::with_capacity(batch);
        for (i, result) in results.iter().enumerate() {
            let avg_logprob = result.scores.first().copied().unwrap_or(f32::NEG_INFINITY);
            let words = alignments
                .get(i)
                .map(|a| self.words(&texts[i], a))
                .unwrap_or_default();
            let length = utterances[i].len() as f64 / crate::audio::mel::SAMPLE_RATE as f64;
            let mut transcript = Transcript {
                text: self.vocab.decode(&texts[i]).trim().to_owned(),
                start: words.first().map_or(0.0, |w| w.start),
                end: words.last().map_or(length, |w| w.end.min(length)),
                confidence: avg_logprob.exp().clamp(0.0, 1.0),
                avg_logprob,
                no_speech_prob: result.no_speech_prob,
                words,
            };
            guard::apply(&mut transcript);
            out.push(transcript);
        }
        Ok(out)
    }

    fn languages(&self) -> &[Language] {
        &self.languages
    }

    fn window(&self, samples: usize) -> usize {
        self.settings.window_frames(samples)
    }
}
