//! `callstream bench ...`: performance measurements that need the real engines.

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Instant;

use anyhow::Context;
use callstream::config::Config;
use callstream_actors::asr::pool::{Job, PoolConfig};
use callstream_actors::audio::decode::{decode, OUTPUT_RATE};

/// Benchmarks.
#[derive(clap::Subcommand)]
pub enum BenchCommand {
    /// Speech-recognition throughput on a fixture set: utterances per second and real-time
    /// factor for each worker count and batch size.
    Asr {
        /// Directory with the utterances (every .wav in it).
        #[arg(long, default_value = "fixtures/telephone/speech")]
        fixtures: PathBuf,
        /// Worker counts to try, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,2")]
        workers: Vec<usize>,
        /// Batch sizes to try, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,4")]
        batch: Vec<usize>,
    },
}

/// Runs a benchmark.
pub fn run(config: &Config, command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Asr {
            fixtures,
            workers,
            batch,
        } => asr(config, &fixtures, &workers, &batch),
    }
}

fn asr(config: &Config, dir: &PathBuf, workers: &[usize], batches: &[usize]) -> anyhow::Result<()> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "wav"))
        .collect();
    files.sort();
    let mut utterances = Vec::new();
    for f in &files {
        let audio = decode(std::fs::read(f)?, Some("wav"), OUTPUT_RATE)
            .with_context(|| f.display().to_string())?;
        utterances.extend(audio.channels.into_iter().take(1));
    }
    let audio_secs: f64 = utterances
        .iter()
        .map(|u| u.len() as f64 / OUTPUT_RATE as f64)
        .sum();
    println!(
        "{} utterances, {:.1} s of audio, beam {}, one CPU thread per worker",
        utterances.len(),
        audio_secs,
        config.asr.beam_size
    );
    println!("workers  batch  wall s  utterances/s  RTF (wall/audio)  batches");
    for &w in workers {
        for &b in batches {
            let pool = callstream::speech::start_pool(
                config,
                Some(PoolConfig {
                    workers: w,
                    max_batch: b,
                    file_queue: utterances.len().max(1),
                    ..config.asr.pool()
                }),
            )?;
            let (tx, rx) = mpsc::channel();
            let started = Instant::now();
            for u in &utterances {
                let tx = tx.clone();
                pool.submit_file(Job {
                    audio: u.clone(),
                    language: "en".into(),
                    reply: Box::new(move |r| {
                        let _ = tx.send(r);
                    }),
                })?;
            }
            drop(tx);
            let mut failed = 0;
            for r in rx.iter() {
                failed += usize::from(r.is_err());
            }
            let wall = started.elapsed().as_secs_f64();
            anyhow::ensure!(failed == 0, "{failed} utterances failed");
            let snap = pool.snapshot();
            println!(
                "{w:>7}  {b:>5}  {wall:>6.1}  {:>12.2}  {:>16.3}  {:>7}",
                utterances.len() as f64 / wall,
                wall / audio_secs,
                snap.batches
            );
        }
    }
    Ok(())
}
