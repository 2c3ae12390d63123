//! Live-call audio frames: interleaved PCMU or L16 bytes to per-channel 16-bit samples.
//!
//! AudioHook interleaves every negotiated channel sample by sample in the negotiated order.
//! PCMU is one byte per sample; L16 is two bytes per sample, little-endian (the byte order the
//! AudioHook reference implementations read). A frame may carry any number of sample frames,
//! but never a partial one: that is an error, not a panic.

use super::g711::ULAW;

/// Most channels a frame may carry.
pub const MAX_CHANNELS: usize = 8;

/// Sample encoding of live-call audio.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// G.711 mu-law, one byte per sample.
    Pcmu,
    /// Signed 16-bit linear PCM, little-endian.
    L16,
}

impl Encoding {
    /// Bytes per sample of one channel.
    pub const fn bytes_per_sample(self) -> usize {
        match self {
            Encoding::Pcmu => 1,
            Encoding::L16 => 2,
        }
    }
}

/// Why a frame cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The frame length is not a multiple of one sample frame (channels x bytes per sample).
    #[error("frame of {len} bytes is not a whole number of {frame_bytes}-byte sample frames")]
    PartialFrame {
        /// Bytes received.
        len: usize,
        /// Bytes in one sample frame.
        frame_bytes: usize,
    },
    /// The channel count is zero or above [`MAX_CHANNELS`].
    #[error("{0} channels; 1 to 8 are supported")]
    Channels(usize),
    /// An output buffer is shorter than the samples per channel in the frame.
    #[error("output buffer holds {have} samples, the frame has {need} per channel")]
    OutputTooSmall {
        /// Capacity of the shortest output.
        have: usize,
        /// Samples per channel in the frame.
        need: usize,
    },
}

/// Samples per channel in a frame of `len` bytes.
pub fn samples_per_channel(
    encoding: Encoding,
    channels: usize,
    len: usize,
) -> Result<usize, FrameError> {
    if channels == 0 || channels > MAX_CHANNELS {
        return Err(FrameError::Channels(channels));
    }
    let frame_bytes = channels * encoding.bytes_per_sample();
    if !len.is_multiple_of(frame_bytes) {
        return Err(FrameError::PartialFrame { len, frame_bytes });
    }
    Ok(len / frame_bytes)
}

/// Decodes an interleaved frame into one buffer per channel (`outs.len()` is the channel
/// count). Returns the samples written to each; nothing is written on error.
pub fn deinterleave_into(
    encoding: Encoding,
    frame: &[u8],
    outs: &mut [&mut [i16]],
) -> Result<usize, FrameError> {
    let channels = outs.len();
    let n = samples_per_channel(encoding, channels, frame.len())?;
    let have = outs.iter().map(|o| o.len()).min().unwrap_or(0);
    if have < n {
        return Err(FrameError::OutputTooSmall { have, need: n });
    }
    match (encoding, channels) {
        // The common live-call shapes get loops the compiler can unroll.
        (Encoding::Pcmu, 2) => {
            let (a, b) = outs.split_at_mut(1);
            let (a, b) = (&mut a[0][..n], &mut b[0][..n]);
            for ((pair, x), y) in frame.chunks_exact(2).zip(a.iter_mut()).zip(b.iter_mut()) {
                *x = ULAW[usize::from(pair[0])];
                *y = ULAW[usize::from(pair[1])];
            }
        }
        (Encoding::Pcmu, _) => {
            for (i, sample_frame) in frame.chunks_exact(channels).enumerate() {
                for (out, &b) in outs.iter_mut().zip(sample_frame) {
                    out[i] = ULAW[usize::from(b)];
                }
            }
        }
        (Encoding::L16, _) => {
            for (i, sample_frame) in frame.chunks_exact(2 * channels).enumerate() {
                for (out, b) in outs.iter_mut().zip(sample_frame.chunks_exact(2)) {
                    out[i] = i16::from_le_bytes([b[0], b[1]]);
                }
            }
        }
    }
    Ok(n)
}

