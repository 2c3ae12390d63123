//! Property tests of the parsers that take bytes from strangers: AudioHook text frames and
//! audio frame lengths (the session state machine), and audio files (the decoder, WAV headers
//! in particular). Whatever comes in, the answer is a value or a typed error, never a panic, and
//! nothing out of the limits is decoded.

use callstream_actors::audio::decode::{DecodeError, DecodeLimits, FileDecoder};
use callstream_actors::protocol::session::{Session, Step};
use proptest::prelude::*;

fn wav(format_tag: u16, channels: u16, rate: u32, bits: u16, block: u16, data: &[u8]) -> Vec<u8> {
    let mut h = Vec::new();
    h.extend_from_slice(b"RIFF");
    h.extend_from_slice(&(36 + data.len() as u32).to_le_bytes());
    h.extend_from_slice(b"WAVEfmt ");
    h.extend_from_slice(&16u32.to_le_bytes());
    h.extend_from_slice(&format_tag.to_le_bytes());
    h.extend_from_slice(&channels.to_le_bytes());
    h.extend_from_slice(&rate.to_le_bytes());
    h.extend_from_slice(&rate.wrapping_mul(u32::from(block)).to_le_bytes());
    h.extend_from_slice(&block.to_le_bytes());
    h.extend_from_slice(&bits.to_le_bytes());
    h.extend_from_slice(b"data");
    h.extend_from_slice(&(data.len() as u32).to_le_bytes());
    h.extend_from_slice(data);
    h
}

/// Decodes all of a file within the default limits and a 60 s cap.
fn decode_all(bytes: Vec<u8>) -> Result<(u64, u32), DecodeError> {
    let limits = DecodeLimits {
        max_secs: 60.0,
        ..DecodeLimits::default()
    };
    let mut decoder = FileDecoder::open(bytes, None, limits)?;
    while decoder.next_block()?.is_some() {}
    Ok((decoder.frames(), decoder.info().rate))
}

