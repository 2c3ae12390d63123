//! Whisper's log-mel front end, computed exactly as Whisper's reference does it.
//!
//! 16 kHz mono audio is padded (or cut) to 30 s, reflect-padded by `N_FFT / 2` at both ends,
//! framed with a periodic Hann window of 400 samples every 160 samples, turned into a power
//! spectrum, mapped through 80 Slaney-normalised mel filters up to 8 kHz, and compressed:
//! `log10(max(x, 1e-10))`, clamped to `max - 8`, then `(x + 4) / 4`. The last STFT frame is
//! dropped, giving 3000 frames.
//!
//! Frames that see only the zero padding have an exactly known value, so they are filled in
//! instead of transformed: a 5 s utterance costs a sixth of a full window.

use std::sync::Arc;

use realfft::num_complex::Complex;
use realfft::{RealFftPlanner, RealToComplex};

/// Sample rate of the features' input.
pub const SAMPLE_RATE: usize = 16_000;
/// FFT length (25 ms).
pub const N_FFT: usize = 400;
/// Hop between frames (10 ms).
pub const HOP: usize = 160;
/// Mel bands.
pub const N_MELS: usize = 80;
/// Samples in Whisper's 30 s window.
pub const CHUNK_SAMPLES: usize = 30 * SAMPLE_RATE;
/// Frames in Whisper's 30 s window.
pub const N_FRAMES: usize = CHUNK_SAMPLES / HOP;
const N_BINS: usize = N_FFT / 2 + 1;
const LOG_FLOOR: f32 = -10.0; // log10(1e-10)

/// One mel filter: its first FFT bin and its non-zero weights.
struct Filter {
    start: usize,
    weights: Vec<f32>,
}

/// Computes log-mel features; holds its FFT plan and scratch buffers so that computing does not
/// allocate.
pub struct LogMel {
    fft: Arc<dyn RealToComplex<f32>>,
    window: Vec<f32>,
    filters: Vec<Filter>,
    frame: Vec<f32>,
    spectrum: Vec<Complex<f32>>,
    scratch: Vec<Complex<f32>>,
    power: Vec<f32>,
}

impl Default for LogMel {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for LogMel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LogMel")
    }
}

// Slaney's mel scale: linear below 1 kHz (200/3 Hz per mel), logarithmic above.
const F_SP: f64 = 200.0 / 3.0;
const MIN_LOG_HZ: f64 = 1000.0;
const MIN_LOG_MEL: f64 = MIN_LOG_HZ / F_SP;

fn log_step() -> f64 {
    6.4f64.ln() / 27.0
}

fn hz_to_mel(hz: f64) -> f64 {
    if hz >= MIN_LOG_HZ {
        MIN_LOG_MEL + (hz / MIN_LOG_HZ).ln() / log_step()
    } else {
        hz / F_SP
    }
}

fn mel_to_hz(mel: f64) -> f64 {
    if mel >= MIN_LOG_MEL {
        MIN_LOG_HZ * (log_step() * (mel - MIN_LOG_MEL)).exp()
    } else {
        F_SP * mel
    }
}

/// The Slaney mel filterbank of librosa (`htk=False, norm="slaney"`), 0 Hz to 8 kHz.
fn filterbank() -> Vec<Filter> {
    let max_mel = hz_to_mel(SAMPLE_RATE as f64 / 2.0);
    let mel_f: Vec<f64> = (0..N_MELS + 2)
        .map(|i| mel_to_hz(max_mel * i as f64 / (N_MELS + 1) as f64))
        .collect();
    let fft_freq = |k: usize| k as f64 * SAMPLE_RATE as f64 / N_FFT as f64;
    (0..N_MELS)
        .map(|m| {
            let (lo, center, hi) = (mel_f[m], mel_f[m + 1], mel_f[m + 2]);
            let enorm = 2.0 / (hi - lo);
            let weight = |k: usize| {
                let f = fft_freq(k);
                let rising = (f - lo) / (center - lo);
                let falling = (hi - f) / (hi - center);
                (rising.min(falling).max(0.0) * enorm) as f32
            };
            let all: Vec<f32> = (0..N_BINS).map(weight).collect();
            let start = all.iter().position(|&w| w > 0.0).unwrap_or(0);
            let end = all.iter().rposition(|&w| w > 0.0).map_or(start, |e| e + 1);
            Filter {
                start,
                weights: all[start..end].to_vec(),
            }
        })
        .collect()
}

