//! Transcribing whole recordings, streamed: the file is decoded a packet at a time, each
//! channel is resampled to 16 kHz and cut into utterances by the VAD as the audio arrives, and
//! every utterance goes to the worker pool as file work (so all workers decode in parallel and
//! live calls keep priority) while the file is still being read. The results come back as
//! timed segments in time order.
//!
//! Memory is bounded whatever the file's length: per channel, the last
//! `max_utterance + pre-roll + trailing silence` (plus a second) of 16 kHz audio, one window
//! being packed, and the pool's bounded file queue, which makes reading wait while the
//! workers are busy.
//!
//! **Packed windows.** Whisper's encoder costs the same for a 2 s utterance padded to its
//! window as for a window full of speech, so a channel's utterances are packed, in order,
//! into windows of up to [`Packing::window_secs`] with [`Packing::gap_secs`] of silence
//! between them, and each window is decoded once. Its words (timed by the alignment) are
//! handed back to the utterances they fall in and moved to the recording's time line, so each
//! utterance is still one segment.

use std::collections::VecDeque;
use std::sync::mpsc;

use super::pool::{AsrPool, Job};
use super::{AsrError, Word};
use crate::audio::decode::{DecodeError, FileDecoder};
use crate::audio::resample::{ResampleError, StreamResampler};
use crate::audio::vad::{self, Segmenter, Utterance, VadConfig};

/// Rate of the audio handed to the engine.
const RATE: usize = 16_000;

/// One transcribed utterance of a recording.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FileSegment {
    /// Channel index in the file.
    pub channel: usize,
    /// Start, seconds from the start of the recording.
    pub start: f64,
    /// End, seconds from the start of the recording.
    pub end: f64,
    /// The text.
    pub text: String,
    /// 0 to 1.
    pub confidence: f32,
    /// Words with times from the start of the recording.
    pub words: Vec<Word>,
}

/// How a file's utterances are packed into encoder windows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Packing {
    /// Longest window, seconds (at most 30, Whisper's); 0 decodes each utterance alone.
    pub window_secs: f64,
    /// Silence between two utterances in a window, seconds.
    pub gap_secs: f64,
}

impl Default for Packing {
    fn default() -> Self {
        Self {
            window_secs: 30.0,
            gap_secs: 0.3,
        }
    }
}

impl Packing {
    /// Each utterance decoded alone, in its own window.
    pub const OFF: Packing = Packing {
        window_secs: 0.0,
        gap_secs: 0.0,
    };
}

/// One utterance inside a decoded window.
#[derive(Debug, Clone, Copy)]
struct Piece {
    /// Where it starts in the window, samples.
    at: usize,
    /// Where it starts in the recording, samples.
    start: usize,
    /// Its length, samples.
    len: usize,
}

/// A channel's window being filled.
#[derive(Debug, Default)]
struct Pack {
    audio: Vec<f32>,
    pieces: Vec<Piece>,
}

/// A transcribed recording.
#[derive(Debug, Clone, PartialEq)]
pub struct FileTranscription {
    /// Segments with text, in time order (the guard's rejections are left out).
    pub segments: Vec<FileSegment>,
    /// Channels in the file.
    pub channels: usize,
    /// Seconds of audio (per channel), at the file's own rate.
    pub duration_secs: f64,
}

