//! The speech engine: the [`AsrEngine`] port, its Whisper-on-CTranslate2 implementation, an
//! in-memory scripted engine for tests (feature `test-util`, absent from the release binary),
//! the hallucination guard, the worker pool that runs
//! engines on dedicated threads, and the language list of the loaded model.

pub mod file;
pub mod guard;
pub mod languages;
pub mod load;
pub mod pool;
#[cfg(any(test, feature = "test-util"))]
pub mod scripted;
pub mod tokenizer;
pub mod wer;
#[cfg(feature = "whisper")]
pub mod whisper;

pub use languages::{model_languages, Language, ModelError};

/// One recognised word with its timing.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Word {
    /// The word as written, with its leading space removed.
    pub text: String,
    /// Start, seconds from the start of the utterance.
    pub start: f64,
    /// End, seconds from the start of the utterance.
    pub end: f64,
    /// Mean probability of its tokens.
    pub probability: f32,
}

/// The engine's reading of one utterance.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Transcript {
    /// The text; empty when the guard found no speech.
    pub text: String,
    /// Where the speech starts, seconds from the start of the utterance (the first word's
    /// start, or 0 without word timings).
    pub start: f64,
    /// Where the speech ends, seconds from the start of the utterance (the last word's end,
    /// or the utterance's length without word timings).
    pub end: f64,
    /// exp(mean token log-probability): 0 to 1.
    pub confidence: f32,
    /// Mean token log-probability, as the decoder scored the hypothesis.
    pub avg_logprob: f32,
    /// The model's probability that the audio holds no speech.
    pub no_speech_prob: f32,
    /// Words with timings, when the alignment gave them.
    pub words: Vec<Word>,
}

/// Why recognition failed.
#[derive(Debug, thiserror::Error)]
pub enum AsrError {
    /// The model could not be loaded.
    #[error("cannot load speech model {path}: {message}")]
    Load {
        /// Model directory.
        path: String,
        /// Why.
        message: String,
    },
    /// The engine failed on this input.
    #[error("speech engine failed: {0}")]
    Engine(String),
    /// The language is not one the model accepts.
    #[error("language {0:?} is not supported by the loaded model")]
    Language(String),
    /// The pool is shut down or its queue is full.
    #[error("speech engine unavailable: {0}")]
    Unavailable(String),
}

/// A speech recogniser for utterances of up to 30 s of 16 kHz mono audio.
///
/// One instance is used by one thread at a time (`&mut self`): engines keep scratch buffers,
/// and the pool gives each worker thread an engine of its own.
pub trait AsrEngine: Send {
    /// Recognises a batch of utterances in `language`; one transcript per utterance, in order.
    fn transcribe(
        &mut self,
        utterances: &[&[f32]],
        language: &str,
    ) -> Result<Vec<Transcript>, AsrError>;

    /// Languages the loaded model accepts.
    fn languages(&self) -> &[Language];

    /// The window an utterance of `samples` samples is decoded in, for engines whose reading
    /// of an utterance depends on the window it is padded to. The pool batches only
    /// utterances with the same window (and language), so what an utterance is read as never
    /// depends on what it happened to be queued with: the same file gives the same transcript
    /// every time. Engines that read each utterance on its own return 0 (the default).
    fn window(&self, samples: usize) -> usize {
        let _ = samples;
        0
    }
}
