//! G.711: mu-law (PCMU) and A-law (PCMA) bytes to 16-bit linear PCM, and linear PCM to mu-law
//! (what an AudioHook client sends).
//!
//! Both are 256-entry tables computed at compile time from the ITU-T G.711 segment layout, so
//! decoding is one indexed load per sample. The tests compare all 256 codes of each law with
//! reference tables produced by an independent decoder (`fixtures/g711/`).

/// Mu-law code to linear sample.
const fn ulaw_to_linear(code: u8) -> i16 {
    let u = !code;
    let t = (((u & 0x0F) as i32) << 3) + 0x84;
    let t = t << ((u & 0x70) >> 4);
    (if u & 0x80 != 0 { 0x84 - t } else { t - 0x84 }) as i16
}

/// A-law code to linear sample.
const fn alaw_to_linear(code: u8) -> i16 {
    let a = code ^ 0x55;
    let mut t = ((a & 0x0F) as i32) << 4;
    let segment = (a & 0x70) >> 4;
    t = match segment {
        0 => t + 8,
        1 => t + 0x108,
        _ => (t + 0x108) << (segment - 1),
    };
    (if a & 0x80 != 0 { t } else { -t }) as i16
}

const fn table(alaw: bool) -> [i16; 256] {
    let mut out = [0i16; 256];
    let mut i = 0;
    while i < 256 {
        out[i] = if alaw {
            alaw_to_linear(i as u8)
        } else {
            ulaw_to_linear(i as u8)
        };
        i += 1;
    }
    out
}

/// Mu-law decoding table.
pub static ULAW: [i16; 256] = table(false);
/// A-law decoding table.
pub static ALAW: [i16; 256] = table(true);

/// Decodes mu-law bytes into `out`, which must be at least as long as `input`; returns the
/// number of samples written.
pub fn decode_ulaw_into(input: &[u8], out: &mut [i16]) -> usize {
    decode_with(&ULAW, input, out)
}

/// Decodes A-law bytes into `out`, which must be at least as long as `input`; returns the
/// number of samples written.
pub fn decode_alaw_into(input: &[u8], out: &mut [i16]) -> usize {
    decode_with(&ALAW, input, out)
}

/// Linear sample to mu-law code (ITU-T G.711, with the usual bias of 0x84 and clip at 32635).
pub const fn linear_to_ulaw(sample: i16) -> u8 {
    const BIAS: i32 = 0x84;
    const CLIP: i32 = 32_635;
    let mut x = sample as i32;
    let sign = if x < 0 {
        x = -x;
        0x80
    } else {
        0
    };
    if x > CLIP {
        x = CLIP;
    }
    x += BIAS;
    let mut exponent = 7;
    let mut mask = 0x4000;
    while exponent > 0 && x & mask == 0 {
        exponent -= 1;
        mask >>= 1;
    }
    let mantissa = (x >> (exponent + 3)) & 0x0F;
    !(sign | (exponent << 4) | mantissa) as u8
}

/// Encodes linear samples as mu-law into `out`; returns the number of codes written.
pub fn encode_ulaw_into(input: &[i16], out: &mut [u8]) -> usize {
    let n = input.len().min(out.len());
    for (o, &s) in out[..n].iter_mut().zip(&input[..n]) {
        *o = linear_to_ulaw(s);
    }
    n
}

fn decode_with(table: &[i16; 256], input: &[u8], out: &mut [i16]) -> usize {
    let n = input.len().min(out.len());
    for (o, &b) in out[..n].iter_mut().zip(&input[..n]) {
        *o = table[usize::from(b)];
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(name: &str) -> Vec<i16> {
        let path = crate::package_dir(env!("CARGO_MANIFEST_DIR")).join("../fixtures/g711");
        std::fs::read_to_string(path.join(name))
            .unwrap()
            .lines()
            .map(|l| l.parse().unwrap())
            .collect()
    }

    #[test]
    fn all_256_ulaw_codes_match_the_reference() {
        let reference = reference("ulaw.txt");
        assert_eq!(reference.len(), 256);
        for code in 0..256 {
            assert_eq!(ULAW[code], reference[code], "mu-law code {code:#04x}");
        }
    }

    #[test]
    fn all_256_alaw_codes_match_the_reference() {
        let reference = reference("alaw.txt");
        assert_eq!(reference.len(), 256);
        for code in 0..256 {
            assert_eq!(ALAW[code], reference[code], "A-law code {code:#04x}");
        }
    }

    #[test]
    fn known_points() {
        // Silence codes and full scale of each law.
        assert_eq!(
            (ULAW[0xFF], ULAW[0x7F], ULAW[0x00], ULAW[0x80]),
            (0, 0, -32124, 32124)
        );
        assert_eq!(
            (ALAW[0xD5], ALAW[0x55], ALAW[0xAA], ALAW[0x2A]),
            (8, -8, 32256, -32256)
        );
    }

    #[test]
    fn decode_into_respects_the_output_length() {
        let mut out = [1i16; 2];
        assert_eq!(decode_ulaw_into(&[0xFF, 0x00, 0x80], &mut out), 2);
        assert_eq!(out, [0, -32124]);
        let mut out = [0i16; 4];
        assert_eq!(decode_alaw_into(&[0xD5], &mut out), 1);
        assert_eq!(out, [8, 0, 0, 0]);
    }

    #[test]
    fn ulaw_encoding_inverts_decoding() {
        for code in 0..=255u8 {
            let back = linear_to_ulaw(ULAW[usize::from(code)]);
            // 0x7F and 0xFF both decode to zero; zero encodes as 0xFF.
            let expect = if code == 0x7F { 0xFF } else { code };
            assert_eq!(back, expect, "code {code:#04x}");
        }
        assert_eq!(linear_to_ulaw(i16::MAX), 0x80);
        assert_eq!(linear_to_ulaw(i16::MIN), 0x00);
    }
}
