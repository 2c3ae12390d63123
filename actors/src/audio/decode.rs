//! Audio files to f32 signals, one per channel, read packet by packet.
//!
//! Containers and codecs through Symphonia: WAV (PCM 8/16/24/32-bit, IEEE float, mu-law,
//! A-law; any channel count), MP3, FLAC and Ogg Vorbis. Ogg Opus is demuxed by Symphonia and
//! decoded by libopus (audiopus), honouring the stream's pre-skip.
//!
//! Files come from strangers, so [`FileDecoder`] checks what the container declares before it
//! decodes anything ([`DecodeLimits`]: sample rate, channel count, declared duration) and then
//! hands out the audio a packet at a time, at the file's own rate: memory stays bounded
//! whatever the file's length. A declared duration is only a hint (a header can say one second
//! of a ten-minute file): [`FileDecoder::measure`] finds what the file really holds, by
//! decoding it to the end without keeping the audio. [`decode`] is the whole-file convenience for trusted files.
//! Unknown formats are [`DecodeError::Unsupported`], damaged or empty ones
//! [`DecodeError::Corrupt`] / [`DecodeError::Empty`], out-of-range ones
//! [`DecodeError::Invalid`] or [`DecodeError::TooLong`]; no input panics (a panic inside a
//! decoder library is caught and reported as damage).

use std::io::Cursor;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use symphonia::core::audio::SampleBuffer;
use symphonia::core::codecs::{Decoder, DecoderOptions, CODEC_TYPE_NULL, CODEC_TYPE_OPUS};
use symphonia::core::errors::Error as SymphoniaError;
use symphonia::core::formats::{FormatOptions, FormatReader};
use symphonia::core::io::MediaSourceStream;
use symphonia::core::meta::MetadataOptions;
use symphonia::core::probe::Hint;

use super::resample::resample_offline;

/// Sample rate of the speech engine's input, the usual output rate.
pub const OUTPUT_RATE: usize = 16_000;
/// Most channels accepted.
pub const MAX_CHANNELS: usize = 8;
/// Corrupt packets tolerated before a file is refused.
const MAX_BAD_PACKETS: usize = 16;

/// What a file may declare and hold.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeLimits {
    /// Lowest sample rate accepted, Hz.
    pub min_rate: u32,
    /// Highest sample rate accepted, Hz.
    pub max_rate: u32,
    /// Most channels accepted.
    pub max_channels: usize,
    /// Longest audio accepted, seconds; decoding stops with [`DecodeError::TooLong`] past it.
    pub max_secs: f64,
}

impl Default for DecodeLimits {
    fn default() -> Self {
        Self {
            min_rate: 2_000,
            max_rate: 192_000,
            max_channels: MAX_CHANNELS,
            max_secs: f64::INFINITY,
        }
    }
}

/// A decoded file.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodedAudio {
    /// One signal per channel at `rate`, in the file's channel order, samples in [-1, 1].
    pub channels: Vec<Vec<f32>>,
    /// Sample rate of `channels`.
    pub rate: usize,
    /// The file's own sample rate.
    pub source_rate: u32,
    /// The codec, as Symphonia names it (`pcm_s16le`, `mp3`, `opus`...).
    pub codec: String,
}

impl DecodedAudio {
    /// Duration in seconds.
    pub fn duration_secs(&self) -> f64 {
        self.channels
            .first()
            .map_or(0.0, |c| c.len() as f64 / self.rate as f64)
    }
}

/// Why a file cannot be decoded.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// Not a format or codec we decode.
    #[error("unsupported audio format: {0}")]
    Unsupported(String),
    /// The data is damaged.
    #[error("corrupt audio: {0}")]
    Corrupt(String),
    /// No audio in it.
    #[error("the file holds no audio")]
    Empty,
    /// It declares something outside [`DecodeLimits`] (rate, channels).
    #[error("{0}")]
    Invalid(String),
    /// It is longer than [`DecodeLimits::max_secs`].
    #[error("the audio is longer than {limit_secs} s")]
    TooLong {
        /// The limit.
        limit_secs: f64,
        /// The length the container declares, when it declares one.
        declared_secs: Option<f64>,
    },
}

