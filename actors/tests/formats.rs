//! Every accepted file format decodes to the same speech, and bad files are typed errors.
//! Fixtures: `fixtures/formats/` (built by its build.sh from one telephone-set sentence).

use std::path::PathBuf;

use callstream_actors::asr::wer::wer;
use callstream_actors::asr::whisper::{WhisperEngine, WhisperSettings};
use callstream_actors::asr::AsrEngine;
use callstream_actors::audio::decode::{decode, DecodeError, OUTPUT_RATE};

const SENTENCE: &str = "I was charged twice for the same order.";
const SECONDS: f64 = 3.275;

fn dir() -> PathBuf {
    callstream_actors::package_dir(env!("CARGO_MANIFEST_DIR")).join("../fixtures/formats")
}

fn decode_file(name: &str) -> Result<callstream_actors::audio::decode::DecodedAudio, DecodeError> {
    let path = dir().join(name);
    let ext = path.extension().map(|e| e.to_string_lossy().into_owned());
    decode(std::fs::read(&path).unwrap(), ext.as_deref(), OUTPUT_RATE)
}

fn rms(x: &[f32]) -> f32 {
    (x.iter().map(|v| v * v).sum::<f32>() / x.len().max(1) as f32).sqrt()
}

#[test]
fn every_format_decodes_to_the_same_sentence() {
    let model =
        callstream_actors::package_dir(env!("CARGO_MANIFEST_DIR")).join("../models/whisper-base");
    let mut engine = WhisperEngine::load(&model, WhisperSettings::default())
        .expect("run scripts/setup.sh --test");
    let files = [
        ("pcm8-mono-8k.wav", 1, "pcm_u8"),
        ("pcm16-mono-16k.wav", 1, "pcm_s16le"),
        ("pcm24-mono-22k.wav", 1, "pcm_s24le"),
        ("pcm32-mono-16k.wav", 1, "pcm_s32le"),
        ("float32-mono-16k.wav", 1, "pcm_f32le"),
        ("alaw-mono-8k.wav", 1, "pcm_alaw"),
        ("mulaw-mono-8k.wav", 1, "pcm_mulaw"),
        ("pcm16-stereo-16k.wav", 2, "pcm_s16le"),
        ("flac16-mono-44k.flac", 1, "flac"),
        ("vorbis-mono-44k.ogg", 1, "vorbis"),
        ("mp3-mono-44k.mp3", 1, "mp3"),
        ("opus-mono.opus", 1, "opus"),
        ("opus-stereo.opus", 2, "opus"),
    ];
    for (name, channels, codec) in files {
        let audio = decode_file(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(audio.channels.len(), channels, "{name}");
        assert_eq!(audio.codec, codec, "{name}");
        assert_eq!(audio.rate, OUTPUT_RATE);
        // MP3 and Vorbis encoders pad a little; nothing may be lost.
        let secs = audio.duration_secs();
        assert!(
            (SECONDS - 0.01..SECONDS + 0.1).contains(&secs),
            "{name}: {secs} s"
        );
        let t = engine
            .transcribe(&[&audio.channels[0]], "en")
            .unwrap()
            .remove(0);
        let count = wer(SENTENCE, &t.text);
        assert!(count.edits <= 1, "{name}: {:?}", t.text);
        assert!(rms(&audio.channels[0]) > 0.01, "{name} is silent");
        if name == "pcm16-stereo-16k.wav" {
            assert!(
                rms(&audio.channels[1]) < 1e-4,
                "the right channel of {name} is silence"
            );
        }
    }
}

#[test]
fn bad_files_are_typed_errors() {
    assert!(matches!(
        decode_file("not-audio.txt"),
        Err(DecodeError::Unsupported(_))
    ));
    assert!(matches!(
        decode_file("truncated.wav"),
        Err(DecodeError::Corrupt(_) | DecodeError::Empty)
    ));
    assert!(matches!(
        decode_file("not-audio.mp3"),
        Err(DecodeError::Unsupported(_))
    ));
}
