//! Throughput of the audio path before the speech engine, in samples per second on one core.
//! One telephone channel is 8,000 samples/s, so 8,000,000 samples/s is 1,000x real time.
//!
//! Input: the Genesys stereo PCMU call in fixtures/ (real speech, 70.8 s).

use callstream_actors::audio::frame::{deinterleave_into, Encoding};
use callstream_actors::audio::g711::decode_ulaw_into;
use callstream_actors::audio::mel::LogMel;
use callstream_actors::audio::resample::Upsampler;
use callstream_actors::audio::vad::{Segmenter, VadConfig};
use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

/// The interleaved PCMU bytes of the fixture call (after its 44-byte header).
fn call_pcmu() -> Vec<u8> {
    let path = callstream_actors::package_dir(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/genesys-test-transcript-connector.wav");
    let bytes = std::fs::read(path).expect("the fixture call is in fixtures/");
    assert_eq!(&bytes[36..40], b"data", "plain 44-byte header");
    bytes[44..].to_vec()
}

/// Channel 0 of the call as 8 kHz samples.
fn channel0(pcmu: &[u8]) -> Vec<i16> {
    let mut a = vec![0i16; pcmu.len() / 2];
    let mut b = vec![0i16; pcmu.len() / 2];
    deinterleave_into(Encoding::Pcmu, pcmu, &mut [&mut a, &mut b]).unwrap();
    a
}

fn g711(c: &mut Criterion) {
    let pcmu = call_pcmu();
    let mut out = vec![0i16; pcmu.len()];
    let mut group = c.benchmark_group("g711");
    group.throughput(Throughput::Elements(pcmu.len() as u64));
    group.bench_function("ulaw_decode", |b| {
        b.iter(|| decode_ulaw_into(black_box(&pcmu), &mut out))
    });
    group.finish();
}

fn deinterleave(c: &mut Criterion) {
    let pcmu = call_pcmu();
    let mut group = c.benchmark_group("deinterleave");
    for frame_ms in [20usize, 200] {
        let frame = &pcmu[..frame_ms * 8 * 2];
        let mut a = vec![0i16; frame.len() / 2];
        let mut b = vec![0i16; frame.len() / 2];
        group.throughput(Throughput::Elements(frame.len() as u64));
        group.bench_with_input(
            BenchmarkId::new("pcmu_stereo_frame_ms", frame_ms),
            &frame,
            |bench, frame| {
                bench.iter(|| {
                    deinterleave_into(Encoding::Pcmu, black_box(frame), &mut [&mut a, &mut b])
                        .unwrap()
                })
            },
        );
    }
    group.finish();
}

fn resample(c: &mut Criterion) {
    let samples = channel0(&call_pcmu());
    let mut up = Upsampler::new().unwrap();
    let mut out = Vec::new();
    let mut group = c.benchmark_group("resample_8k_to_16k");
    for secs in [2usize, 10] {
        let input = &samples[8_000..8_000 + secs * 8_000];
        group.throughput(Throughput::Elements(input.len() as u64));
        group.bench_with_input(BenchmarkId::new("utterance_s", secs), &input, |b, input| {
            b.iter(|| up.utterance_into(black_box(input), &mut out).unwrap())
        });
    }
    group.finish();
}

fn vad(c: &mut Criterion) {
    let samples = channel0(&call_pcmu());
    let mut group = c.benchmark_group("vad");
    group.throughput(Throughput::Elements(samples.len() as u64));
    group.sample_size(20);
    group.bench_function("segment_call_channel", |b| {
        b.iter(|| {
            let mut seg = Segmenter::new(VadConfig::default());
            let mut n = 0;
            seg.push(black_box(&samples), &mut |_| n += 1);
            seg.finish(&mut |_| n += 1);
            n
        })
    });
    group.finish();
}

fn logmel(c: &mut Criterion) {
    let mut mel = LogMel::new();
    let mut out = vec![0.0; LogMel::output_len()];
    let mut group = c.benchmark_group("logmel");
    for secs in [5usize, 30] {
        let audio: Vec<f32> = (0..secs * 16_000)
            .map(|i| ((i as f32) * 0.01).sin() * 0.3)
            .collect();
        group.throughput(Throughput::Elements(audio.len() as u64));
        group.bench_with_input(BenchmarkId::new("utterance_s", secs), &audio, |b, audio| {
            b.iter(|| mel.compute_into(black_box(audio), &mut out))
        });
    }
    group.finish();
}

/// Everything a live call does before the speech engine, for both channels of the call:
/// 200 ms frames deinterleaved, each channel segmented, each utterance upsampled and turned
/// into Whisper features.
fn pipeline(c: &mut Criterion) {
    let pcmu = call_pcmu();
    let frame_bytes = 200 * 8 * 2;
    let mut group = c.benchmark_group("pipeline");
    group.throughput(Throughput::Elements(pcmu.len() as u64));
    group.sample_size(10);
    group.bench_function("pre_asr_stereo_call", |b| {
        let mut up = Upsampler::new().unwrap();
        let mut mel = LogMel::new();
        let mut wide = Vec::new();
        let mut features = vec![0.0; LogMel::output_len()];
        let mut a = vec![0i16; frame_bytes / 2];
        let mut bb = vec![0i16; frame_bytes / 2];
        b.iter(|| {
            let mut segs = [
                Segmenter::new(VadConfig::default()),
                Segmenter::new(VadConfig::default()),
            ];
            let mut utterances = 0;
            for frame in pcmu.chunks(frame_bytes) {
                let n = deinterleave_into(Encoding::Pcmu, frame, &mut [&mut a, &mut bb]).unwrap();
                for (seg, ch) in segs.iter_mut().zip([&a[..n], &bb[..n]]) {
                    seg.push(ch, &mut |u| {
                        up.utterance_into(&u.samples, &mut wide).unwrap();
                        mel.compute_into(&wide, &mut features);
                        utterances += 1;
                    });
                }
            }
            for seg in &mut segs {
                seg.finish(&mut |u| {
                    up.utterance_into(&u.samples, &mut wide).unwrap();
                    mel.compute_into(&wide, &mut features);
                    utterances += 1;
                });
            }
            utterances
        })
    });
    group.finish();
}

criterion_group!(benches, g711, deinterleave, resample, vad, logmel, pipeline);
criterion_main!(benches);
