//! Transcribing whole recordings: each channel is cut into utterances by the VAD, every
//! utterance goes to the worker pool as file work (so all workers decode in parallel and live
//! calls keep priority), and the results come back as timed segments in time order.

use std::sync::mpsc;

use super::pool::{AsrPool, Job};
use super::{AsrError, Word};
use crate::audio::resample::{resample_offline, ResampleError};
use crate::audio::vad::{self, Segmenter, VadConfig};

/// Rate of the audio handed in and of the engine.
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

/// Progress callback: (utterances done, utterances in all).
pub type Progress<'a> = &'a mut dyn FnMut(usize, usize);

impl From<ResampleError> for AsrError {
    fn from(e: ResampleError) -> Self {
        AsrError::Engine(e.to_string())
    }
}

/// Cuts one 16 kHz channel into utterances: (start in 16 kHz samples, samples).
pub fn utterances(channel: &[f32], config: VadConfig) -> Result<Vec<(usize, Vec<f32>)>, AsrError> {
    // The VAD works on 8 kHz telephone-band audio; cut the 16 kHz signal where it says.
    let narrow = resample_offline(&[channel.to_vec()], RATE, vad::RATE)?;
    let pcm: Vec<i16> = narrow[0]
        .iter()
        .map(|&v| (v * 32768.0).clamp(-32768.0, 32767.0) as i16)
        .collect();
    let mut spans = Vec::new();
    let mut seg = Segmenter::new(config);
    let mut push = |u: vad::Utterance| {
        let ratio = RATE / vad::RATE;
        let start = u.start as usize * ratio;
        let end = (start + u.samples.len() * ratio).min(channel.len());
        spans.push((start, channel[start..end].to_vec()));
    };
    seg.push(&pcm, &mut push);
    seg.finish(&mut push);
    Ok(spans)
}

/// Transcribes every channel of a recording (16 kHz f32 per channel) in `language`. Segments
/// without text (the guard's rejections) are left out. Blocks: call from a blocking context.
pub fn transcribe_channels(
    pool: &AsrPool,
    channels: &[Vec<f32>],
    language: &str,
    vad: VadConfig,
    progress: Progress<'_>,
) -> Result<Vec<FileSegment>, AsrError> {
    let mut pieces = Vec::new();
    for (c, channel) in channels.iter().enumerate() {
        for (start, audio) in utterances(channel, vad)? {
            pieces.push((c, start, audio));
        }
    }
    let total = pieces.len();
    progress(0, total);
    let (tx, rx) = mpsc::channel();
    let spans: Vec<(usize, usize, usize)> =
        pieces.iter().map(|(c, s, a)| (*c, *s, a.len())).collect();
    let segments = std::thread::scope(|scope| {
        let submitter = scope.spawn(move || -> Result<(), AsrError> {
            for (i, (_, _, audio)) in pieces.into_iter().enumerate() {
                let tx = tx.clone();
                pool.submit_file(Job {
                    audio,
                    language: language.to_owned(),
                    reply: Box::new(move |r| {
                        let _ = tx.send((i, r));
                    }),
                })?;
            }
            Ok(())
        });
        let mut out: Vec<Option<FileSegment>> = vec![None; total];
        let mut first_error = None;
        for done in 1..=total {
            let Ok((i, result)) = rx.recv() else { break };
            progress(done, total);
            match result {
                Ok(t) if !t.text.is_empty() => {
                    let (channel, start, len) = spans[i];
                    let offset = start as f64 / RATE as f64;
                    out[i] = Some(FileSegment {
                        channel,
                        start: offset,
                        end: offset + len as f64 / RATE as f64,
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
                    });
                }
                Ok(_) => {}
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        let submitted = submitter
            .join()
            .expect("the submitter thread does not panic");
        match (first_error, submitted) {
            (Some(e), _) | (None, Err(e)) => Err(e),
            (None, Ok(())) => Ok(out),
        }
    })?;
    let mut segments: Vec<FileSegment> = segments.into_iter().flatten().collect();
    segments.sort_by(|a, b| a.start.total_cmp(&b.start).then(a.channel.cmp(&b.channel)));
    Ok(segments)
}
