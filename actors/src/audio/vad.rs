//! Voice activity detection and utterance segmentation for 8 kHz telephone audio.
//!
//! Each 20 ms frame is classified by the WebRTC VAD (its GMM classifier, mode 3, at 8 kHz) and
//! by two checks of our own that the WebRTC VAD lacks: a level floor (line noise and hiss are
//! quiet) and a tonality test (DTMF digits, call-progress tones and synthesiser notes put
//! nearly all their energy in one or two narrow peaks; speech spreads it over harmonics and
//! formants). The tonality is measured over 300-3600 Hz: below 300 Hz the fundamental of a
//! low voice can hold most of a vowel's energy, which made whole words of a clear male voice
//! look like tones (and lost them). A frame is speech only when all three agree.
//!
//! Utterances: speech starts one (with a short pre-roll kept), `trailing_silence_ms` of
//! non-speech ends it (voiced, loud frames the tonality test calls tones count half: the held
//! vowels of a steady or synthetic voice look like tones, and cut its sentences in two when
//! they counted as silence), and it is kept only if it has `min_speech_ms` of speech frames and
//! passes the utterance checks (enough speech density, not dominated by sustained pitches as
//! music is). An utterance reaching `max_utterance_ms` is split at its quietest frame in the
//! last third, and the rest carries on.

use std::sync::Arc;

use realfft::num_complex::Complex;
use realfft::{RealFftPlanner, RealToComplex};
use webrtc_vad::{SampleRate, Vad, VadMode};

/// Sample rate the segmenter works at.
pub const RATE: usize = 8_000;
/// Samples per analysis frame (20 ms).
pub const FRAME: usize = 160;
const FRAME_MS: u32 = 20;
const FFT_LEN: usize = 256;
/// Trailing non-speech kept at the end of an utterance.
const TAIL_MS: u32 = 400;
/// Frames that are speech by every check (not tonal) an utterance needs.
const MIN_CLEAR_FRAMES: usize = 3;
/// First FFT bin of the tonality band (312.5 Hz).
const BAND_LO: usize = 10;
/// Non-speech that ends an utterance still too short to count (less voiced speech than
/// `min_speech_ms`), when longer than the trailing silence. A short first word and a pause
/// ("Yes, ... we have around eight thousand pounds") would otherwise end as a piece too short
/// to keep, its word dropped, and the sentence after it start a new utterance, whose soft first
/// words the pre-roll may not reach: a neural voice's "Yes," then 1.0 s with its "we have"
/// too soft for the WebRTC VAD lost all three words. Held open this long, the word joins the
/// sentence that follows; with nothing after it, it is dropped as before. It delays no
/// utterance that counts.
const SHORT_HOLD_MS: u32 = 1_500;

/// Segmentation settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VadConfig {
    /// Speech needed in an utterance for it to count.
    pub min_speech_ms: u32,
    /// Non-speech that ends an utterance.
    pub trailing_silence_ms: u32,
    /// Longest utterance; longer speech is split at a quiet point.
    pub max_utterance_ms: u32,
    /// Audio kept before the first speech frame.
    pub pre_roll_ms: u32,
    /// Frames quieter than this (dBFS) are never speech.
    pub min_level_dbfs: f32,
    /// Frames with more of their 300-3600 Hz energy in their two strongest peaks than this
    /// are tones.
    pub max_tonality: f32,
}

impl Default for VadConfig {
    fn default() -> Self {
        Self {
            min_speech_ms: 300,
            trailing_silence_ms: 500,
            max_utterance_ms: 30_000,
            pre_roll_ms: 400,
            min_level_dbfs: -50.0,
            max_tonality: 0.55,
        }
    }
}

/// A stretch of speech, at 8 kHz.
#[derive(Debug, Clone, PartialEq)]
pub struct Utterance {
    /// Index of its first sample in the channel's stream.
    pub start: u64,
    /// The samples.
    pub samples: Vec<i16>,
}

impl Utterance {
    /// Start in seconds.
    pub fn start_secs(&self) -> f64 {
        self.start as f64 / RATE as f64
    }