fn classify(e: SymphoniaError) -> DecodeError {
    match e {
        SymphoniaError::Unsupported(what) => DecodeError::Unsupported(what.to_owned()),
        SymphoniaError::IoError(io) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
            DecodeError::Corrupt("the file ends early".into())
        }
        other => DecodeError::Corrupt(other.to_string()),
    }
}

/// Runs a decoder-library call, turning a panic inside it into [`DecodeError::Corrupt`].
fn guarded<T>(f: impl FnOnce() -> Result<T, DecodeError>) -> Result<T, DecodeError> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        Err(DecodeError::Corrupt(
            "the decoder failed on this file".into(),
        ))
    })
}

/// What a file is, as far as its container says.
#[derive(Debug, Clone, PartialEq)]
pub struct AudioInfo {
    /// Channels.
    pub channels: usize,
    /// The file's sample rate.
    pub rate: u32,
    /// The codec, as Symphonia names it.
    pub codec: String,
    /// The duration the container declares, if it declares one.
    pub declared_secs: Option<f64>,
}

enum Codec {
    Symphonia {
        decoder: Box<dyn Decoder>,
        buf: Option<SampleBuffer<f32>>,
    },
    Opus {
        decoder: audiopus::coder::Decoder,
        pcm: Vec<f32>,
        pre_skip: usize,
    },
}

/// A file's bytes, shared by the passes over it (measuring, then decoding).
#[derive(Clone)]
struct Shared(Arc<Vec<u8>>);

impl AsRef<[u8]> for Shared {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// A file being decoded a packet at a time.
pub struct FileDecoder {
    bytes: Shared,
    extension: Option<String>,
    format: Box<dyn FormatReader>,
    track_id: u32,
    codec: Codec,
    info: AudioInfo,
    limits: DecodeLimits,
    frames: u64,
    bad: usize,
    /// The first block, decoded while opening to learn the channel count.
    first: Option<Vec<Vec<f32>>>,
    done: bool,
}

impl std::fmt::Debug for FileDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileDecoder")
            .field("info", &self.info)
            .field("frames", &self.frames)
            .finish()
    }
}

impl FileDecoder {
    /// Opens a file held in memory: probes the container, checks what it declares against
    /// `limits` and decodes its first packet. `extension` (without the dot), when known,
    /// helps the probe.
    pub fn open(
        bytes: Vec<u8>,
        extension: Option<&str>,
        limits: DecodeLimits,
    ) -> Result<Self, DecodeError> {
        if bytes.is_empty() {
            return Err(DecodeError::Empty);
        }
        check_wav_header(&bytes, &limits)?;
        let bytes = Shared(Arc::new(widen_g711_fmt(bytes)));
        Self::open_shared(bytes, extension.map(str::to_owned), limits)
    }

    fn open_shared(
        bytes: Shared,
        extension: Option<String>,
        limits: DecodeLimits,
    ) -> Result<Self, DecodeError> {
        let mut decoder = guarded(|| Self::probe(bytes, extension, limits))?;
        decoder.first = decoder.read_block()?;
        if decoder.first.is_none() {
            return Err(DecodeError::Empty);
        }
        Ok(decoder)
    }