/// Why a recording could not be transcribed.
#[derive(Debug, thiserror::Error)]
pub enum TranscribeError {
    /// The file could not be decoded, or is outside the decoder's limits.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// The speech engine failed.
    #[error(transparent)]
    Asr(#[from] AsrError),
    /// The caller cancelled the work (its client went away).
    #[error("cancelled")]
    Cancelled,
}

/// Set to stop a file's transcription: no more audio is decoded or queued, and utterances
/// already queued are skipped by the workers.
pub type Cancel = std::sync::Arc<std::sync::atomic::AtomicBool>;

impl From<ResampleError> for AsrError {
    fn from(e: ResampleError) -> Self {
        AsrError::Engine(e.to_string())
    }
}

impl From<ResampleError> for TranscribeError {
    fn from(e: ResampleError) -> Self {
        TranscribeError::Asr(e.into())
    }
}

/// Progress callback: (utterances done, utterances found so far).
pub type Progress<'a> = &'a mut dyn FnMut(usize, usize);

/// Cuts one channel of 16 kHz audio into utterances as it arrives, keeping only the audio a
/// future utterance can still reach.
struct ChannelCutter {
    narrow: StreamResampler,
    segmenter: Segmenter,
    narrow_out: Vec<Vec<f32>>,
    pcm: Vec<i16>,
    /// 16 kHz audio from sample `kept_from` on.
    kept: VecDeque<f32>,
    kept_from: usize,
    keep: usize,
}

impl ChannelCutter {
    fn new(config: VadConfig) -> Result<Self, ResampleError> {
        let keep_ms = u64::from(config.max_utterance_ms)
            + u64::from(config.pre_roll_ms)
            + u64::from(config.trailing_silence_ms)
            + 1_000;
        Ok(Self {
            narrow: StreamResampler::new(RATE, vad::RATE, 1)?,
            segmenter: Segmenter::new(config),
            narrow_out: vec![Vec::new()],
            pcm: Vec::new(),
            kept: VecDeque::new(),
            kept_from: 0,
            keep: (keep_ms as usize) * RATE / 1000,
        })
    }

    /// Takes the next 16 kHz samples; hands out each utterance that ends as (start in 16 kHz
    /// samples, its 16 kHz audio).
    fn push(
        &mut self,
        wide: &[f32],
        out: &mut Vec<(usize, Vec<f32>)>,
    ) -> Result<(), ResampleError> {
        self.kept.extend(wide);
        self.narrow_out[0].clear();
        self.narrow.push(&[wide], &mut self.narrow_out)?;
        self.segment(false, out);
        Ok(())
    }

    /// The end of the channel: the last utterance is cut.
    fn finish(&mut self, out: &mut Vec<(usize, Vec<f32>)>) -> Result<(), ResampleError> {
        self.narrow_out[0].clear();
        self.narrow.finish(&mut self.narrow_out)?;
        self.segment(true, out);
        Ok(())
    }

    fn segment(&mut self, finish: bool, out: &mut Vec<(usize, Vec<f32>)>) {
        self.pcm.clear();
        self.pcm.extend(
            self.narrow_out[0]
                .iter()
                .map(|&v| (v * 32768.0).clamp(-32768.0, 32767.0) as i16),
        );
        let mut cut: Vec<Utterance> = Vec::new();
        self.segmenter.push(&self.pcm, &mut |u| cut.push(u));
        if finish {
            self.segmenter.finish(&mut |u| cut.push(u));
        }
        let ratio = RATE / vad::RATE;
        for u in cut {
            let start = (u.start as usize * ratio).max(self.kept_from);
            let end = (u.start as usize * ratio + u.samples.len() * ratio)
                .min(self.kept_from + self.kept.len());
            if end > start {
                let audio = self
                    .kept
                    .range(start - self.kept_from..end - self.kept_from)
                    .copied()
                    .collect();
                out.push((start, audio));
            }
        }
        // Older audio can no longer be part of an utterance.
        let excess = self.kept.len().saturating_sub(self.keep);
        self.kept.drain(..excess);
        self.kept_from += excess;
    }
}

/// Submits utterances to the pool and gathers their transcripts.
struct Collector<'a> {
    pool: &'a AsrPool,
    language: &'a str,
    tx: mpsc::Sender<(usize, Result<super::Transcript, AsrError>)>,
    rx: mpsc::Receiver<(usize, Result<super::Transcript, AsrError>)>,
    /// Each submitted window: its channel and its utterances.
    spans: Vec<(usize, Vec<Piece>)>,
    segments: Vec<FileSegment>,
    packing: Packing,
    packs: Vec<Pack>,
    done: usize,
    first_error: Option<AsrError>,
    progress: Progress<'a>,
    cancel: Option<Cancel>,
}

