//! An in-memory [`AsrEngine`] for testing everything around the speech engine (the worker
//! pool, the call actor tree, file transcription) without loading a model.
//!
//! It "hears" where an utterance is loud (20 ms frames above a level), answers with a text the
//! test scripts from what it heard, and spreads the words evenly over the loud part, so
//! timestamps behave like the real engine's. Timing is scripted too: a [`Gate`] holds every
//! decode until the test opens it (to make workers "fall behind" deterministically), and an
//! optional cost per utterance spends real time the way a model would.

use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{AsrEngine, AsrError, Language, Transcript, Word};

/// Sample rate of the audio the engine takes.
const RATE: usize = 16_000;
/// Analysis frame: 20 ms.
const FRAME: usize = RATE / 50;
/// Frames louder than this (RMS, full scale 1.0; about -40 dBFS) are "speech".
const LOUD: f32 = 0.01;

/// What the engine heard in one utterance.
#[derive(Debug, Clone, PartialEq)]
pub struct Heard {
    /// Seconds of audio handed in.
    pub secs: f64,
    /// Where the loud part starts and ends, seconds from the start; `None` when all is quiet.
    pub loud: Option<(f64, f64)>,
    /// The language asked for.
    pub language: String,
    /// How many utterances this engine had decoded before this one.
    pub index: u64,
}

/// Turns what was heard into the transcript's text; an empty text means "no speech".
pub type Script = Arc<dyn Fn(&Heard) -> String + Send + Sync>;

/// A gate every decode waits at: closed, decodes block until it opens. Clones share the gate.
#[derive(Debug, Clone, Default)]
pub struct Gate {
    inner: Arc<GateInner>,
}

#[derive(Debug, Default)]
struct GateInner {
    closed: Mutex<bool>,
    changed: Condvar,
    /// Decodes that have reached the gate (waiting or through).
    arrived: AtomicU64,
    arrivals: Condvar,
    arrivals_lock: Mutex<()>,
}

impl Gate {
    /// A gate that starts closed.
    pub fn closed() -> Self {
        let gate = Self::default();
        gate.close();
        gate
    }

    /// Holds every decode from now on.
    pub fn close(&self) {
        *self.inner.closed.lock() = true;
    }

    /// Lets every waiting and later decode through.
    pub fn open(&self) {
        *self.inner.closed.lock() = false;
        self.inner.changed.notify_all();
    }

    /// Decodes that have reached the gate so far.
    pub fn arrived(&self) -> u64 {
        self.inner.arrived.load(Ordering::SeqCst)
    }

    /// Blocks until at least `n` decodes have reached the gate, or `timeout` passes; true when
    /// they have.
    pub fn wait_arrived(&self, n: u64, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        let mut guard = self.inner.arrivals_lock.lock();
        while self.arrived() < n {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            self.inner.arrivals.wait_for(&mut guard, left);
        }
        true
    }

    fn pass(&self) {
        {
            let _guard = self.inner.arrivals_lock.lock();
            self.inner.arrived.fetch_add(1, Ordering::SeqCst);
            self.inner.arrivals.notify_all();
        }
        let mut closed = self.inner.closed.lock();
        while *closed {
            self.inner.changed.wait(&mut closed);
        }
    }
}

/// The scripted engine. Engines made from clones of one [`ScriptedEngine`] share its gate and
/// its utterance count, so a pool of them numbers utterances across workers.
#[derive(Clone)]
pub struct ScriptedEngine {
    script: Script,
    gate: Gate,
    cost: Duration,
    decoded: Arc<AtomicU64>,
    languages: Vec<Language>,
    /// Samples per window step, when the engine reads utterances in windows (0: it does not).
    window_step: usize,
}

impl std::fmt::Debug for ScriptedEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptedEngine")
            .field("cost", &self.cost)
            .field("decoded", &self.decoded)
            .finish()
    }
}

impl Default for ScriptedEngine {
    /// Says `"speech N"` for the N-th utterance with a loud part, nothing for quiet ones.
    fn default() -> Self {
        Self::new(Arc::new(|h: &Heard| {
            if h.loud.is_some() {
                format!("speech {}", h.index)
            } else {
                String::new()
            }
        }))
    }
}

impl ScriptedEngine {
    /// An engine answering with `script`, in English and German, instantly.
    pub fn new(script: Script) -> Self {
        Self {
            script,
            gate: Gate::default(),
            cost: Duration::ZERO,
            decoded: Arc::default(),
            languages: ["en", "de"].map(super::languages::language).to_vec(),
            window_step: 0,
        }
    }

    /// Reads utterances in windows of whole `step`s of samples, as Whisper pads them: a batch
    /// whose utterances need different windows is refused, as the pool must never send one.
    pub fn with_windows(mut self, step: usize) -> Self {
        self.window_step = step;
        self
    }

    /// Decodes wait at `gate`.
    pub fn with_gate(mut self, gate: Gate) -> Self {
        self.gate = gate;
        self
    }

    /// Each utterance costs this much real time (a sleep on the worker thread).
    pub fn with_cost(mut self, cost: Duration) -> Self {
        self.cost = cost;
        self
    }

    /// Utterances decoded so far by this engine and its clones.
    pub fn decoded(&self) -> u64 {
        self.decoded.load(Ordering::SeqCst)
    }

    /// This engine, boxed for a pool.
    pub fn boxed(&self) -> Box<dyn AsrEngine> {
        Box::new(self.clone())
    }