/// Decodes L16 little-endian bytes of one channel into `out`; returns the samples written.
pub fn decode_l16_into(input: &[u8], out: &mut [i16]) -> usize {
    let n = (input.len() / 2).min(out.len());
    for (o, b) in out[..n].iter_mut().zip(input.chunks_exact(2)) {
        *o = i16::from_le_bytes([b[0], b[1]]);
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(
        encoding: Encoding,
        frame: &[u8],
        channels: usize,
    ) -> Result<Vec<Vec<i16>>, FrameError> {
        let mut bufs = vec![vec![0i16; 64]; channels];
        let mut outs: Vec<&mut [i16]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
        let n = deinterleave_into(encoding, frame, &mut outs)?;
        Ok(bufs
            .into_iter()
            .map(|mut b| {
                b.truncate(n);
                b
            })
            .collect())
    }

    #[test]
    fn pcmu_stereo_and_mono() {
        let frame = [0xFF, 0x00, 0x80, 0xFF, 0x00, 0x80];
        assert_eq!(
            split(Encoding::Pcmu, &frame, 2).unwrap(),
            [vec![0, 32124, -32124], vec![-32124, 0, 32124]]
        );
        assert_eq!(
            split(Encoding::Pcmu, &frame, 1).unwrap(),
            [vec![0, -32124, 32124, 0, -32124, 32124]]
        );
        assert_eq!(
            split(Encoding::Pcmu, &frame, 3).unwrap(),
            [vec![0, 0], vec![-32124, -32124], vec![32124, 32124]]
        );
    }

    #[test]
    fn l16_is_little_endian() {
        let frame = [0x01, 0x00, 0xFF, 0xFF, 0x00, 0x80, 0xFF, 0x7F];
        assert_eq!(
            split(Encoding::L16, &frame, 2).unwrap(),
            [vec![1, i16::MIN], vec![-1, i16::MAX]]
        );
        let mut out = [0i16; 4];
        assert_eq!(decode_l16_into(&frame, &mut out), 4);
        assert_eq!(out, [1, -1, i16::MIN, i16::MAX]);
    }

    #[test]
    fn partial_frames_and_bad_shapes_are_errors() {
        assert_eq!(
            split(Encoding::Pcmu, &[0; 5], 2),
            Err(FrameError::PartialFrame {
                len: 5,
                frame_bytes: 2
            })
        );
        assert_eq!(
            split(Encoding::L16, &[0; 6], 2),
            Err(FrameError::PartialFrame {
                len: 6,
                frame_bytes: 4
            })
        );
        assert_eq!(
            split(Encoding::L16, &[0; 3], 1),
            Err(FrameError::PartialFrame {
                len: 3,
                frame_bytes: 2
            })
        );
        assert_eq!(
            samples_per_channel(Encoding::Pcmu, 0, 4),
            Err(FrameError::Channels(0))
        );
        assert_eq!(
            samples_per_channel(Encoding::Pcmu, 9, 9),
            Err(FrameError::Channels(9))
        );
        let mut small = [0i16; 1];
        let mut other = [0i16; 8];
        let mut outs: [&mut [i16]; 2] = [&mut small, &mut other];
        assert_eq!(
            deinterleave_into(Encoding::Pcmu, &[0; 4], &mut outs),
            Err(FrameError::OutputTooSmall { have: 1, need: 2 })
        );
        assert_eq!(
            split(Encoding::Pcmu, &[], 2).unwrap(),
            [Vec::<i16>::new(), Vec::new()]
        );
    }

    #[test]
    fn any_frame_length_that_is_whole_decodes_the_same_as_one_frame() {
        let bytes: Vec<u8> = (0..=255u8).cycle().take(3200).collect();
        let whole = split_owned(&bytes);
        let mut pieces = vec![Vec::new(), Vec::new()];
        for chunk in bytes.chunks(34) {
            let part = split_owned(chunk);
            pieces[0].extend_from_slice(&part[0]);
            pieces[1].extend_from_slice(&part[1]);
        }
        assert_eq!(whole, pieces);
    }

    fn split_owned(frame: &[u8]) -> Vec<Vec<i16>> {
        let n = frame.len() / 2;
        let mut bufs = vec![vec![0i16; n]; 2];
        let mut outs: Vec<&mut [i16]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
        deinterleave_into(Encoding::Pcmu, frame, &mut outs).unwrap();
        bufs
    }
}
