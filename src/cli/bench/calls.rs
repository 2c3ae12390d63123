//! `bench calls`: live calls at once against real instances, in real time or lockstep.

use super::*;

/// The recording started at the quietest 100 ms within a second of `at` (so no word is cut)
/// and wrapped around: the same call, its utterances at other moments.
fn rotate_at_pause(channels: &[Vec<i16>], at: usize) -> Vec<Vec<i16>> {
    const FRAME: usize = 800;
    let len = channels.iter().map(Vec::len).min().unwrap_or(0);
    if at == 0 || len <= 2 * 8000 {
        return channels.to_vec();
    }
    let energy = |from: usize| -> u64 {
        channels
            .iter()
            .map(|c| {
                c[from..(from + FRAME).min(len)]
                    .iter()
                    .map(|&v| u64::from(v.unsigned_abs()))
                    .sum::<u64>()
            })
            .sum()
    };
    let lo = at.saturating_sub(8000).min(len - FRAME);
    let hi = (at + 8000).min(len - FRAME);
    let cut = (lo..=hi)
        .step_by(FRAME / 4)
        .min_by_key(|&from| energy(from))
        .map_or(at, |from| from + FRAME / 2);
    channels
        .iter()
        .map(|c| {
            let mut c = c[..len].to_vec();
            c.rotate_left(cut % len);
            c
        })
        .collect()
}