    fn probe(
        bytes: Shared,
        extension: Option<String>,
        limits: DecodeLimits,
    ) -> Result<Self, DecodeError> {
        let stream =
            MediaSourceStream::new(Box::new(Cursor::new(bytes.clone())), Default::default());
        let mut hint = Hint::new();
        if let Some(ext) = extension.as_deref() {
            hint.with_extension(ext);
        }
        let probed = symphonia::default::get_probe()
            .format(
                &hint,
                stream,
                &FormatOptions::default(),
                &MetadataOptions::default(),
            )
            .map_err(|e| match e {
                SymphoniaError::Unsupported(_) => {
                    DecodeError::Unsupported("not a recognised audio container".into())
                }
                other => classify(other),
            })?;
        let format = probed.format;
        let track = format
            .tracks()
            .iter()
            .find(|t| t.codec_params.codec != CODEC_TYPE_NULL)
            .ok_or(DecodeError::Empty)?;
        let track_id = track.id;
        let params = track.codec_params.clone();
        let declared_channels = params.channels.map(|c| c.count());
        if let Some(n) = declared_channels {
            check_channels(n, &limits)?;
        }
        // Opus always decodes at 48 kHz, whatever rate the encoder was fed.
        let opus = params.codec == CODEC_TYPE_OPUS;
        let rate = if opus {
            Some(48_000)
        } else {
            params.sample_rate
        };
        if let Some(rate) = rate {
            check_rate(rate, &limits)?;
        }
        let declared_secs = match (params.n_frames, rate) {
            (Some(frames), Some(rate)) if rate > 0 => Some(frames as f64 / f64::from(rate)),
            _ => None,
        };
        if let Some(secs) = declared_secs {
            if secs > limits.max_secs {
                return Err(DecodeError::TooLong {
                    limit_secs: limits.max_secs,
                    declared_secs: Some(secs),
                });
            }
        }
        let (codec, name) = if opus {
            (open_opus(&params)?, "opus".to_owned())
        } else {
            let decoder = symphonia::default::get_codecs()
                .make(&params, &DecoderOptions::default())
                .map_err(|e| match e {
                    SymphoniaError::Unsupported(what) => {
                        DecodeError::Unsupported(format!("codec: {what}"))
                    }
                    other => classify(other),
                })?;
            let name = symphonia::default::get_codecs()
                .get_codec(params.codec)
                .map_or_else(|| "unknown".to_owned(), |d| d.short_name.to_owned());
            (Codec::Symphonia { decoder, buf: None }, name)
        };
        Ok(Self {
            bytes,
            extension,
            format,
            track_id,
            codec,
            info: AudioInfo {
                channels: declared_channels.unwrap_or(0),
                rate: rate.unwrap_or(0),
                codec: name,
                declared_secs,
            },
            limits,
            frames: 0,
            bad: 0,
            first: None,
            done: false,
        })
    }

    /// What the file is.
    pub fn info(&self) -> &AudioInfo {
        &self.info
    }

    /// Frames (samples per channel) handed out so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// Lowers the longest duration decoded (the file stops with [`DecodeError::TooLong`]
    /// past it), for a limit known only once the file's own length is known.
    pub fn limit_secs(&mut self, secs: f64) {
        self.limits.max_secs = self.limits.max_secs.min(secs);
    }

    /// The same file from its start, with the same limits (the bytes are shared, not copied).
    pub fn reopen(&self) -> Result<Self, DecodeError> {
        Self::open_shared(self.bytes.clone(), self.extension.clone(), self.limits)
    }

    /// Decodes the rest of the file without keeping the audio, and answers how many seconds
    /// were handed out in all: what the file holds, whatever its container declares. Stops
    /// with [`DecodeError::TooLong`] past the limit, and with `Ok(None)` as soon as `stop` is
    /// set.
    pub fn measure(mut self, stop: &AtomicBool) -> Result<Option<f64>, DecodeError> {
        while self.next_block()?.is_some() {
            if stop.load(Ordering::Relaxed) {
                return Ok(None);
            }
        }
        Ok(Some(self.secs()))
    }

    /// Seconds handed out so far.
    pub fn secs(&self) -> f64 {
        self.frames as f64 / f64::from(self.info.rate.max(1))
    }

    /// The next block of audio, one `Vec` per channel at the file's rate, or `None` at the end.
    pub fn next_block(&mut self) -> Result<Option<Vec<Vec<f32>>>, DecodeError> {
        if let Some(first) = self.first.take() {
            return Ok(Some(first));
        }
        self.read_block()
    }