impl LogMel {
    /// Plans the FFT and builds the window and filters.
    pub fn new() -> Self {
        let fft = RealFftPlanner::<f32>::new().plan_fft_forward(N_FFT);
        let scratch = fft.make_scratch_vec();
        let window = (0..N_FFT)
            .map(|n| {
                (0.5 - 0.5 * (2.0 * std::f64::consts::PI * n as f64 / N_FFT as f64).cos()) as f32
            })
            .collect();
        Self {
            spectrum: fft.make_output_vec(),
            frame: fft.make_input_vec(),
            fft,
            window,
            filters: filterbank(),
            scratch,
            power: vec![0.0; N_BINS],
        }
    }

    /// Length of the output of [`LogMel::compute_into`] for a full 30 s window: 80 x 3000.
    pub const fn output_len() -> usize {
        N_MELS * N_FRAMES
    }

    /// Frames of a window that holds `samples` of audio and is at least `min_frames` long:
    /// an even number (the encoder halves it), at most 3000 (30 s).
    pub fn window_frames(samples: usize, min_frames: usize) -> usize {
        let needed = samples.div_ceil(HOP).max(min_frames).max(2);
        (needed + needed % 2).min(N_FRAMES)
    }

    /// Computes the features of `audio` (16 kHz mono) into `out`, mel-major
    /// (`out[m * frames + t]`, `frames = out.len() / 80`), as Whisper's encoder takes them.
    ///
    /// The window is the first `frames` frames of Whisper's 30 s window: the audio padded with
    /// zeros to 30 s (anything past 30 s is ignored), so a shorter window gives exactly the
    /// features the full one starts with. CTranslate2's encoder accepts such shorter windows,
    /// and its cost falls with their length.
    ///
    /// # Panics
    /// If `out` is not a whole number (2 to 3000) of 80-value frames: the caller sizes it.
    pub fn compute_into(&mut self, audio: &[f32], out: &mut [f32]) {
        let frames = out.len() / N_MELS;
        assert!(
            out.len().is_multiple_of(N_MELS) && (1..=N_FRAMES).contains(&frames),
            "output buffer must be 80 x (1 to 3000) values"
        );
        let audio = &audio[..audio.len().min(CHUNK_SAMPLES)];
        let pad = N_FFT / 2;
        // Frame t covers padded positions [t*HOP - pad, t*HOP + pad) of the 30 s signal. Past
        // this frame every window holds only zeros (the audio is shorter than 30 s).
        let live_frames = if audio.len() + pad >= CHUNK_SAMPLES {
            N_FRAMES
        } else {
            ((audio.len() + pad).div_ceil(HOP)).min(N_FRAMES)
        }
        .min(frames);
        let sample = |i: isize| -> f32 {
            let n = CHUNK_SAMPLES as isize;
            let j = if i < 0 {
                -i
            } else if i >= n {
                2 * n - 2 - i
            } else {
                i
            };
            audio.get(j as usize).copied().unwrap_or(0.0)
        };
        let mut max = f32::NEG_INFINITY;
        for t in 0..live_frames {
            let origin = (t * HOP) as isize - pad as isize;
            for (n, x) in self.frame.iter_mut().enumerate() {
                *x = sample(origin + n as isize) * self.window[n];
            }
            self.fft
                .process_with_scratch(&mut self.frame, &mut self.spectrum, &mut self.scratch)
                .expect("buffers come from the plan, so their lengths match");
            for (p, c) in self.power.iter_mut().zip(&self.spectrum) {
                *p = c.norm_sqr();
            }
            for (m, filter) in self.filters.iter().enumerate() {
                let bins = &self.power[filter.start..filter.start + filter.weights.len()];
                let energy: f32 = bins.iter().zip(&filter.weights).map(|(p, w)| p * w).sum();
                let v = energy.max(1e-10).log10();
                max = max.max(v);
                out[m * frames + t] = v;
            }
        }
        // The 30 s window's padding frames are at the floor and count towards its maximum.
        if live_frames < N_FRAMES {
            max = max.max(LOG_FLOOR);
        }
        let floor = max - 8.0;
        for m in 0..N_MELS {
            let row = &mut out[m * frames..(m + 1) * frames];
            for v in &mut row[..live_frames] {
                *v = (v.max(floor) + 4.0) / 4.0;
            }
            row[live_frames..].fill((LOG_FLOOR.max(floor) + 4.0) / 4.0);
        }
    }