/// `bench calls`: N simultaneous real-time calls on loopback, for each N.
pub(super) fn calls(
    config: &Config,
    levels: &[usize],
    audio: &std::path::Path,
    target: f64,
    lockstep: bool,
    instances: usize,
    with_file: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    use callstream::callclient::{load_audio, run_call, CallOptions};
    use std::sync::atomic::Ordering::Relaxed;
    anyhow::ensure!(
        instances == 1 || config.storage.backend == callstream::config::StorageBackend::Postgres,
        "--instances above 1 needs storage.backend = \"postgres\" (sled is one process's)"
    );
    let channels = load_audio(audio).map_err(anyhow::Error::msg)?;
    let audio_secs = channels[0].len() as f64 / 8000.0;
    let file = with_file
        .map(|path| -> anyhow::Result<_> {
            let bytes =
                std::fs::read(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            let extension = path.extension().map(|e| e.to_string_lossy().to_lowercase());
            Ok((path.display().to_string(), bytes, extension))
        })
        .transpose()?;
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let dir = tempfile_dir()?;
        let mut config = config.clone();
        config.storage.data_dir = dir.clone();
        let backend = bench_store(&mut config);
        // Calls here never ask for an analysis: no language model is loaded or contacted.
        config.llm.provider = callstream::config::LlmProviderKind::Upstream;
        config.llm.upstream.base_url = "http://127.0.0.1:9/v1".into();
        config.llm.upstream.model = "unused".into();
        config.plans.insert(
            "bench".into(),
            callstream::config::Plan::unlimited(),
        );
        let mut apps = Vec::new();
        for _ in 0..instances.max(1) {
            apps.push(callstream::app::App::open(config.clone()).await?);
        }
        let stats: Vec<_> = apps.iter().map(|app| app.calls.stats.clone()).collect();
        let held = || stats.iter().map(|s| s.utterances_held.load(Relaxed)).sum::<u64>();
        let dropped = || stats.iter().map(|s| s.utterances_dropped.load(Relaxed)).sum::<u64>();
        let callstream::admin::AdminResponse::Org(org) = apps[0].admin.execute(callstream::admin::AdminRequest::OrgCreate { name: "bench".into(), plan: Some("bench".into()) }).await? else {
            anyhow::bail!("org create answered something else")
        };
        let callstream::admin::AdminResponse::ConnectorSecret { connector, client_secret, .. } = apps[0].admin.execute(callstream::admin::AdminRequest::ConnectorCreate { org: org.id, name: None }).await? else {
            anyhow::bail!("connector create answered something else")
        };
        let file_engines = apps[0].files();
        let mut servers = Vec::new();
        for app in apps {
            servers.push(callstream::server::start(app, "127.0.0.1:0".parse()?).await?);
        }
        let urls: Vec<String> = servers
            .iter()
            .map(|server| format!("ws://{}/api/callstream/ws", server.addr))
            .collect();
        println!(
            "{:.1} s stereo call per connection, real time, 200 ms PCMU frames, {}; {} instance(s) ({:?} store), {} ASR workers (beam {}) each, {} cores",
            audio_secs,
            if lockstep {
                "every call from the start (lockstep)"
            } else {
                "call i of N from i/N of the way in"
            },
            urls.len(),
            backend,
            config.asr.workers,
            config.asr.beam_size,
            std::thread::available_parallelism().map_or(0, |n| n.get())
        );
        if let Some((name, bytes, _)) = &file {
            println!("beside every round: {name} ({} bytes) transcribed on the first instance, no analyses", bytes.len());
        }
        println!(
            "calls  refused  transcripts  p50 s  p95 s  max s  CPU cores  held  dropped{}",
            if file.is_some() { "  file s  file audio s" } else { "" }
        );
        let mut best = None;
        for &n in levels {
            let (held0, dropped0) = (held(), dropped());
            let cpu0 = cpu_seconds();
            let started = Instant::now();
            // The upload starts with the round, so the calls stream while it is transcribed.
            let upload = file.as_ref().map(|(_, bytes, extension)| {
                let engines = file_engines.clone();
                let request = callstream::files::FileRequest {
                    bytes: bytes.clone(),
                    extension: extension.clone(),
                    language: "en".into(),
                    analyses: callstream::files::Analyses::default(),
                    redact: false,
                };
                tokio::spawn(async move {
                    let started = Instant::now();
                    let transcript = callstream::files::transcribe(&engines, request, None, None).await;
                    (started.elapsed().as_secs_f64(), transcript)
                })
            });
            let mut tasks = Vec::new();
            for i in 0..n {
                let options = CallOptions::new(&urls[i % urls.len()], &connector.client_id, Some(&client_secret));
                let channels = if lockstep {
                    channels.clone()
                } else {
                    rotate_at_pause(&channels, channels[0].len() * i / n.max(1))
                };
                // Calls start spread over one second, as real ones do not start in lockstep.
                let delay = std::time::Duration::from_millis((1000 * i / n.max(1)) as u64);
                tasks.push(tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    run_call(&options, &channels, |_| {}).await
                }));
            }
            let mut latencies = Vec::new();
            let mut refused = 0;
            for t in tasks {
                // A call the instance refused at its capacity (admission control) is counted,
                // and the calls it took are measured.
                let outcome = match t.await? {
                    Err(callstream::callclient::CallError::Refused { status: 503, .. }) => {
                        refused += 1;
                        continue;
                    }
                    other => other?,
                };
                anyhow::ensure!(outcome.close.as_ref().is_some_and(|c| c.0 == 1000), "a call ended with {:?}", outcome.close);
                for m in outcome.of_type("event") {
                    let data = &m.message["parameters"]["entities"][0]["data"];
                    let secs = |k: &str| data[k].as_str().and_then(|s| s.trim_start_matches("PT").trim_end_matches('S').parse::<f64>().ok()).unwrap_or(0.0);
                    let end = secs("offset") + secs("duration");
                    if let Some(sent) = outcome.sent_at(end) {
                        latencies.push(m.at.saturating_sub(sent).as_secs_f64());
                    }
                }
            }
            let file_cells = match upload {
                None => String::new(),
                Some(upload) => {
                    let (secs, transcript) = upload.await?;
                    let transcript = transcript.map_err(|e| anyhow::anyhow!("the file: {e}"))?;
                    format!("  {secs:>6.1}  {:>12.1}", transcript.duration)
                }
            };
            let wall = started.elapsed().as_secs_f64();
            let cores = (cpu_seconds() - cpu0) / wall;
            latencies.sort_by(f64::total_cmp);
            let (p50, p95) = (percentile(&latencies, 0.5), percentile(&latencies, 0.95));
            let max = latencies.last().copied().unwrap_or(0.0);
            println!(
                "{n:>5}  {refused:>7}  {:>11}  {p50:>5.2}  {p95:>5.2}  {max:>5.2}  {cores:>9.2}  {:>4}  {:>7}{file_cells}",
                latencies.len(),
                held() - held0,
                dropped() - dropped0,
            );
            if p95 < target {
                best = Some(n);
            }
        }
        match best {
            Some(n) => println!("largest N with p95 under {target} s: {n}"),
            None => println!("no N kept p95 under {target} s"),
        }
        for server in servers {
            server.stop().await;
        }
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::rotate_at_pause;

    #[test]
    fn a_call_is_rotated_at_a_pause_and_keeps_every_sample() {
        // Two channels of "speech" (a loud pattern) with a silent stretch at 3.0-3.5 s.
        let mut channels = vec![Vec::new(), Vec::new()];
        for i in 0..48_000usize {
            let silent = (24_000..28_000).contains(&i);
            for (c, ch) in channels.iter_mut().enumerate() {
                ch.push(if silent {
                    0
                } else {
                    ((i * 37 + c * 11) % 2000) as i16 - 1000
                });
            }
        }
        let rotated = rotate_at_pause(&channels, 25_000);
        for (a, b) in channels.iter().zip(&rotated) {
            assert_eq!(a.len(), b.len());
            let (mut x, mut y) = (a.clone(), b.clone());
            x.sort_unstable();
            y.sort_unstable();
            assert_eq!(x, y);
        }
        // It starts in the pause.
        assert!(rotated.iter().all(|c| c[0] == 0));
        // At 0 nothing moves.
        assert_eq!(rotate_at_pause(&channels, 0), channels);
    }
}