    /// Length in seconds.
    pub fn duration_secs(&self) -> f64 {
        self.samples.len() as f64 / RATE as f64
    }
}

/// What the classifier saw in one frame.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FrameInfo {
    /// The WebRTC VAD's decision.
    pub voiced: bool,
    /// Level in dBFS.
    pub level_dbfs: f32,
    /// Share of the 300-3600 Hz energy in the two strongest spectral peaks.
    pub tonality: f32,
    /// Strongest spectral bin (31.25 Hz per bin).
    pub peak_bin: u16,
    /// Nearly all the 300-3600 Hz energy in one or two narrow peaks: a tone.
    pub tone: bool,
    /// All checks agree: speech.
    pub speech: bool,
}

/// Classifies 20 ms frames. Owns the WebRTC VAD state and its FFT scratch.
pub struct FrameClassifier {
    vad: SendVad,
    config: VadConfig,
    fft: Arc<dyn RealToComplex<f32>>,
    window: Vec<f32>,
    input: Vec<f32>,
    spectrum: Vec<Complex<f32>>,
    scratch: Vec<Complex<f32>>,
    power: Vec<f32>,
}

/// The WebRTC VAD state is a plain heap block owned by this value, with no thread affinity.
struct SendVad(Vad);
// SAFETY: `Vad` holds a pointer to a `Fvad` struct allocated for it alone and touched only
// through `&mut self`; moving it to another thread moves sole ownership of that memory.
unsafe impl Send for SendVad {}

impl std::fmt::Debug for FrameClassifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameClassifier")
            .field("config", &self.config)
            .finish()
    }
}

impl FrameClassifier {
    /// A classifier with the thresholds of `config`.
    pub fn new(config: VadConfig) -> Self {
        let fft = RealFftPlanner::<f32>::new().plan_fft_forward(FFT_LEN);
        let window = (0..FRAME)
            .map(|n| {
                (0.5 - 0.5 * (2.0 * std::f64::consts::PI * n as f64 / FRAME as f64).cos()) as f32
            })
            .collect();
        Self {
            vad: SendVad(Vad::new_with_rate_and_mode(
                SampleRate::Rate8kHz,
                VadMode::VeryAggressive,
            )),
            config,
            input: fft.make_input_vec(),
            spectrum: fft.make_output_vec(),
            scratch: fft.make_scratch_vec(),
            power: vec![0.0; FFT_LEN / 2 + 1],
            window,
            fft,
        }
    }

