//! `bench asr`: the speech engine on the fixtures, by workers and batch size.

use super::*;

pub(super) fn asr(
    config: &Config,
    dir: &PathBuf,
    workers: &[usize],
    batches: &[usize],
) -> anyhow::Result<Table> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "wav"))
        .collect();
    files.sort();
    let references: std::collections::HashMap<String, String> =
        match std::fs::read_to_string(dir.join("manifest.tsv")) {
            Ok(text) => text
                .lines()
                .filter_map(|l| l.split_once('\t'))
                .map(|(f, r)| (f.to_owned(), r.to_owned()))
                .collect(),
            Err(_) => Default::default(),
        };
    let mut utterances = Vec::new();
    let mut expected = Vec::new();
    for f in &files {
        let audio = decode(std::fs::read(f)?, Some("wav"), OUTPUT_RATE)
            .with_context(|| f.display().to_string())?;
        utterances.extend(audio.channels.into_iter().take(1));
        let name = f.file_name().map(|n| n.to_string_lossy().into_owned());
        expected.push(name.and_then(|n| references.get(&n).cloned()));
    }
    let audio_secs: f64 = utterances
        .iter()
        .map(|u| u.len() as f64 / OUTPUT_RATE as f64)
        .sum();
    let mut table = Table::new(
        format!(
            "{} utterances, {:.1} s of audio, model {}, beam {}, window >= {} ms, one CPU thread per worker",
            utterances.len(),
            audio_secs,
            config.models.whisper.display(),
            config.asr.beam_size,
            config.asr.min_window_ms,
        ),
        &["workers", "batch", "wall s", "CPU s", "utterances/s", "RTF (wall/audio)", "batches", "WER"],
    );
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
            let cpu = cpu_seconds();
            let started = Instant::now();
            for (i, u) in utterances.iter().enumerate() {
                let tx = tx.clone();
                pool.submit_file(Job {
                    audio: u.clone(),
                    language: "en".into(),
                    reply: Box::new(move |r| {
                        let _ = tx.send((i, r));
                    }),
                    cancel: None,
                })?;
            }
            drop(tx);
            let mut failed = 0;
            let mut errors = WerCount::default();
            for (i, r) in rx.iter() {
                match (r, &expected[i]) {
                    (Ok(t), Some(reference)) => errors = errors + wer(reference, &t.text),
                    (Ok(_), None) => {}
                    (Err(_), _) => failed += 1,
                }
            }
            let wall = started.elapsed().as_secs_f64();
            let cpu = cpu_seconds() - cpu;
            anyhow::ensure!(failed == 0, "{failed} utterances failed");
            let snap = pool.snapshot();
            let wer = if errors.reference_words > 0 {
                format!(
                    "{:.1}% of {} words",
                    100.0 * errors.rate(),
                    errors.reference_words
                )
            } else {
                "-".to_owned()
            };
            table.row(vec![
                w.to_string(),
                b.to_string(),
                format!("{wall:.1}"),
                format!("{cpu:.1}"),
                format!("{:.2}", utterances.len() as f64 / wall),
                format!("{:.3}", wall / audio_secs),
                snap.batches.to_string(),
                wer,
            ]);
        }
    }
    Ok(table)
}
