//! 8 kHz to 16 kHz for the speech engine, with rubato's FFT resampler (its anti-imaging filter
//! keeps the spectral image of telephone audio, 4-8 kHz, out of Whisper's input).

use rubato::{FftFixedIn, FftFixedInOut, Resampler};

/// Input rate: telephone audio.
pub const INPUT_RATE: usize = 8_000;
/// Output rate: Whisper's.
pub const OUTPUT_RATE: usize = 16_000;
/// Input samples per resampler chunk (20 ms).
const CHUNK_IN: usize = 160;

/// Why the resampler failed.
#[derive(Debug, thiserror::Error)]
#[error("resampler: {0}")]
pub struct ResampleError(String);

/// Upsamples 8 kHz utterances to 16 kHz. Holds its buffers; after the first utterance of a
/// given length, resampling another no longer allocates.
pub struct Upsampler {
    inner: FftFixedInOut<f32>,
    chunk_in: usize,
    input: Vec<Vec<f32>>,
    output: Vec<Vec<f32>>,
}

impl std::fmt::Debug for Upsampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upsampler")
            .field("chunk_in", &self.chunk_in)
            .finish()
    }
}

impl Upsampler {
    /// An 8 -> 16 kHz resampler.
    pub fn new() -> Result<Self, ResampleError> {
        let inner = FftFixedInOut::<f32>::new(INPUT_RATE, OUTPUT_RATE, CHUNK_IN, 1)
            .map_err(|e| ResampleError(e.to_string()))?;
        let chunk_in = inner.input_frames_max();
        let out_max = inner.output_frames_max();
        Ok(Self {
            inner,
            chunk_in,
            input: vec![vec![0.0; chunk_in]],
            output: vec![vec![0.0; out_max]],
        })
    }

    /// Output samples for `input_len` input samples.
    pub const fn output_len(input_len: usize) -> usize {
        input_len * (OUTPUT_RATE / INPUT_RATE)
    }

    /// Resamples one whole utterance of 8 kHz samples into `out` (replaced), as f32 in
    /// [-1, 1] at 16 kHz, exactly twice as long and aligned in time with the input (the
    /// resampler's delay is removed).
    pub fn utterance_into(
        &mut self,
        input: &[i16],
        out: &mut Vec<f32>,
    ) -> Result<(), ResampleError> {
        self.inner.reset();
        out.clear();
        let want = Self::output_len(input.len());
        let delay = self.inner.output_delay();
        let mut skip = delay;
        let mut pos = 0;
        // Feed the input, then zeros until the delayed tail has come out.
        while out.len() < want {
            let buf = &mut self.input[0];
            let take = input.len().saturating_sub(pos).min(self.chunk_in);
            for (b, &s) in buf[..take].iter_mut().zip(&input[pos..pos + take]) {
                *b = f32::from(s) / 32768.0;
            }
            buf[take..].fill(0.0);
            pos += take;
            let (_, produced) = self
                .inner
                .process_into_buffer(&self.input, &mut self.output, None)
                .map_err(|e| ResampleError(e.to_string()))?;
            let chunk = &self.output[0][..produced];
            let drop = skip.min(chunk.len());
            skip -= drop;
            let room = want - out.len();
            out.extend_from_slice(&chunk[drop..][..room.min(chunk.len() - drop)]);
        }
        Ok(())
    }
}