    fn hear(&self, audio: &[f32], language: &str) -> Heard {
        let loud: Vec<usize> = audio
            .chunks(FRAME)
            .enumerate()
            .filter(|(_, frame)| {
                let power = frame.iter().map(|s| s * s).sum::<f32>() / frame.len() as f32;
                power.sqrt() > LOUD
            })
            .map(|(i, _)| i)
            .collect();
        let secs = |frames: usize| (frames * FRAME).min(audio.len()) as f64 / RATE as f64;
        Heard {
            secs: audio.len() as f64 / RATE as f64,
            loud: loud
                .first()
                .zip(loud.last())
                .map(|(&first, &last)| (secs(first), secs(last + 1))),
            language: language.to_owned(),
            index: self.decoded.fetch_add(1, Ordering::SeqCst),
        }
    }
}

/// The transcript of `text` spoken over `span`, one evenly spaced word per whitespace token.
fn transcript(text: String, span: (f64, f64), secs: f64) -> Transcript {
    if text.is_empty() {
        return Transcript {
            text,
            start: 0.0,
            end: secs,
            confidence: 0.0,
            avg_logprob: -3.0,
            no_speech_prob: 0.95,
            words: Vec::new(),
        };
    }
    let tokens: Vec<&str> = text.split_whitespace().collect();
    let step = (span.1 - span.0) / tokens.len().max(1) as f64;
    let words = tokens
        .iter()
        .enumerate()
        .map(|(i, w)| Word {
            text: (*w).to_owned(),
            start: span.0 + step * i as f64,
            end: span.0 + step * (i + 1) as f64,
            probability: 0.9,
        })
        .collect();
    Transcript {
        start: span.0,
        end: span.1,
        confidence: 0.9,
        avg_logprob: -0.1,
        no_speech_prob: 0.01,
        words,
        text,
    }
}

impl AsrEngine for ScriptedEngine {
    fn transcribe(
        &mut self,
        utterances: &[&[f32]],
        language: &str,
    ) -> Result<Vec<Transcript>, AsrError> {
        if !self.languages.iter().any(|l| l.code == language) {
            return Err(AsrError::Language(language.to_owned()));
        }
        if let Some(first) = utterances.first() {
            let window = self.window(first.len());
            if utterances.iter().any(|u| self.window(u.len()) != window) {
                return Err(AsrError::Engine("a batch of different windows".into()));
            }
        }
        self.gate.pass();
        let mut out = Vec::with_capacity(utterances.len());
        for audio in utterances {
            if !self.cost.is_zero() {
                std::thread::sleep(self.cost);
            }
            let heard = self.hear(audio, language);
            let text = (self.script)(&heard);
            out.push(transcript(
                text,
                heard.loud.unwrap_or((0.0, heard.secs)),
                heard.secs,
            ));
        }
        Ok(out)
    }

    fn languages(&self) -> &[Language] {
        &self.languages
    }

    fn window(&self, samples: usize) -> usize {
        if self.window_step == 0 {
            0
        } else {
            samples.div_ceil(self.window_step)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tone(secs: f64, amplitude: f32) -> Vec<f32> {
        (0..(secs * RATE as f64) as usize)
            .map(|i| amplitude * (i as f32 * 0.2).sin())
            .collect()
    }

    #[test]
    fn words_land_on_the_loud_part() {
        let mut audio = tone(1.0, 0.0);
        audio.extend(tone(0.5, 0.5));
        audio.extend(tone(0.5, 0.0));
        let mut engine = ScriptedEngine::new(Arc::new(|_: &Heard| "two words".to_owned()));
        let t = engine.transcribe(&[&audio], "en").unwrap().remove(0);
        assert_eq!(t.text, "two words");
        assert!((t.start - 1.0).abs() < 0.021, "{t:?}");
        assert!((t.end - 1.5).abs() < 0.021, "{t:?}");
        assert_eq!(t.words.len(), 2);
        assert!((t.words[1].start - 1.25).abs() < 0.021, "{t:?}");
    }

    #[test]
    fn quiet_audio_has_no_text_and_utterances_are_numbered_across_clones() {
        let engine = ScriptedEngine::default();
        let mut a = engine.clone();
        let mut b = engine.clone();
        let loud = tone(0.5, 0.5);
        assert_eq!(a.transcribe(&[&loud], "en").unwrap()[0].text, "speech 0");
        assert_eq!(b.transcribe(&[&tone(0.5, 0.0)], "en").unwrap()[0].text, "");
        assert_eq!(a.transcribe(&[&loud], "de").unwrap()[0].text, "speech 2");
        assert!(matches!(
            b.transcribe(&[&loud], "xx"),
            Err(AsrError::Language(_))
        ));
        assert_eq!(engine.decoded(), 3);
    }

    #[test]
    fn a_closed_gate_holds_decodes_until_opened() {
        let gate = Gate::closed();
        let mut engine = ScriptedEngine::default().with_gate(gate.clone());
        let worker = std::thread::spawn(move || {
            engine.transcribe(&[&tone(0.2, 0.5)], "en").unwrap()[0]
                .text
                .clone()
        });
        assert!(gate.wait_arrived(1, Duration::from_secs(10)));
        assert!(!worker.is_finished());
        gate.open();
        assert_eq!(worker.join().unwrap(), "speech 0");
    }
}