    fn read_block(&mut self) -> Result<Option<Vec<Vec<f32>>>, DecodeError> {
        while !self.done {
            let block = guarded(|| self.decode_packet())?;
            if let Some(mut block) = block.filter(|b| b.first().is_some_and(|c| !c.is_empty())) {
                // A float file may hold anything: NaN and infinities would poison every filter
                // after this point, and out-of-range values are clipping.
                for channel in &mut block {
                    for v in channel.iter_mut() {
                        *v = if v.is_finite() {
                            v.clamp(-1.0, 1.0)
                        } else {
                            0.0
                        };
                    }
                }
                self.frames += block[0].len() as u64;
                if self.secs() > self.limits.max_secs {
                    return Err(DecodeError::TooLong {
                        limit_secs: self.limits.max_secs,
                        declared_secs: self.info.declared_secs,
                    });
                }
                return Ok(Some(block));
            }
        }
        Ok(None)
    }

    /// Decodes the next packet of the track: `Some(block)` (possibly empty), or `None` with
    /// `done` set at the end of the stream.
    fn decode_packet(&mut self) -> Result<Option<Vec<Vec<f32>>>, DecodeError> {
        let packet = loop {
            match self.format.next_packet() {
                Ok(p) if p.track_id() == self.track_id => break p,
                Ok(_) => continue,
                Err(SymphoniaError::IoError(e))
                    if e.kind() == std::io::ErrorKind::UnexpectedEof =>
                {
                    self.done = true;
                    return Ok(None);
                }
                Err(SymphoniaError::ResetRequired) => {
                    self.done = true;
                    return Ok(None);
                }
                Err(e) => return Err(classify(e)),
            }
        };
        match &mut self.codec {
            Codec::Symphonia { decoder, buf } => {
                let decoded = match decoder.decode(&packet) {
                    Ok(d) => d,
                    // A damaged packet is skipped, as players do, unless the file is mostly
                    // damage.
                    Err(SymphoniaError::DecodeError(e)) => {
                        self.bad += 1;
                        return if self.bad > MAX_BAD_PACKETS {
                            Err(DecodeError::Corrupt(e.to_owned()))
                        } else {
                            Ok(Some(Vec::new()))
                        };
                    }
                    Err(e) => return Err(classify(e)),
                };
                let spec = *decoded.spec();
                let n_ch = spec.channels.count();
                check_channels(n_ch, &self.limits)?;
                check_rate(spec.rate, &self.limits)?;
                // Zero: not declared by the container and not seen yet.
                if self.info.channels != 0 && self.info.channels != n_ch {
                    return Err(DecodeError::Corrupt(
                        "channel count changes mid-stream".into(),
                    ));
                }
                if self.info.rate != 0 && self.info.rate != spec.rate {
                    return Err(DecodeError::Corrupt(
                        "sample rate changes mid-stream".into(),
                    ));
                }
                self.info.channels = n_ch;
                self.info.rate = spec.rate;
                let needed = decoded.capacity() as u64;
                if buf
                    .as_ref()
                    .is_none_or(|b| (b.capacity() as u64) < needed * n_ch as u64)
                {
                    *buf = Some(SampleBuffer::new(needed, spec));
                }
                let sb = buf.as_mut().expect("set just above");
                sb.copy_planar_ref(decoded);
                let frames = sb.samples().len() / n_ch;
                Ok(Some(
                    (0..n_ch)
                        .map(|c| sb.samples()[c * frames..(c + 1) * frames].to_vec())
                        .collect(),
                ))
            }
            Codec::Opus {
                decoder,
                pcm,
                pre_skip,
            } => {
                use audiopus::{packet::Packet, MutSignals};
                let n_ch = self.info.channels;
                let Ok(packet) = Packet::try_from(&packet.data[..]) else {
                    return Ok(Some(Vec::new()));
                };
                let out = MutSignals::try_from(&mut pcm[..])
                    .map_err(|e| DecodeError::Corrupt(e.to_string()))?;
                match decoder.decode_float(Some(packet), out, false) {
                    Ok(frames) => {
                        let skip = (*pre_skip).min(frames);
                        *pre_skip -= skip;
                        Ok(Some(
                            (0..n_ch)
                                .map(|c| {
                                    pcm[skip * n_ch..frames * n_ch]
                                        .iter()
                                        .skip(c)
                                        .step_by(n_ch)
                                        .copied()
                                        .collect()
                                })
                                .collect(),
                        ))
                    }
                    Err(e) => {
                        self.bad += 1;
                        if self.bad > MAX_BAD_PACKETS {
                            Err(DecodeError::Corrupt(e.to_string()))
                        } else {
                            Ok(Some(Vec::new()))
                        }
                    }
                }
            }
        }
    }
}