/// Resamples whole signals (one `Vec` per channel) from `from` Hz to `to` Hz, offline: for
/// files, not for the live path. The output is aligned with the input and
/// `round(len * to / from)` long.
pub fn resample_offline(
    channels: &[Vec<f32>],
    from: usize,
    to: usize,
) -> Result<Vec<Vec<f32>>, ResampleError> {
    if from == to || channels.is_empty() {
        return Ok(channels.to_vec());
    }
    let len = channels[0].len();
    let want = ((len as u128 * to as u128 + from as u128 / 2) / from as u128) as usize;
    let mut inner = FftFixedIn::<f32>::new(from, to, 1024, 2, channels.len())
        .map_err(|e| ResampleError(e.to_string()))?;
    let delay = inner.output_delay();
    let mut out: Vec<Vec<f32>> = vec![Vec::with_capacity(want + delay); channels.len()];
    let mut output = inner.output_buffer_allocate(true);
    let mut input = inner.input_buffer_allocate(true);
    let mut pos = 0;
    while out[0].len() < want + delay {
        let need = inner.input_frames_next();
        let take = len.saturating_sub(pos).min(need);
        for (buf, ch) in input.iter_mut().zip(channels) {
            buf.clear();
            buf.extend_from_slice(&ch[pos..pos + take]);
            buf.resize(need, 0.0);
        }
        pos += take;
        let (_, produced) = inner
            .process_into_buffer(&input, &mut output, None)
            .map_err(|e| ResampleError(e.to_string()))?;
        for (o, buf) in out.iter_mut().zip(&output) {
            o.extend_from_slice(&buf[..produced]);
        }
    }
    for o in &mut out {
        o.drain(..delay);
        o.truncate(want);
    }
    Ok(out)
}

/// Resamples signals (one per channel) from `from` Hz to `to` Hz as they arrive, block by
/// block, for files read a packet at a time. The output is aligned with the input (the
/// resampler's delay is removed) and, after [`StreamResampler::finish`], `round(len * to /
/// from)` long, as [`resample_offline`] gives it; memory is one chunk, whatever the length.
pub struct StreamResampler {
    inner: Option<FftFixedIn<f32>>,
    from: usize,
    to: usize,
    pending: Vec<Vec<f32>>,
    input: Vec<Vec<f32>>,
    output: Vec<Vec<f32>>,
    skip: usize,
    consumed: u64,
    produced: u64,
}

impl std::fmt::Debug for StreamResampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamResampler")
            .field("from", &self.from)
            .field("to", &self.to)
            .finish()
    }
}

impl StreamResampler {
    /// A resampler of `channels` signals from `from` Hz to `to` Hz.
    pub fn new(from: usize, to: usize, channels: usize) -> Result<Self, ResampleError> {
        if from == 0 || to == 0 || channels == 0 {
            return Err(ResampleError(format!(
                "cannot resample {channels} channels from {from} Hz to {to} Hz"
            )));
        }
        let inner = if from == to {
            None
        } else {
            Some(
                FftFixedIn::<f32>::new(from, to, 1024, 2, channels)
                    .map_err(|e| ResampleError(e.to_string()))?,
            )
        };
        let (input, output, skip) = match &inner {
            Some(r) => (
                r.input_buffer_allocate(true),
                r.output_buffer_allocate(true),
                r.output_delay(),
            ),
            None => (Vec::new(), Vec::new(), 0),
        };
        Ok(Self {
            inner,
            from,
            to,
            pending: vec![Vec::new(); channels],
            input,
            output,
            skip,
            consumed: 0,
            produced: 0,
        })
    }

    /// Output samples `input` frames of input come to in all.
    fn want(&self) -> u64 {
        ((u128::from(self.consumed) * self.to as u128 + self.from as u128 / 2) / self.from as u128)
            as u64
    }

    /// Resamples `block` (one slice per channel, equally long), appending to `out`.
    pub fn push<B: AsRef<[f32]>>(
        &mut self,
        block: &[B],
        out: &mut [Vec<f32>],
    ) -> Result<(), ResampleError> {
        let frames = block.first().map_or(0, |b| b.as_ref().len());
        self.consumed += frames as u64;
        if self.inner.is_none() {
            for (o, b) in out.iter_mut().zip(block) {
                o.extend_from_slice(b.as_ref());
            }
            self.produced += frames as u64;
            return Ok(());
        }
        for (p, b) in self.pending.iter_mut().zip(block) {
            p.extend_from_slice(b.as_ref());
        }
        self.drain(out, false)
    }

