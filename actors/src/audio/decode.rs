//! Audio files to 16 kHz f32, one signal per channel.
//!
//! Containers and codecs through Symphonia: WAV (PCM 8/16/24/32-bit, IEEE float, mu-law,
//! A-law; any channel count), MP3, FLAC and Ogg Vorbis. Ogg Opus is demuxed by Symphonia and
//! decoded by libopus (audiopus), honouring the stream's pre-skip. Whatever the input rate, the
//! output is 16 kHz. Unknown formats are [`DecodeError::Unsupported`], damaged or empty ones
//! [`DecodeError::Corrupt`] / [`DecodeError::Empty`]; no input panics.

use std::io::Cursor;

use symphonia::core::audio::SampleBuffer;
use symphonia::core::codecs::{DecoderOptions, CODEC_TYPE_NULL, CODEC_TYPE_OPUS};
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

/// Decodes a whole file held in memory to `rate` Hz ([`OUTPUT_RATE`] for the speech engine).
/// `extension` (without the dot), when known, helps the format probe.
pub fn decode(
    bytes: Vec<u8>,
    extension: Option<&str>,
    rate: usize,
) -> Result<DecodedAudio, DecodeError> {
    if bytes.is_empty() {
        return Err(DecodeError::Empty);
    }
    let bytes = widen_g711_fmt(bytes);
    let stream = MediaSourceStream::new(Box::new(Cursor::new(bytes)), Default::default());
    let mut hint = Hint::new();
    if let Some(ext) = extension {
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
    let mut format = probed.format;
    let track = format
        .tracks()
        .iter()
        .find(|t| t.codec_params.codec != CODEC_TYPE_NULL)
        .ok_or(DecodeError::Empty)?;
    let track_id = track.id;
    let params = track.codec_params.clone();
    let codec_name = symphonia::default::get_codecs()
        .get_codec(params.codec)
        .map_or_else(
            || {
                if params.codec == CODEC_TYPE_OPUS {
                    "opus".to_owned()
                } else {
                    "unknown".to_owned()
                }
            },
            |d| d.short_name.to_owned(),
        );

    let (channels, source_rate) = if params.codec == CODEC_TYPE_OPUS {
        decode_opus(&mut *format, track_id, &params)?
    } else {
        decode_symphonia(&mut *format, track_id, &params)?
    };
    if channels.is_empty() || channels[0].is_empty() {
        return Err(DecodeError::Empty);
    }
    let channels = resample_offline(&channels, source_rate as usize, rate)
        .map_err(|e| DecodeError::Corrupt(e.to_string()))?;
    Ok(DecodedAudio {
        channels,
        rate,
        source_rate,
        codec: codec_name,
    })
}

/// Many real G.711 WAV files (the Genesys reference recordings among them) carry a 16-byte
/// `fmt ` chunk, while the format requires 18 for non-PCM codes (with a zero `cbSize`) and
/// Symphonia insists on it. Such a chunk is widened here; any other input is returned as is.
fn widen_g711_fmt(bytes: Vec<u8>) -> Vec<u8> {
    if bytes.len() < 36 || &bytes[0..4] != b"RIFF" || &bytes[8..12] != b"WAVE" {
        return bytes;
    }
    let mut pos = 12;
    while pos + 8 <= bytes.len() {
        let id = &bytes[pos..pos + 4];
        let len = u32::from_le_bytes([
            bytes[pos + 4],
            bytes[pos + 5],
            bytes[pos + 6],
            bytes[pos + 7],
        ]) as usize;
        if id == b"fmt " {
            let tag = bytes
                .get(pos + 8..pos + 10)
                .map(|t| u16::from_le_bytes([t[0], t[1]]));
            if len != 16 || !matches!(tag, Some(6 | 7)) {
                return bytes;
            }
            let body_end = pos + 8 + 16;
            if body_end > bytes.len() {
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
            return out;
        }
        pos += 8 + len + (len & 1);
    }
    bytes
}

/// Packets of one track until the end of the stream.
fn packets(
    format: &mut dyn FormatReader,
    track_id: u32,
    mut each: impl FnMut(&[u8], &symphonia::core::formats::Packet) -> Result<(), DecodeError>,
) -> Result<(), DecodeError> {
    loop {
        let packet = match format.next_packet() {
            Ok(p) => p,
            Err(SymphoniaError::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Ok(())
            }
            Err(SymphoniaError::ResetRequired) => return Ok(()),
            Err(e) => return Err(classify(e)),
        };
        if packet.track_id() == track_id {
            each(&packet.data, &packet)?;
        }
    }
}

fn decode_symphonia(
    format: &mut dyn FormatReader,
    track_id: u32,
    params: &symphonia::core::codecs::CodecParameters,
) -> Result<(Vec<Vec<f32>>, u32), DecodeError> {
    let mut decoder = symphonia::default::get_codecs()
        .make(params, &DecoderOptions::default())
        .map_err(|e| match e {
            SymphoniaError::Unsupported(what) => DecodeError::Unsupported(format!("codec: {what}")),
            other => classify(other),
        })?;
    let mut channels: Vec<Vec<f32>> = Vec::new();
    let mut rate = params.sample_rate.unwrap_or(0);
    let mut bad = 0;
    let mut buf: Option<SampleBuffer<f32>> = None;
    packets(format, track_id, |_, packet| {
        let decoded = match decoder.decode(packet) {
            Ok(d) => d,
            // A damaged packet is skipped, as players do, unless the file is mostly damage.
            Err(SymphoniaError::DecodeError(e)) => {
                bad += 1;
                return if bad > MAX_BAD_PACKETS {
                    Err(DecodeError::Corrupt(e.to_owned()))
                } else {
                    Ok(())
                };
            }
            Err(e) => return Err(classify(e)),
        };
        let spec = *decoded.spec();
        let n_ch = spec.channels.count();
        if n_ch == 0 || n_ch > MAX_CHANNELS {
            return Err(DecodeError::Unsupported(format!("{n_ch} channels")));
        }
        rate = spec.rate;
        if channels.is_empty() {
            channels = vec![Vec::new(); n_ch];
        }
        if channels.len() != n_ch {
            return Err(DecodeError::Corrupt(
                "channel count changes mid-stream".into(),
            ));
        }
        let needed = decoded.capacity() as u64;
        if buf
            .as_ref()
            .is_none_or(|b| (b.capacity() as u64) < needed * n_ch as u64)
        {
            buf = Some(SampleBuffer::new(needed, spec));
        }
        let sb = buf.as_mut().expect("set just above");
        sb.copy_planar_ref(decoded);
        let frames = sb.samples().len() / n_ch;
        for (c, out) in channels.iter_mut().enumerate() {
            out.extend_from_slice(&sb.samples()[c * frames..(c + 1) * frames]);
        }
        Ok(())
    })?;
    if rate == 0 {
        return Err(DecodeError::Corrupt("no sample rate".into()));
    }
    Ok((channels, rate))
}

fn decode_opus(
    format: &mut dyn FormatReader,
    track_id: u32,
    params: &symphonia::core::codecs::CodecParameters,
) -> Result<(Vec<Vec<f32>>, u32), DecodeError> {
    use audiopus::coder::Decoder;
    use audiopus::{packet::Packet, Channels, MutSignals, SampleRate};

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
    let mut decoder = Decoder::new(SampleRate::Hz48000, channels_kind)
        .map_err(|e| DecodeError::Corrupt(e.to_string()))?;
    // 120 ms is the longest Opus frame.
    let mut pcm = vec![0f32; 5760 * n_ch];
    let mut channels: Vec<Vec<f32>> = vec![Vec::new(); n_ch];
    let mut bad = 0;
    packets(format, track_id, |data, _| {
        let packet = match Packet::try_from(data) {
            Ok(p) => p,
            Err(_) => return Ok(()),
        };
        let out =
            MutSignals::try_from(&mut pcm[..]).map_err(|e| DecodeError::Corrupt(e.to_string()))?;
        match decoder.decode_float(Some(packet), out, false) {
            Ok(frames) => {
                for frame in pcm[..frames * n_ch].chunks_exact(n_ch) {
                    for (c, &v) in frame.iter().enumerate() {
                        channels[c].push(v);
                    }
                }
                Ok(())
            }
            Err(e) => {
                bad += 1;
                if bad > MAX_BAD_PACKETS {
                    Err(DecodeError::Corrupt(e.to_string()))
                } else {
                    Ok(())
                }
            }
        }
    })?;
    for c in &mut channels {
        c.drain(..pre_skip.min(c.len()));
    }
    Ok((channels, 48_000))
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