fn check_rate(rate: u32, limits: &DecodeLimits) -> Result<(), DecodeError> {
    if (limits.min_rate..=limits.max_rate).contains(&rate) {
        Ok(())
    } else {
        Err(DecodeError::Invalid(format!(
            "sample rate {rate} Hz is outside {}-{} Hz",
            limits.min_rate, limits.max_rate
        )))
    }
}

fn check_channels(n: usize, limits: &DecodeLimits) -> Result<(), DecodeError> {
    if (1..=limits.max_channels).contains(&n) {
        Ok(())
    } else {
        Err(DecodeError::Invalid(format!(
            "{n} channels; 1 to {} are accepted",
            limits.max_channels
        )))
    }
}

/// Checks a WAV file's `fmt ` chunk before any decoder library reads it: its rate, channel
/// count and block alignment must be sane (a zero rate makes a decoder library panic, an
/// absurd one makes a resampler allocate without bound). Other formats pass through.
fn check_wav_header(bytes: &[u8], limits: &DecodeLimits) -> Result<(), DecodeError> {
    let Some((pos, _)) = fmt_chunk(bytes) else {
        return Ok(());
    };
    let body = bytes
        .get(pos + 8..pos + 8 + 16)
        .ok_or_else(|| DecodeError::Corrupt("the WAV fmt chunk is cut short".into()))?;
    let channels = usize::from(u16::from_le_bytes([body[2], body[3]]));
    let rate = u32::from_le_bytes([body[4], body[5], body[6], body[7]]);
    let block_align = u16::from_le_bytes([body[12], body[13]]);
    check_channels(channels, limits)?;
    check_rate(rate, limits)?;
    if block_align == 0 {
        return Err(DecodeError::Invalid(
            "the WAV header declares a block alignment of 0".into(),
        ));
    }
    Ok(())
}

/// Where a RIFF/WAVE file's `fmt ` chunk starts, and its declared length.
fn fmt_chunk(bytes: &[u8]) -> Option<(usize, usize)> {
    if bytes.len() < 12 || &bytes[0..4] != b"RIFF" || &bytes[8..12] != b"WAVE" {
        return None;
    }
    let mut pos = 12usize;
    while pos.checked_add(8)? <= bytes.len() {
        let id = &bytes[pos..pos + 4];
        let len = u32::from_le_bytes([
            bytes[pos + 4],
            bytes[pos + 5],
            bytes[pos + 6],
            bytes[pos + 7],
        ]) as usize;
        if id == b"fmt " {
            return Some((pos, len));
        }
        pos = pos
            .saturating_add(8)
            .saturating_add(len)
            .saturating_add(len & 1);
    }
    None
}

fn open_opus(params: &symphonia::core::codecs::CodecParameters) -> Result<Codec, DecodeError> {
    use audiopus::{Channels, SampleRate};
    let n_ch = params.channels.map_or(0, |c| c.count());
    let channels_kind = match n_ch {
        1 => Channels::Mono,
        2 => Channels::Stereo,
        n => return Err(DecodeError::Unsupported(format!("Opus with {n} channels"))),
    };
    // OpusHead: bytes 10-11 are the pre-skip, in 48 kHz samples.
    let pre_skip = params
        .extra_data
        .as_deref()
        .filter(|h| h.len() >= 12 && h.starts_with(b"OpusHead"))
        .map_or(0, |h| usize::from(u16::from_le_bytes([h[10], h[11]])));
    let decoder = audiopus::coder::Decoder::new(SampleRate::Hz48000, channels_kind)
        .map_err(|e| DecodeError::Corrupt(e.to_string()))?;
    Ok(Codec::Opus {
        decoder,
        // 120 ms is the longest Opus frame.
        pcm: vec![0f32; 5760 * n_ch],
        pre_skip,
    })
}