impl<'a> Collector<'a> {
    fn new(pool: &'a AsrPool, language: &'a str, packing: Packing, progress: Progress<'a>) -> Self {
        let (tx, rx) = mpsc::channel();
        Self {
            pool,
            language,
            tx,
            rx,
            spans: Vec::new(),
            segments: Vec::new(),
            packing,
            packs: Vec::new(),
            done: 0,
            first_error: None,
            progress,
            cancel: None,
        }
    }

    /// Adds an utterance of `channel` starting at sample `start`; a window that would grow
    /// past the packing limit is sent first (waiting while the pool's file queue is full).
    fn add(&mut self, channel: usize, start: usize, audio: Vec<f32>) -> Result<(), AsrError> {
        let window = (self.packing.window_secs.clamp(0.0, 30.0) * RATE as f64) as usize;
        let gap = (self.packing.gap_secs.max(0.0) * RATE as f64) as usize;
        if self.packs.len() <= channel {
            self.packs.resize_with(channel + 1, Pack::default);
        }
        let pending = &self.packs[channel];
        if !pending.pieces.is_empty() && pending.audio.len() + gap + audio.len() > window {
            self.flush(channel)?;
        }
        let pack = &mut self.packs[channel];
        if !pack.pieces.is_empty() {
            pack.audio.resize(pack.audio.len() + gap, 0.0);
        }
        pack.pieces.push(Piece {
            at: pack.audio.len(),
            start,
            len: audio.len(),
        });
        if pack.audio.is_empty() {
            pack.audio = audio;
        } else {
            pack.audio.extend_from_slice(&audio);
        }
        if pack.audio.len() >= window {
            self.flush(channel)?;
        }
        Ok(())
    }

    /// Sends `channel`'s window being filled, if any, to the pool.
    fn flush(&mut self, channel: usize) -> Result<(), AsrError> {
        let Some(pack) = self.packs.get_mut(channel) else {
            return Ok(());
        };
        if pack.pieces.is_empty() {
            return Ok(());
        }
        let Pack { audio, pieces } = std::mem::take(pack);
        let index = self.spans.len();
        self.spans.push((channel, pieces));
        let tx = self.tx.clone();
        self.pool.submit_file(Job {
            audio,
            language: self.language.to_owned(),
            reply: Box::new(move |r| {
                // The collector may have given up on an error; then nobody needs it.
                let _ = tx.send((index, r));
            }),
            cancel: self.cancel.clone(),
        })?;
        self.take_ready();
        Ok(())
    }

    /// Sends every channel's last window.
    fn flush_all(&mut self) -> Result<(), AsrError> {
        for channel in 0..self.packs.len() {
            self.flush(channel)?;
        }
        Ok(())
    }

    fn take_ready(&mut self) {
        while let Ok((index, result)) = self.rx.try_recv() {
            self.record(index, result);
        }
    }

    fn record(&mut self, index: usize, result: Result<super::Transcript, AsrError>) {
        self.done += 1;
        (self.progress)(self.done, self.spans.len());
        match result {
            Ok(t) if !t.text.is_empty() => {
                let (channel, pieces) = &self.spans[index];
                self.segments.extend(split_window(*channel, pieces, t));
            }
            Ok(_) => {}
            Err(e) => {
                self.first_error.get_or_insert(e);
            }
        }
    }

    /// Sends the last windows and waits for every transcript; the segments with text, in time
    /// order.
    fn finish(mut self) -> Result<Vec<FileSegment>, AsrError> {
        self.flush_all()?;
        (self.progress)(self.done, self.spans.len());
        while self.done < self.spans.len() {
            let Ok((index, result)) = self.rx.recv() else {
                return Err(AsrError::Unavailable("the speech workers stopped".into()));
            };
            self.record(index, result);
        }
        if let Some(e) = self.first_error {
            return Err(e);
        }
        let mut segments = self.segments;
        segments.sort_by(|a, b| a.start.total_cmp(&b.start).then(a.channel.cmp(&b.channel)));
        Ok(segments)
    }
}