    /// Classifies one frame of exactly [`FRAME`] samples.
    ///
    /// # Panics
    /// If `frame` is not [`FRAME`] samples long: the segmenter always passes whole frames.
    pub fn classify(&mut self, frame: &[i16]) -> FrameInfo {
        assert_eq!(frame.len(), FRAME, "the classifier takes 20 ms frames");
        let voiced = self
            .vad
            .0
            .is_voice_segment(frame)
            .expect("160 samples is a valid 20 ms frame at 8 kHz");
        let energy: f64 = frame
            .iter()
            .map(|&s| f64::from(s) * f64::from(s))
            .sum::<f64>()
            / FRAME as f64;
        let level_dbfs = (10.0 * (energy.max(1e-3) / (32768.0 * 32768.0)).log10()) as f32;

        for (i, x) in self.input.iter_mut().enumerate() {
            *x = frame.get(i).map_or(0.0, |&s| f32::from(s) * self.window[i]);
        }
        self.fft
            .process_with_scratch(&mut self.input, &mut self.spectrum, &mut self.scratch)
            .expect("buffers come from the plan, so their lengths match");
        for (p, c) in self.power.iter_mut().zip(&self.spectrum) {
            *p = c.norm_sqr();
        }
        // 300-3600 Hz: bins 10..=115 at 31.25 Hz.
        let band = &self.power[BAND_LO..=115];
        let total: f32 = band.iter().sum();
        let (mut first, mut second) = ((0usize, 0.0f32), (0usize, 0.0f32));
        for (i, &p) in band.iter().enumerate() {
            if p > first.1 {
                first = (i, p);
            }
        }
        // A peak is its bin and the two beside it (the Hann main lobe).
        let lobe = |c: usize| {
            band[c.saturating_sub(1)..(c + 2).min(band.len())]
                .iter()
                .sum::<f32>()
        };
        for (i, &p) in band.iter().enumerate() {
            if i.abs_diff(first.0) > 2 && p > second.1 {
                second = (i, p);
            }
        }
        let peaks = lobe(first.0) + if second.1 > 0.0 { lobe(second.0) } else { 0.0 };
        let tonality = if total > 0.0 { peaks / total } else { 0.0 };
        let peak_bin = (first.0 + BAND_LO) as u16;
        let tone = tonality > self.config.max_tonality;
        let speech = voiced && level_dbfs >= self.config.min_level_dbfs && !tone;
        FrameInfo {
            voiced,
            level_dbfs,
            tonality,
            peak_bin,
            tone,
            speech,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct FrameStat {
    speech: bool,
    /// Voiced and loud enough, tonal or not.
    voiced: bool,
    level_dbfs: f32,
    peak_bin: u16,
}

impl FrameStat {
    /// How much of the trailing silence that ends an utterance this frame counts for: none
    /// when it is speech, a frame's length when it is quiet or unvoiced, half of it when it is
    /// voiced and loud but tonal. Such a frame is a held vowel of a steady or synthetic voice
    /// as often as a tone: counted in full, those vowels cut that voice's sentences in two;
    /// counted half, a tone after speech still ends the utterance, after twice the trailing
    /// silence.
    fn pause_ms(&self) -> u32 {
        match (self.speech, self.voiced) {
            (true, _) => 0,
            (false, true) => FRAME_MS / 2,
            (false, false) => FRAME_MS,
        }
    }
}

/// Splits a channel's 8 kHz stream into utterances.
#[derive(Debug)]
pub struct Segmenter {
    config: VadConfig,
    classifier: FrameClassifier,
    /// Samples not yet forming a whole frame.
    partial: Vec<i16>,
    /// Stream index of the next frame's first sample.
    position: u64,
    /// Recent non-speech frames kept as pre-roll while idle.
    pre_roll: Vec<i16>,
    /// The utterance being collected, if any.
    current: Option<Current>,
}

#[derive(Debug)]
struct Current {
    start: u64,
    samples: Vec<i16>,
    frames: Vec<FrameStat>,
    trailing_silence: u32,
    /// Voiced, loud enough frames so far (what `min_speech_ms` counts).
    voiced: u32,
}

impl Segmenter {
    /// A segmenter with `config`.
    pub fn new(config: VadConfig) -> Self {
        Self {
            classifier: FrameClassifier::new(config),
            partial: Vec::with_capacity(FRAME),
            position: 0,
            pre_roll: Vec::with_capacity(Self::ms_to_samples(config.pre_roll_ms)),
            current: None,
            config,
        }
    }

    const fn ms_to_samples(ms: u32) -> usize {
        ms as usize * RATE / 1000
    }

    /// Samples consumed so far (the stream position).
    pub fn position(&self) -> u64 {
        self.position + self.partial.len() as u64
    }

    /// Feeds samples; finished utterances are passed to `emit` in order.
    pub fn push(&mut self, mut samples: &[i16], emit: &mut impl FnMut(Utterance)) {
        if !self.partial.is_empty() {
            let take = (FRAME - self.partial.len()).min(samples.len());
            self.partial.extend_from_slice(&samples[..take]);
            samples = &samples[take..];
            if self.partial.len() < FRAME {
                return;
            }
            let frame: [i16; FRAME] = self.partial[..].try_into().expect("exactly one frame");
            self.partial.clear();
            self.frame(&frame, emit);
        }
        let mut frames = samples.chunks_exact(FRAME);
        for frame in &mut frames {
            self.frame(frame, emit);
        }
        self.partial.extend_from_slice(frames.remainder());
    }

    /// Ends the stream: a pending utterance is finished (if it qualifies) and emitted.
    pub fn finish(&mut self, emit: &mut impl FnMut(Utterance)) {
        if let Some(current) = self.current.take() {
            self.emit_if_speech(current, emit);
        }
        self.position += self.partial.len() as u64;
        self.partial.clear();
        self.pre_roll.clear();
    }

    fn frame(&mut self, frame: &[i16], emit: &mut impl FnMut(Utterance)) {
        let info = self.classifier.classify(frame);
        let stat = FrameStat {
            speech: info.speech,
            voiced: info.voiced && info.level_dbfs >= self.config.min_level_dbfs,
            level_dbfs: info.level_dbfs,
            peak_bin: info.peak_bin,
        };
        let frame_start = self.position;
        self.position += FRAME as u64;
        match &mut self.current {
            None if stat.speech => {
                let pre = self.pre_roll.len();
                let mut samples =
                    Vec::with_capacity(Self::ms_to_samples(self.config.max_utterance_ms));
                samples.extend_from_slice(&self.pre_roll);
                samples.extend_from_slice(frame);
                let mut frames = vec![
                    FrameStat {
                        speech: false,
                        voiced: false,
                        level_dbfs: -100.0,
                        peak_bin: 0
                    };
                    pre / FRAME
                ];
                frames.push(stat);
                self.pre_roll.clear();
                self.current = Some(Current {
                    start: frame_start - pre as u64,
                    samples,
                    frames,
                    trailing_silence: 0,
                    voiced: u32::from(stat.voiced),
                });
            }
            None => {
                let keep = Self::ms_to_samples(self.config.pre_roll_ms);
                if keep > 0 {
                    if self.pre_roll.len() + FRAME > keep {
                        let excess = (self.pre_roll.len() + FRAME)
                            .saturating_sub(keep)
                            .min(self.pre_roll.len());
                        self.pre_roll.drain(..excess);
                    }
                    self.pre_roll
                        .extend_from_slice(&frame[FRAME.saturating_sub(keep)..]);
                }
            }
            Some(current) => {
                current.samples.extend_from_slice(frame);
                current.frames.push(stat);
                current.voiced += u32::from(stat.voiced);
                current.trailing_silence = if stat.speech {
                    0
                } else {
                    current.trailing_silence + stat.pause_ms()
                };
                let ends = if short_of_speech(current.voiced, &self.config) {
                    self.config.trailing_silence_ms.max(SHORT_HOLD_MS)
                } else {
                    self.config.trailing_silence_ms
                };
                if current.trailing_silence >= ends {
                    let done = self.current.take().expect("matched Some above");
                    self.emit_if_speech(done, emit);
                } else if current.samples.len() >= Self::ms_to_samples(self.config.max_utterance_ms)
                {
                    self.split_long(emit);
                }
            }
        }
    }

    /// Splits the current utterance at its quietest frame in the last third, emits the first
    /// part and keeps collecting the rest.
    fn split_long(&mut self, emit: &mut impl FnMut(Utterance)) {
        let mut current = self
            .current
            .take()
            .expect("called with an utterance in progress");
        let n = current.frames.len();
        let from = (2 * n / 3).max(1);
        let cut = (from..n)
            .min_by(|&a, &b| {
                current.frames[a]
                    .level_dbfs
                    .total_cmp(&current.frames[b].level_dbfs)
            })
            .unwrap_or(n);
        let rest_samples = current.samples.split_off(cut * FRAME);
        let rest_frames = current.frames.split_off(cut);
        let rest_start = current.start + (cut * FRAME) as u64;
        self.emit_if_speech(current, emit);
        let trailing = rest_frames
            .iter()
            .rev()
            .take_while(|f| !f.speech)
            .map(FrameStat::pause_ms)
            .sum();
        let voiced = rest_frames.iter().filter(|f| f.voiced).count() as u32;
        let mut samples = Vec::with_capacity(Self::ms_to_samples(self.config.max_utterance_ms));
        samples.extend_from_slice(&rest_samples);
        self.current = Some(Current {
            start: rest_start,
            samples,
            frames: rest_frames,
            trailing_silence: trailing,
            voiced,
        });
    }

    fn emit_if_speech(&self, mut current: Current, emit: &mut impl FnMut(Utterance)) {
        // Keep 400 ms of the trailing non-speech (a quiet last word can be in it); drop the
        // rest.
        let keep_tail = (TAIL_MS / FRAME_MS) as usize;
        let trailing = current
            .frames
            .iter()
            .rev()
            .take_while(|f| !f.speech)
            .count();
        if trailing > keep_tail {
            let cut = current.frames.len() - (trailing - keep_tail);
            current.frames.truncate(cut);
            current.samples.truncate(cut * FRAME);
        }
        if is_speech(&current.frames, &self.config) {
            emit(Utterance {
                start: current.start,
                samples: current.samples,
            });
        }
    }
}

/// Whether `voiced` voiced, loud enough frames are less speech than an utterance needs
/// (`min_speech_ms`).
fn short_of_speech(voiced: u32, config: &VadConfig) -> bool {
    voiced * FRAME_MS < config.min_speech_ms
}

/// Utterance-level decision over the frames of a candidate.
///
/// The speech it needs (`min_speech_ms`) counts every voiced, loud enough frame, tonal ones
/// included: a short, clear word can be mostly vowels peaky enough to look like tones (it
/// started the utterance with a frame that was not). Tones alone never start an utterance.
fn is_speech(frames: &[FrameStat], config: &VadConfig) -> bool {
    let voiced = frames.iter().filter(|f| f.voiced).count() as u32;
    if short_of_speech(voiced, config) {
        return false;
    }
    let speech: Vec<&FrameStat> = frames.iter().filter(|f| f.speech).collect();
    if speech.len() < MIN_CLEAR_FRAMES {
        return false;
    }
    // Music holds a note: its strongest peak stays in one bin from frame to frame far more
    // often than a voice, whose pitch and formants move all the time.
    let held = speech
        .windows(2)
        .filter(|w| w[0].peak_bin == w[1].peak_bin)
        .count();
    let held_share = held as f32 / (speech.len() - 1).max(1) as f32;
    held_share < 0.6
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(samples: &[i16], config: VadConfig) -> Vec<Utterance> {
        let mut seg = Segmenter::new(config);
        let mut out = Vec::new();
        // Odd chunk sizes: segmentation must not depend on how audio arrives.
        for chunk in samples.chunks(333) {
            seg.push(chunk, &mut |u| out.push(u));
        }
        seg.finish(&mut |u| out.push(u));
        out
    }

    fn tone(freqs: &[f64], seconds: f64, amplitude: f64) -> Vec<i16> {
        let n = (seconds * RATE as f64) as usize;
        (0..n)
            .map(|i| {
                let t = i as f64 / RATE as f64;
                let v: f64 = freqs
                    .iter()
                    .map(|f| (2.0 * std::f64::consts::PI * f * t).sin())
                    .sum();
                (amplitude * 32767.0 * v / freqs.len() as f64) as i16
            })
            .collect()
    }

    #[test]
    fn silence_and_tones_give_nothing() {
        assert!(segment(&vec![0; 8_000 * 5], VadConfig::default()).is_empty());
        // DTMF "5" (770 + 1336 Hz) held for 2 s, and the 440 + 480 Hz ringback tone.
        assert!(segment(&tone(&[770.0, 1336.0], 2.0, 0.5), VadConfig::default()).is_empty());
        assert!(segment(&tone(&[440.0, 480.0], 2.0, 0.5), VadConfig::default()).is_empty());
    }

    #[test]
    fn position_counts_every_sample() {
        let mut seg = Segmenter::new(VadConfig::default());
        seg.push(&[0; 1234], &mut |_| {});
        assert_eq!(seg.position(), 1234);
        seg.finish(&mut |_| {});
        assert_eq!(seg.position(), 1234);
    }
}