fn client_message() -> impl Strategy<Value = String> {
    let kind = prop_oneof![
        Just("open"),
        Just("ping"),
        Just("update"),
        Just("paused"),
        Just("resumed"),
        Just("discarded"),
        Just("error"),
        Just("close"),
        Just("analyze"),
        Just("dtmf"),
    ];
    let params = prop_oneof![
        Just(serde_json::json!({})),
        Just(serde_json::json!({"reason": "end"})),
        Just(serde_json::json!({"start": "PT1S", "discarded": "PT2.5S"})),
        Just(serde_json::json!({"start": "PT-1S", "discarded": "PT99999999999999999999S"})),
        Just(serde_json::json!({"language": "de-DE"})),
        Just(
            serde_json::json!({"organizationId": "o", "conversationId": "c",
            "participant": {"id": "p"}, "media": [{"type": "audio", "format": "PCMU",
            "channels": ["external", "internal"], "rate": 8000}], "language": "en-US"})
        ),
        Just(
            serde_json::json!({"organizationId": "o", "conversationId": "c",
            "participant": {"id": "p"}, "media": [{"type": "audio", "format": "L16",
            "channels": [], "rate": 0}]})
        ),
        Just(serde_json::json!(null)),
    ];
    (kind, params, any::<u64>(), any::<u64>(), "[a-z0-9-]{0,8}").prop_map(
        |(kind, params, seq, serverseq, id)| {
            serde_json::json!({"version": "2", "id": id, "type": kind, "seq": seq % 4,
                "serverseq": serverseq % 3, "position": "PT0S", "parameters": params})
            .to_string()
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any text frame, well-formed or not, gives a step; a session only ever ends by the rules.
    #[test]
    fn any_text_frames_give_steps(frames in proptest::collection::vec(
        prop_oneof![client_message(), ".{0,300}"], 0..12)
    ) {
        let mut session = Session::new(None);
        for frame in &frames {
            let _step: Step = session.on_text(frame);
        }
    }

    /// Any audio frame length, in any state, gives a step.
    #[test]
    fn any_audio_lengths_give_steps(lengths in proptest::collection::vec(0usize..100_000, 0..20)) {
        let mut session = Session::new(None);
        for len in lengths {
            let _ = session.on_audio(len);
        }
    }

    /// Bytes that are not audio are refused.
    #[test]
    fn any_bytes_are_decoded_or_refused(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
        let _ = decode_all(bytes);
    }

    /// Whatever a WAV header declares, the file is decoded within the limits or refused.
    #[test]
    fn any_wav_header_is_decoded_within_limits_or_refused(
        format_tag in prop_oneof![Just(1u16), Just(3), Just(6), Just(7), any::<u16>()],
        channels in prop_oneof![0u16..10, any::<u16>()],
        rate in prop_oneof![Just(0u32), Just(1), Just(8_000), Just(44_100), Just(4_294_967_291), any::<u32>()],
        bits in prop_oneof![Just(8u16), Just(16), Just(24), Just(32), any::<u16>()],
        block in prop_oneof![Just(0u16), 1u16..16, any::<u16>()],
        data in proptest::collection::vec(any::<u8>(), 0..2048),
    ) {
        if let Ok((frames, rate)) = decode_all(wav(format_tag, channels, rate, bits, block, &data)) {
            prop_assert!((2_000..=192_000).contains(&rate), "{rate} Hz");
            prop_assert!(frames as f64 / f64::from(rate) <= 60.0);
        }
    }
}

#[test]
fn the_rates_of_the_hostile_files_are_refused_before_decoding() {
    for rate in [0u32, 1, 1_999, 192_001, 4_294_967_291] {
        let file = wav(1, 1, rate, 16, 2, &[0; 400]);
        match decode_all(file) {
            Err(DecodeError::Invalid(message)) => {
                assert!(message.contains("sample rate"), "{message}")
            }
            other => panic!("{rate} Hz: {other:?}"),
        }
    }
    for channels in [0u16, 9, 65_535] {
        let file = wav(1, channels, 8_000, 16, 2 * channels.max(1), &[0; 400]);
        assert!(
            matches!(decode_all(file), Err(DecodeError::Invalid(_))),
            "{channels} channels"
        );
    }
}

#[test]
fn a_declared_length_past_the_limit_is_refused_before_decoding() {
    // 8 kHz mono 16-bit, declaring 2 hours of data but holding a second.
    let mut file = wav(1, 1, 8_000, 16, 2, &[0; 16_000]);
    let declared = (2 * 3600 * 8_000 * 2) as u32;
    file[4..8].copy_from_slice(&(36 + declared).to_le_bytes());
    file[40..44].copy_from_slice(&declared.to_le_bytes());
    let limits = DecodeLimits {
        max_secs: 3600.0,
        ..DecodeLimits::default()
    };
    match FileDecoder::open(file, Some("wav"), limits) {
        Err(DecodeError::TooLong { declared_secs, .. }) => {
            assert!((declared_secs.unwrap() - 7200.0).abs() < 1.0)
        }
        other => panic!("{other:?}"),
    }
    // Without a declared length, decoding stops once the limit is passed.
    let long = wav(1, 1, 8_000, 16, 2, &vec![0; 8_000 * 2 * 3]);
    let limits = DecodeLimits {
        max_secs: 2.0,
        ..DecodeLimits::default()
    };
    // The header declares 3 s: refused at once.
    assert!(matches!(
        FileDecoder::open(long, Some("wav"), limits),
        Err(DecodeError::TooLong { .. })
    ));
}

#[test]
fn non_finite_float_samples_are_silenced() {
    // 32-bit float WAV (format 3) holding NaN, infinities and out-of-range values.
    let samples = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 7.5, -3.0, 0.25];
    let data: Vec<u8> = samples
        .iter()
        .cycle()
        .take(8_000)
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let mut decoder = FileDecoder::open(
        wav(3, 1, 8_000, 32, 4, &data),
        Some("wav"),
        DecodeLimits::default(),
    )
    .unwrap();
    while let Some(block) = decoder.next_block().unwrap() {
        assert!(block[0]
            .iter()
            .all(|v| v.is_finite() && (-1.0..=1.0).contains(v)));
    }
}