/// The segments of a decoded window: one per utterance that got words, on the recording's
/// time line. A window of one utterance keeps the decoder's text; in a packed one each
/// utterance's text is its words (a word in the silence between two utterances goes to the
/// nearer one).
fn split_window(channel: usize, pieces: &[Piece], t: super::Transcript) -> Vec<FileSegment> {
    let secs = |samples: usize| samples as f64 / RATE as f64;
    if pieces.len() == 1 || t.words.is_empty() {
        // Alone, or without word timings (then the text cannot be split): one segment over
        // the window's utterances.
        let first = pieces[0];
        let last = pieces[pieces.len() - 1];
        let offset = secs(first.start) - secs(first.at);
        return vec![FileSegment {
            channel,
            start: secs(first.start),
            end: secs(last.start + last.len),
            text: t.text,
            confidence: t.confidence,
            words: t
                .words
                .into_iter()
                .map(|w| Word {
                    start: w.start + offset,
                    end: w.end + offset,
                    ..w
                })
                .collect(),
        }];
    }
    let mut words: Vec<Vec<Word>> = vec![Vec::new(); pieces.len()];
    for w in t.words {
        let mid = (w.start + w.end) / 2.0;
        let i = pieces
            .iter()
            .enumerate()
            .min_by(|(_, a), (_, b)| {
                let distance = |p: &Piece| {
                    let (from, to) = (secs(p.at), secs(p.at + p.len));
                    (from - mid).max(mid - to).max(0.0)
                };
                distance(a).total_cmp(&distance(b))
            })
            .map_or(0, |(i, _)| i);
        let p = pieces[i];
        let (from, to) = (secs(p.start), secs(p.start + p.len));
        let shift = secs(p.start) - secs(p.at);
        words[i].push(Word {
            start: (w.start + shift).clamp(from, to),
            end: (w.end + shift).clamp(from, to),
            ..w
        });
    }
    pieces
        .iter()
        .zip(words)
        .filter(|(_, words)| !words.is_empty())
        .map(|(p, words)| FileSegment {
            channel,
            start: secs(p.start),
            end: secs(p.start + p.len),
            text: words
                .iter()
                .map(|w| w.text.as_str())
                .collect::<Vec<_>>()
                .join(" "),
            confidence: t.confidence,
            words,
        })
        .collect()
}

/// Transcribes a recording as `decoder` reads it, in `language`. Blocks: call it from a
/// blocking context.
pub fn transcribe_file(
    pool: &AsrPool,
    mut decoder: FileDecoder,
    language: &str,
    vad: VadConfig,
    packing: Packing,
    progress: Progress<'_>,
    cancel: &Cancel,
) -> Result<FileTranscription, TranscribeError> {
    let info = decoder.info().clone();
    let channels = info.channels;
    let mut wide = StreamResampler::new(info.rate as usize, RATE, channels)?;
    let mut cutters = (0..channels)
        .map(|_| ChannelCutter::new(vad))
        .collect::<Result<Vec<_>, _>>()?;
    let mut collector = Collector::new(pool, language, packing, progress);
    collector.cancel = Some(cancel.clone());
    let mut wide_out: Vec<Vec<f32>> = vec![Vec::new(); channels];
    let mut cut = Vec::new();
    loop {
        if cancel.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(TranscribeError::Cancelled);
        }
        for o in &mut wide_out {
            o.clear();
        }
        let finish = match decoder.next_block()? {
            Some(block) => {
                wide.push(&block, &mut wide_out)?;
                false
            }
            None => {
                wide.finish(&mut wide_out)?;
                true
            }
        };
        for (c, cutter) in cutters.iter_mut().enumerate() {
            cutter.push(&wide_out[c], &mut cut)?;
            if finish {
                cutter.finish(&mut cut)?;
            }
            for (start, audio) in cut.drain(..) {
                collector.add(c, start, audio)?;
            }
        }
        if finish {
            break;
        }
    }
    Ok(FileTranscription {
        segments: collector.finish()?,
        channels,
        duration_secs: decoder.secs(),
    })
}