    /// Flushes what is left, so the output is exactly as long as the input says.
    pub fn finish(&mut self, out: &mut [Vec<f32>]) -> Result<(), ResampleError> {
        if self.inner.is_some() {
            self.drain(out, true)?;
        }
        Ok(())
    }

    fn drain(&mut self, out: &mut [Vec<f32>], flush: bool) -> Result<(), ResampleError> {
        let want = self.want();
        let inner = self.inner.as_mut().expect("only called with a resampler");
        // Chunks are read from `from` on and the pending input is shortened once at the end:
        // shortening it chunk by chunk would move the rest of a long block every time.
        let mut from = 0;
        loop {
            let need = inner.input_frames_next();
            let have = self.pending[0].len() - from;
            if (have < need && !flush) || (flush && self.produced >= want) {
                for p in &mut self.pending {
                    p.drain(..from);
                }
                return Ok(());
            }
            let take = have.min(need);
            for (buf, p) in self.input.iter_mut().zip(&self.pending) {
                buf.clear();
                buf.extend_from_slice(&p[from..from + take]);
                buf.resize(need, 0.0);
            }
            from += take;
            let (_, made) = inner
                .process_into_buffer(&self.input, &mut self.output, None)
                .map_err(|e| ResampleError(e.to_string()))?;
            let drop = self.skip.min(made);
            self.skip -= drop;
            let mut keep = made - drop;
            if flush {
                keep = keep.min((want - self.produced) as usize);
            }
            for (o, buf) in out.iter_mut().zip(&self.output) {
                o.extend_from_slice(&buf[drop..drop + keep]);
            }
            self.produced += keep as u64;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tone(freq: f64, amplitude: f64, seconds: f64) -> Vec<i16> {
        let n = (seconds * INPUT_RATE as f64) as usize;
        (0..n)
            .map(|i| {
                let t = i as f64 / INPUT_RATE as f64;
                (amplitude * 32767.0 * (2.0 * std::f64::consts::PI * freq * t).sin()).round() as i16
            })
            .collect()
    }

    /// Amplitude of the `freq` component of `x` (sampled at `rate`), by the Goertzel algorithm.
    fn amplitude_at(x: &[f32], rate: f64, freq: f64) -> f64 {
        let w = 2.0 * std::f64::consts::PI * freq / rate;
        let (mut s1, mut s2) = (0.0f64, 0.0f64);
        for &v in x {
            let s = f64::from(v) + 2.0 * w.cos() * s1 - s2;
            s2 = s1;
            s1 = s;
        }
        let power = s1 * s1 + s2 * s2 - 2.0 * w.cos() * s1 * s2;
        2.0 * power.sqrt() / x.len() as f64
    }

    #[test]
    fn output_is_twice_as_long() {
        let mut up = Upsampler::new().unwrap();
        let mut out = Vec::new();
        for n in [0, 1, 159, 160, 161, 8_000, 12_345] {
            up.utterance_into(&vec![100; n], &mut out).unwrap();
            assert_eq!(out.len(), 2 * n);
        }
    }

    #[test]
    fn a_1khz_tone_keeps_frequency_and_level_without_images() {
        let mut up = Upsampler::new().unwrap();
        let mut out = Vec::new();
        up.utterance_into(&tone(1000.0, 0.5, 1.0), &mut out)
            .unwrap();
        // Skip the edges, where the tone starts and stops.
        let mid = &out[1600..out.len() - 1600];
        let rate = OUTPUT_RATE as f64;
        let level = amplitude_at(mid, rate, 1000.0);
        assert!((level - 0.5).abs() < 0.01, "1 kHz level {level}");
        // Neighbouring frequencies carry next to nothing: the frequency did not move.
        assert!(amplitude_at(mid, rate, 950.0) < 0.01 * level);
        assert!(amplitude_at(mid, rate, 1050.0) < 0.01 * level);
        // The spectral image at 8 kHz - 1 kHz = 7 kHz, and anything above 4 kHz, stays low.
        for f in [4_500.0, 6_000.0, 7_000.0, 7_500.0] {
            let image = amplitude_at(mid, rate, f);
            assert!(image < 1e-3 * level, "{f} Hz at {image} (tone {level})");
        }
    }

    #[test]
    fn offline_resampling_keeps_length_level_and_timing() {
        let input: Vec<f32> = tone(440.0, 0.5, 2.0)
            .iter()
            .map(|&s| f32::from(s) / 32768.0)
            .collect();
        let stereo = vec![input.clone(), input.iter().map(|v| -v).collect()];
        let out = resample_offline(&stereo, 8_000, 44_100).unwrap();
        assert_eq!(out[0].len(), 2 * 44_100);
        let level = amplitude_at(&out[0][4410..out[0].len() - 4410], 44_100.0, 440.0);
        assert!((level - 0.5).abs() < 0.01, "{level}");
        assert!((out[0][20_000] + out[1][20_000]).abs() < 1e-6);
        let back = resample_offline(&out, 44_100, 8_000).unwrap();
        assert_eq!(back[0].len(), input.len());
        let err = back[0][800..15_000]
            .iter()
            .zip(&input[800..15_000])
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        // Within a tenth of a sample of alignment at 8 kHz: 3% of the amplitude at 440 Hz.
        assert!(err < 0.03, "round trip error {err}");
    }

    #[test]
    fn aligned_in_time() {
        // A click at 0.5 s comes out at 0.5 s.
        let mut input = vec![0i16; 8_000];
        input[4_000] = 20_000;
        let mut up = Upsampler::new().unwrap();
        let mut out = Vec::new();
        up.utterance_into(&input, &mut out).unwrap();
        let peak = out
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.abs().total_cmp(&b.1.abs()))
            .unwrap()
            .0;
        assert!((peak as i64 - 8_000).abs() <= 2, "peak at {peak}");
    }

    #[test]
    fn streaming_resampling_matches_offline() {
        let input: Vec<f32> = tone(440.0, 0.5, 3.0)
            .iter()
            .map(|&s| f32::from(s) / 32768.0)
            .collect();
        let stereo = vec![input.clone(), input.iter().map(|v| -v).collect()];
        for (from, to) in [
            (8_000, 16_000),
            (8_000, 44_100),
            (44_100, 16_000),
            (16_000, 16_000),
        ] {
            let signal = resample_offline(&stereo, 8_000, from).unwrap();
            let offline = resample_offline(&signal, from, to).unwrap();
            let mut streamed = vec![Vec::new(); 2];
            let mut r = StreamResampler::new(from, to, 2).unwrap();
            // Odd block sizes, as packets come.
            let mut pos = 0;
            for size in [1usize, 997, 4096, 333].iter().cycle() {
                if pos >= signal[0].len() {
                    break;
                }
                let end = (pos + size).min(signal[0].len());
                let block: Vec<Vec<f32>> = signal.iter().map(|c| c[pos..end].to_vec()).collect();
                r.push(&block, &mut streamed).unwrap();
                pos = end;
            }
            r.finish(&mut streamed).unwrap();
            assert_eq!(streamed[0].len(), offline[0].len(), "{from} -> {to}");
            let err = streamed[0]
                .iter()
                .zip(&offline[0])
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(err < 1e-3, "{from} -> {to}: {err}");
            assert!((streamed[0][1000] + streamed[1][1000]).abs() < 1e-6);
            // The whole signal in one block (a recording already in memory) gives the same.
            let mut whole = vec![Vec::new(); 2];
            let mut r = StreamResampler::new(from, to, 2).unwrap();
            r.push(&signal, &mut whole).unwrap();
            r.finish(&mut whole).unwrap();
            assert_eq!(whole, streamed, "{from} -> {to}");
        }
        assert!(StreamResampler::new(0, 16_000, 1).is_err());
    }
}