    /// Allocating convenience around [`LogMel::compute_into`].
    pub fn compute(&mut self, audio: &[f32]) -> Vec<f32> {
        let mut out = vec![0.0; Self::output_len()];
        self.compute_into(audio, &mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test signal of `fixtures/mel/make_reference.py`: a 300 Hz to 3 kHz chirp with a
    /// second harmonic, 2 s long.
    fn chirp() -> Vec<f32> {
        let n = 2 * SAMPLE_RATE;
        (0..n)
            .map(|i| {
                let t = i as f64 / SAMPLE_RATE as f64;
                let phase = 2.0 * std::f64::consts::PI * (300.0 * t + 0.25 * 2700.0 * t * t);
                (0.5 * phase.sin() + 0.2 * (2.0 * phase).sin()) as f32
            })
            .collect()
    }

    fn reference() -> Vec<f32> {
        let path =
            crate::package_dir(env!("CARGO_MANIFEST_DIR")).join("../fixtures/mel/chirp_logmel.f32");
        std::fs::read(path)
            .unwrap()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }

    #[test]
    fn matches_the_reference_features() {
        // The reference keeps the first 256 frames of each band; the rest is the floor.
        const KEPT: usize = 256;
        let ours = LogMel::new().compute(&chirp());
        let reference = reference();
        assert_eq!(reference.len(), N_MELS * KEPT);
        let floor = reference.iter().copied().fold(f32::INFINITY, f32::min);
        let mut worst = 0.0f32;
        for m in 0..N_MELS {
            let row = &ours[m * N_FRAMES..(m + 1) * N_FRAMES];
            for (a, b) in row[..KEPT].iter().zip(&reference[m * KEPT..(m + 1) * KEPT]) {
                worst = worst.max((a - b).abs());
            }
            for a in &row[KEPT..] {
                worst = worst.max((a - floor).abs());
            }
        }
        assert!(
            worst < 2e-3,
            "largest difference from the reference: {worst}"
        );
    }

    #[test]
    fn a_short_window_is_the_start_of_the_full_one() {
        let audio = chirp();
        let mut mel = LogMel::new();
        let full = mel.compute(&audio);
        let frames = LogMel::window_frames(audio.len(), 1000);
        assert_eq!(frames, 1000);
        let mut short = vec![0.0; N_MELS * frames];
        mel.compute_into(&audio, &mut short);
        for m in 0..N_MELS {
            assert_eq!(
                &short[m * frames..(m + 1) * frames],
                &full[m * N_FRAMES..m * N_FRAMES + frames]
            );
        }
    }

    #[test]
    fn window_frames_cover_the_audio_within_bounds() {
        assert_eq!(LogMel::window_frames(0, 1000), 1000);
        assert_eq!(LogMel::window_frames(12 * SAMPLE_RATE, 1000), 1200);
        assert_eq!(LogMel::window_frames(12 * SAMPLE_RATE + 1, 1000), 1202);
        assert_eq!(LogMel::window_frames(45 * SAMPLE_RATE, 1000), N_FRAMES);
        assert_eq!(LogMel::window_frames(100, 0), 2);
    }

    #[test]
    fn silence_is_the_floor_everywhere() {
        let out = LogMel::new().compute(&[]);
        assert!(out.iter().all(|&v| v == (-10.0 + 4.0) / 4.0));
    }

    #[test]
    fn filters_are_slaney_normalised_triangles() {
        let filters = filterbank();
        assert_eq!(filters.len(), N_MELS);
        // The first filter peaks near 40 Hz (bin 1); filters move up monotonically.
        assert_eq!(filters[0].start, 1);
        assert!(filters.windows(2).all(|w| w[0].start <= w[1].start));
        let last = filters.last().unwrap();
        assert!(last.start + last.weights.len() <= N_BINS);
    }
}