/// Transcribes every channel of a recording already in memory (16 kHz f32 per channel) in
/// `language`. Segments without text (the guard's rejections) are left out. Blocks: call from
/// a blocking context.
pub fn transcribe_channels(
    pool: &AsrPool,
    channels: &[Vec<f32>],
    language: &str,
    vad: VadConfig,
    packing: Packing,
    progress: Progress<'_>,
) -> Result<Vec<FileSegment>, AsrError> {
    let mut collector = Collector::new(pool, language, packing, progress);
    let mut cut = Vec::new();
    for (c, channel) in channels.iter().enumerate() {
        let mut cutter = ChannelCutter::new(vad)?;
        cutter.push(channel, &mut cut)?;
        cutter.finish(&mut cut)?;
        for (start, audio) in cut.drain(..) {
            collector.add(c, start, audio)?;
        }
    }
    collector.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::asr::Transcript;

    fn word(text: &str, start: f64, end: f64) -> Word {
        Word {
            text: text.into(),
            start,
            end,
            probability: 0.9,
        }
    }

    #[test]
    fn a_packed_window_gives_each_utterance_its_words_on_the_file_time_line() {
        // Two utterances: 2 s at 10 s of the file, then (after a 0.3 s gap) 1 s at 40 s.
        let pieces = [
            Piece {
                at: 0,
                start: 10 * RATE,
                len: 2 * RATE,
            },
            Piece {
                at: 2 * RATE + RATE * 3 / 10,
                start: 40 * RATE,
                len: RATE,
            },
        ];
        let t = Transcript {
            text: "Hello there. Yes.".into(),
            start: 0.1,
            end: 2.8,
            confidence: 0.8,
            avg_logprob: -0.2,
            no_speech_prob: 0.01,
            words: vec![
                word("Hello", 0.1, 0.5),
                word("there.", 0.6, 1.9),
                // In the gap, nearer the second utterance.
                word("Yes.", 2.25, 2.8),
            ],
        };
        let segments = split_window(1, &pieces, t);
        assert_eq!(segments.len(), 2);
        assert_eq!(segments[0].text, "Hello there.");
        assert_eq!((segments[0].start, segments[0].end), (10.0, 12.0));
        assert!((segments[0].words[0].start - 10.1).abs() < 1e-9);
        assert_eq!(segments[1].text, "Yes.");
        assert_eq!(segments[1].channel, 1);
        assert_eq!((segments[1].start, segments[1].end), (40.0, 41.0));
        // 2.25 s in the window is 0.05 s before the utterance: clamped to its start.
        assert_eq!(segments[1].words[0].start, 40.0);
        assert!((segments[1].words[0].end - 40.5).abs() < 1e-9);
    }

    #[test]
    fn a_window_without_word_timings_stays_one_segment() {
        let pieces = [
            Piece {
                at: 0,
                start: 0,
                len: RATE,
            },
            Piece {
                at: RATE * 13 / 10,
                start: 5 * RATE,
                len: RATE,
            },
        ];
        let t = Transcript {
            text: "One. Two.".into(),
            start: 0.0,
            end: 2.3,
            confidence: 0.7,
            avg_logprob: -0.3,
            no_speech_prob: 0.0,
            words: Vec::new(),
        };
        let segments = split_window(0, &pieces, t);
        assert_eq!(segments.len(), 1);
        assert_eq!((segments[0].start, segments[0].end), (0.0, 6.0));
        assert_eq!(segments[0].text, "One. Two.");
    }
}