/// Decodes a whole trusted file held in memory to `rate` Hz ([`OUTPUT_RATE`] for the speech
/// engine), within the default [`DecodeLimits`]. `extension` (without the dot), when known,
/// helps the format probe. For files from strangers, stream with [`FileDecoder`] instead.
pub fn decode(
    bytes: Vec<u8>,
    extension: Option<&str>,
    rate: usize,
) -> Result<DecodedAudio, DecodeError> {
    let mut decoder = FileDecoder::open(bytes, extension, DecodeLimits::default())?;
    let mut channels: Vec<Vec<f32>> = vec![Vec::new(); decoder.info().channels];
    while let Some(block) = decoder.next_block()? {
        for (out, part) in channels.iter_mut().zip(block) {
            out.extend(part);
        }
    }
    let info = decoder.info().clone();
    let channels = resample_offline(&channels, info.rate as usize, rate)
        .map_err(|e| DecodeError::Corrupt(e.to_string()))?;
    Ok(DecodedAudio {
        channels,
        rate,
        source_rate: info.rate,
        codec: info.codec,
    })
}

/// Many real G.711 WAV files (the Genesys reference recordings among them) carry a 16-byte
/// `fmt ` chunk, while the format requires 18 for non-PCM codes (with a zero `cbSize`) and
/// Symphonia insists on it. Such a chunk is widened here; any other input is returned as is.
fn widen_g711_fmt(bytes: Vec<u8>) -> Vec<u8> {
    let Some((pos, len)) = fmt_chunk(&bytes) else {
        return bytes;
    };
    let tag = bytes
        .get(pos + 8..pos + 10)
        .map(|t| u16::from_le_bytes([t[0], t[1]]));
    let body_end = pos + 8 + 16;
    if len != 16 || !matches!(tag, Some(6 | 7)) || body_end > bytes.len() {
        return bytes;
    }
    let mut out = Vec::with_capacity(bytes.len() + 2);
    out.extend_from_slice(&bytes[..pos + 4]);
    out.extend_from_slice(&18u32.to_le_bytes());
    out.extend_from_slice(&bytes[pos + 8..body_end]);
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&bytes[body_end..]);
    let riff = u32::from_le_bytes([out[4], out[5], out[6], out[7]]).saturating_add(2);
    out[4..8].copy_from_slice(&riff.to_le_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wav_header(format_tag: u16, channels: u16, rate: u32, bits: u16, data_len: u32) -> Vec<u8> {
        let block = channels * bits / 8;
        let mut h = Vec::new();
        h.extend_from_slice(b"RIFF");
        h.extend_from_slice(&(36 + data_len).to_le_bytes());
        h.extend_from_slice(b"WAVEfmt ");
        h.extend_from_slice(&16u32.to_le_bytes());
        h.extend_from_slice(&format_tag.to_le_bytes());
        h.extend_from_slice(&channels.to_le_bytes());
        h.extend_from_slice(&rate.to_le_bytes());
        h.extend_from_slice(&(rate * u32::from(block)).to_le_bytes());
        h.extend_from_slice(&block.to_le_bytes());
        h.extend_from_slice(&bits.to_le_bytes());
        h.extend_from_slice(b"data");
        h.extend_from_slice(&data_len.to_le_bytes());
        h
    }

    #[test]
    fn pcm16_stereo_wav_decodes_per_channel_at_16k() {
        let frames = 8_000u32;
        let mut wav = wav_header(1, 2, 8_000, 16, frames * 4);
        for i in 0..frames {
            let v = ((i as f32 * 0.05).sin() * 10_000.0) as i16;
            wav.extend_from_slice(&v.to_le_bytes());
            wav.extend_from_slice(&(-v).to_le_bytes());
        }
        let audio = decode(wav, Some("wav"), OUTPUT_RATE).unwrap();
        assert_eq!(audio.channels.len(), 2);
        assert_eq!(audio.channels[0].len(), 16_000);
        assert_eq!(audio.source_rate, 8_000);
        assert!((audio.duration_secs() - 1.0).abs() < 1e-9);
        let mid = 8_000;
        assert!((audio.channels[0][mid] + audio.channels[1][mid]).abs() < 1e-4);
    }

    #[test]
    fn g711_wav_with_a_16_byte_fmt_chunk_decodes() {
        // mu-law, stereo, 8 kHz, fmt chunk without cbSize, as the Genesys recordings have it.
        let mut wav = wav_header(7, 2, 8_000, 8, 1600);
        wav.extend(std::iter::repeat_n([0xFFu8, 0x80u8], 800).flatten());
        let audio = decode(wav, Some("wav"), 8_000).unwrap();
        assert_eq!(audio.channels.len(), 2);
        assert_eq!(audio.channels[0].len(), 800);
        assert!(audio.channels[0].iter().all(|&v| v == 0.0));
        assert!(audio.channels[1][400] > 0.9, "0x80 is mu-law full scale");
        let mut alaw = wav_header(6, 1, 8_000, 8, 100);
        alaw.extend([0xD5u8; 100]);
        assert_eq!(
            decode(alaw, Some("wav"), 8_000).unwrap().channels[0].len(),
            100
        );
    }

    /// The FLAC fixture (3.28 s at 44.1 kHz), its STREAMINFO declaring `frames` samples.
    fn flac_declaring(frames: u64) -> Vec<u8> {
        let path = crate::package_dir(env!("CARGO_MANIFEST_DIR"))
            .join("../fixtures/formats/flac16-mono-44k.flac");
        let mut f = std::fs::read(path).unwrap();
        assert_eq!(&f[..4], b"fLaC");
        // STREAMINFO's 36-bit total sample count: the low nibble of byte 21 and bytes 22-25.
        f[21] = (f[21] & 0xF0) | ((frames >> 32) as u8 & 0x0F);
        f[22..26].copy_from_slice(&(frames as u32).to_be_bytes());
        f
    }

    #[test]
    fn a_file_is_measured_by_what_it_holds_not_what_it_declares() {
        let stop = AtomicBool::new(false);
        for declared in [44_100, 1_000 * 44_100] {
            let decoder =
                FileDecoder::open(flac_declaring(declared), Some("flac"), Default::default())
                    .unwrap();
            assert_eq!(
                decoder.info().declared_secs,
                Some(declared as f64 / 44_100.0)
            );
            let held = decoder.reopen().unwrap().measure(&stop).unwrap().unwrap();
            assert!((held - 144_428.0 / 44_100.0).abs() < 1e-9, "{held} s");
            // The first pass is untouched by the second.
            assert_eq!(decoder.measure(&stop).unwrap(), Some(held));
        }
        // Past the limit, measuring stops with the error decoding would give.
        let limits = DecodeLimits {
            max_secs: 2.0,
            ..Default::default()
        };
        let decoder = FileDecoder::open(flac_declaring(44_100), Some("flac"), limits).unwrap();
        assert!(matches!(
            decoder.measure(&stop),
            Err(DecodeError::TooLong {
                declared_secs: Some(d),
                ..
            }) if d == 1.0
        ));
        let stopped = AtomicBool::new(true);
        let decoder =
            FileDecoder::open(flac_declaring(44_100), Some("flac"), Default::default()).unwrap();
        assert_eq!(decoder.measure(&stopped).unwrap(), None);
    }

    #[test]
    fn bad_input_is_a_typed_error() {
        assert!(matches!(
            decode(Vec::new(), None, OUTPUT_RATE),
            Err(DecodeError::Empty)
        ));
        assert!(matches!(
            decode(
                b"hello, this is not audio at all".to_vec(),
                None,
                OUTPUT_RATE
            ),
            Err(DecodeError::Unsupported(_))
        ));
        let header_only = wav_header(1, 1, 8_000, 16, 0);
        assert!(matches!(
            decode(header_only, Some("wav"), OUTPUT_RATE),
            Err(DecodeError::Empty) | Err(DecodeError::Corrupt(_))
        ));
    }
}
