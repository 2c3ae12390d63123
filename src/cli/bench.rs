//! `callstream bench ...`: performance measurements that need the real engines.

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Instant;

use anyhow::Context;
use callstream::config::Config;
use callstream_actors::asr::pool::{Job, PoolConfig};
use callstream_actors::asr::wer::{normalise, wer, WerCount};
use callstream_actors::audio::decode::{decode, OUTPUT_RATE};

/// Benchmarks.
#[derive(clap::Subcommand)]
pub enum BenchCommand {
    /// Speech recognition on a fixture set: utterances per second, real-time factor and CPU
    /// time for each worker count and batch size, and the word error rate when the set has a
    /// `manifest.tsv` (`file<TAB>reference`). The model, beam and window are the configured
    /// ones (`CALLSTREAM_MODELS__WHISPER`, `CALLSTREAM_ASR__BEAM_SIZE`,
    /// `CALLSTREAM_ASR__MIN_WINDOW_MS` override them).
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
        /// Also append the table to this Markdown file (docs/benchmarks.md), headed by the
        /// command, the date and the CPU.
        #[arg(long)]
        record: Option<PathBuf>,
    },
    /// File transcription: CPU and wall time of a long recording with packed encoder windows
    /// and with one window per utterance, and (with --faster-whisper) of faster-whisper on the
    /// same model, beam and language, one thread, channel after channel, in the same run.
    Files {
        /// The recording.
        #[arg(long, default_value = "fixtures/genesys-test-transcript-connector.wav")]
        audio: PathBuf,
        /// Times the recording is played back to back (9 gives a 10.6-minute call).
        #[arg(long, default_value_t = 9)]
        repeat: usize,
        /// Language code.
        #[arg(long, default_value = "en")]
        language: String,
        /// Also run faster-whisper (installed by scripts/setup.sh --bench).
        #[arg(long)]
        faster_whisper: bool,
        /// Instead of --audio, the calls of a labelled set (calls.txt and call-NN.flac) back to
        /// back, whose written dialogues are the reference: correct words and WER are reported.
        #[arg(long)]
        set: Option<PathBuf>,
        /// Writes each run's transcript here, one file per run and channel
        /// (`packed-0.txt`, `utterance-1.txt`...), a segment per line with its start time, and
        /// with --set the reference words of each channel (`reference-0.txt`...).
        #[arg(long)]
        text: Option<PathBuf>,
    },
    /// Added latency and throughput of REST chat on the upstream path, against a local
    /// provider stand-in that answers at once, on the configured store (sled in a temporary
    /// directory, or the configured PostgreSQL: use a scratch database, the bench writes its
    /// own organisation there).
    Gateway {
        /// Requests to send.
        #[arg(long, default_value_t = 2000)]
        requests: usize,
        /// Requests in flight.
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
        /// The organisation's monthly chat-token quota (unlimited by default): with one, every
        /// request also reserves from the pool and settles its reservation.
        #[arg(long)]
        token_quota: Option<u64>,
    },
    /// Live calls: streams N simultaneous real-time calls of a fixture over AudioHook on
    /// loopback and measures end-of-speech to final-transcript latency and CPU use, for each N.
    Calls {
        /// Simultaneous calls to try, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,2,4,6,8")]
        concurrency: Vec<usize>,
        /// The call to stream (stereo, 8 kHz).
        #[arg(long, default_value = "fixtures/genesys-test-transcript-connector.wav")]
        audio: PathBuf,
        /// Latency target the summary line checks p95 against, in seconds.
        #[arg(long, default_value_t = 2.0)]
        target: f64,
        /// Every call plays the recording from its start (calls start within one second, so
        /// their utterances end together: the worst burst). By default call i of N starts i/N
        /// of the way into the recording and wraps around, as independent calls do.
        #[arg(long)]
        lockstep: bool,
        /// Instances of the service in this process, sharing the configured PostgreSQL
        /// (`storage.backend = "postgres"`, a scratch database); calls go to them in turn.
        #[arg(long, default_value_t = 1)]
        instances: usize,
    },
    /// Time to first delta and tokens per second of the configured language model.
    Llm {
        /// Generations to time.
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// About this many tokens of earlier conversation before the question, so that the
        /// generation runs on a context of that length.
        #[arg(long, default_value_t = 0)]
        context: usize,
        /// Also append the table to this Markdown file (docs/benchmarks.md), headed by the
        /// command, the date and the CPU.
        #[arg(long)]
        record: Option<PathBuf>,
    },
    /// Intent, BANT and NEAT-P analyses with the configured model: intent top-1, status
    /// accuracy and verbatim evidence on a labelled set of calls, then the time of the three
    /// analyses of a long call and of a live call's intent as its transcript grows.
    Analysis {
        /// The labelled set (calls.txt and the recordings built from it).
        #[arg(long, default_value = "fixtures/analysis")]
        set: PathBuf,
        /// Analyse the written dialogues instead of transcribing the recordings.
        #[arg(long)]
        text: bool,
        /// Keep each recording's transcript in this directory (`<call id>.txt`), and read it
        /// from there instead of transcribing the recording again when it is there: two runs
        /// then analyse the same words (the speech engine's output varies from run to run).
        #[arg(long, conflicts_with = "text")]
        transcripts: Option<PathBuf>,
        /// Only the first N calls of the set.
        #[arg(long)]
        limit: Option<usize>,
        /// Only the calls whose id starts with one of these, comma-separated (`sales`,
        /// `tech,order`).
        #[arg(long, value_delimiter = ',')]
        calls: Vec<String>,
        /// Only the intent analysis of the set (no BANT or NEAT-P).
        #[arg(long)]
        intent_only: bool,
        /// Prompt the set as the service prompts a file's analyses (every profile's
        /// instructions, the transcript, then the task) or a live call's intent (the profile's
        /// own instructions, then the transcript).
        #[arg(long, value_enum, default_value_t = super::bench_analysis::SetLayout::Files)]
        layout: super::bench_analysis::SetLayout,
        /// Skip the labelled set.
        #[arg(long)]
        no_quality: bool,
        /// Skip the long call.
        #[arg(long)]
        no_speed: bool,
        /// The long call.
        #[arg(long, default_value = "fixtures/genesys-test-transcript-connector.wav")]
        audio: PathBuf,
        /// Times the long call is played back to back (9 gives 10.6 minutes).
        #[arg(long, default_value_t = 9)]
        repeat: usize,
        /// Seconds into the live call at which its intent is asked, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "60,120,180,240,300")]
        live_at: Vec<u64>,
    },
}

/// Runs a benchmark.
pub fn run(config: &Config, command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Asr {
            fixtures,
            workers,
            batch,
            record,
        } => asr(config, &fixtures, &workers, &batch)?.record(record.as_deref()),
        BenchCommand::Gateway {
            requests,
            concurrency,
            token_quota,
        } => gateway(config, requests, concurrency, token_quota),
        BenchCommand::Llm {
            runs,
            context,
            record,
        } => llm(config, runs, context)?.record(record.as_deref()),
        BenchCommand::Analysis {
            set,
            text,
            transcripts,
            limit,
            calls,
            intent_only,
            layout,
            no_quality,
            no_speed,
            audio,
            repeat,
            live_at,
        } => super::bench_analysis::bench(
            config,
            &super::bench_analysis::Options {
                set,
                text,
                transcripts,
                limit,
                calls,
                intent_only,
                layout: layout.into(),
                no_quality,
                long_call: (!no_speed).then_some(audio),
                repeat,
                live_at,
            },
        ),
        BenchCommand::Files {
            audio,
            repeat,
            language,
            faster_whisper,
            set,
            text,
        } => files(
            config,
            &audio,
            repeat,
            &language,
            faster_whisper,
            set.as_deref(),
            text.as_deref(),
        ),
        BenchCommand::Calls {
            concurrency,
            audio,
            target,
            lockstep,
            instances,
        } => calls(config, &concurrency, &audio, target, lockstep, instances),
    }
}

fn asr(
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

/// Words of a transcript, normalised as the word error rate compares them.
fn word_list<'a>(texts: impl Iterator<Item = &'a str>) -> Vec<String> {
    texts.flat_map(normalise).collect()
}

/// Writes 16 kHz channels as a 16-bit PCM WAV.
fn write_wav(path: &std::path::Path, channels: &[Vec<f32>]) -> anyhow::Result<()> {
    let frames = channels.first().map_or(0, Vec::len);
    let n = channels.len() as u16;
    let data_len = (frames * channels.len() * 2) as u32;
    let mut out = Vec::with_capacity(44 + data_len as usize);
    out.extend_from_slice(b"RIFF");
    out.extend_from_slice(&(36 + data_len).to_le_bytes());
    out.extend_from_slice(b"WAVEfmt ");
    out.extend_from_slice(&16u32.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&n.to_le_bytes());
    out.extend_from_slice(&(OUTPUT_RATE as u32).to_le_bytes());
    out.extend_from_slice(&(OUTPUT_RATE as u32 * 2 * u32::from(n)).to_le_bytes());
    out.extend_from_slice(&(2 * n).to_le_bytes());
    out.extend_from_slice(&16u16.to_le_bytes());
    out.extend_from_slice(b"data");
    out.extend_from_slice(&data_len.to_le_bytes());
    for i in 0..frames {
        for c in channels {
            let v = (c[i] * 32768.0).clamp(-32768.0, 32767.0) as i16;
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    std::fs::write(path, out)?;
    Ok(())
}

/// `bench files`: a long recording through the file path, packed and unpacked, and
/// optionally through faster-whisper.
fn files(
    config: &Config,
    audio: &std::path::Path,
    repeat: usize,
    language: &str,
    faster_whisper: bool,
    set: Option<&std::path::Path>,
    text: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    use callstream_actors::asr::file::{transcribe_channels, Packing};
    use callstream_actors::asr::wer::correct_words;
    // The recording, and with a set the reference words of each channel.
    let (channels, references) = match set {
        None => (super::bench_analysis::load_audio(audio, repeat)?, None),
        Some(dir) => {
            let calls = super::bench_analysis::read_calls(&dir.join("calls.txt"))?;
            let mut channels: Vec<Vec<f32>> = vec![Vec::new(), Vec::new()];
            let mut references = vec![String::new(), String::new()];
            for (n, call) in calls.iter().enumerate() {
                let path = dir.join(format!("call-{:02}.flac", n + 1));
                let audio = super::bench_analysis::load_audio(&path, 1)?;
                anyhow::ensure!(audio.len() == 2, "{}: not stereo", path.display());
                for (all, one) in channels.iter_mut().zip(audio) {
                    all.extend(one);
                }
                for (customer, said) in &call.turns {
                    let r = &mut references[usize::from(!customer)];
                    r.push_str(said);
                    r.push(' ');
                }
            }
            println!("{} calls of {} back to back", calls.len(), dir.display());
            (channels, Some(references))
        }
    };
    let score = |name: &str, words_by_channel: &[Vec<String>]| {
        if let Some(references) = &references {
            let (mut correct, mut count) = (0, WerCount::default());
            for (r, h) in references.iter().zip(words_by_channel) {
                let h = h.join(" ");
                correct += correct_words(r, &h);
                count = count + wer(r, &h);
            }
            println!(
                "{name}: {correct} of {} reference words correct, WER {:.1}%",
                count.reference_words,
                100.0 * count.rate()
            );
        }
    };
    let secs = channels
        .first()
        .map_or(0.0, |c| c.len() as f64 / OUTPUT_RATE as f64);
    println!(
        "{:.1} min, {} channels; model {}, beam {}, window >= {} ms; {} workers of one thread",
        secs / 60.0,
        channels.len(),
        config.models.whisper.display(),
        config.asr.beam_size,
        config.asr.min_window_ms,
        config.asr.workers
    );
    println!("engine                                     wall s  CPU s  windows  words");
    if let Some(dir) = text {
        std::fs::create_dir_all(dir)?;
        for (c, r) in references.iter().flatten().enumerate() {
            std::fs::write(dir.join(format!("reference-{c}.txt")), r.trim_end())?;
        }
    }
    let pool = callstream::speech::start_pool(config, None)?;
    let mut ours = Vec::new();
    for (name, file, packing) in [
        (
            "callstream, packed windows",
            "packed",
            config.transcribe.packing(),
        ),
        (
            "callstream, one window per utterance",
            "utterance",
            Packing::OFF,
        ),
    ] {
        let before = pool.snapshot().batches;
        let (cpu, started) = (cpu_seconds(), Instant::now());
        let segments = transcribe_channels(
            &pool,
            &channels,
            language,
            config.vad.config(),
            packing,
            &mut |_, _| {},
        )?;
        let (wall, cpu) = (started.elapsed().as_secs_f64(), cpu_seconds() - cpu);
        // Channel after channel, as faster-whisper's words come.
        let mut segments = segments;
        segments.sort_by(|a, b| a.channel.cmp(&b.channel).then(a.start.total_cmp(&b.start)));
        let words = word_list(segments.iter().map(|s| s.text.as_str()));
        if let Some(dir) = text {
            for c in 0..channels.len() {
                let lines: String = segments
                    .iter()
                    .filter(|s| s.channel == c)
                    .map(|s| format!("{:9.2} {}\n", s.start, s.text.trim()))
                    .collect();
                std::fs::write(dir.join(format!("{file}-{c}.txt")), lines)?;
            }
        }
        println!(
            "{name:<41}  {wall:>6.1}  {cpu:>5.1}  {:>7}  {:>5}",
            pool.snapshot().batches - before,
            words.len()
        );
        let by_channel: Vec<Vec<String>> = (0..channels.len())
            .map(|c| {
                word_list(
                    segments
                        .iter()
                        .filter(|s| s.channel == c)
                        .map(|s| s.text.as_str()),
                )
            })
            .collect();
        ours.push((name, words, by_channel));
    }
    if faster_whisper {
        let dir = std::env::temp_dir().join(format!("callstream-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let wav = dir.join("call.wav");
        write_wav(&wav, &channels)?;
        let pythonpath = std::env::var("CALLSTREAM_BENCH_PYTHONPATH").unwrap_or_else(|_| {
            format!(
                "{}/.cache/callstream/fw",
                std::env::var("HOME").unwrap_or_default()
            )
        });
        let output = std::process::Command::new("python3")
            .arg("scripts/bench/fw_compare.py")
            .arg(&config.models.whisper)
            .arg(&wav)
            .arg(config.asr.beam_size.to_string())
            .arg(language)
            .env("PYTHONPATH", pythonpath)
            .output()
            .context("cannot run python3")?;
        let _ = std::fs::remove_dir_all(&dir);
        anyhow::ensure!(
            output.status.success(),
            "faster-whisper failed (scripts/setup.sh --bench installs it): {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&output.stdout)?;
        let fw_words: Vec<String> = word_list(
            report["channels"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|c| c.as_array().into_iter().flatten())
                .filter_map(|w| w.as_str()),
        );
        println!(
            "{:<41}  {:>6.1}  {:>5.1}  {:>7}  {:>5}",
            "faster-whisper, 1 thread, its VAD",
            report["wall_s"].as_f64().unwrap_or(f64::NAN),
            report["cpu_s"].as_f64().unwrap_or(f64::NAN),
            "-",
            fw_words.len()
        );
        let fw_by_channel: Vec<Vec<String>> = report["channels"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                word_list(
                    c.as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|w| w.as_str()),
                )
            })
            .collect();
        score("faster-whisper", &fw_by_channel);
        let reference = fw_words.join(" ");
        for (name, words, _) in &ours {
            let count = wer(&reference, &words.join(" "));
            println!(
                "{name}: {:.1}% word difference from faster-whisper's transcript",
                100.0 * count.rate()
            );
        }
    }
    for (name, _, by_channel) in &ours {
        score(name, by_channel);
    }
    Ok(())
}

/// Percentile of sorted samples.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

/// Sends `requests` POSTs with `concurrency` in flight; returns sorted latencies (ms) and
/// the wall time (s).
async fn load(
    client: &reqwest::Client,
    url: &str,
    key: Option<&str>,
    body: &serde_json::Value,
    requests: usize,
    concurrency: usize,
) -> anyhow::Result<(Vec<f64>, f64)> {
    use futures_util::StreamExt;
    let started = Instant::now();
    let results: Vec<anyhow::Result<f64>> = futures_util::stream::iter(0..requests)
        .map(|_| async {
            let t = Instant::now();
            let mut req = client.post(url).json(body);
            if let Some(k) = key {
                req = req.header("X-API-Key", k);
            }
            let resp = req.send().await?;
            anyhow::ensure!(resp.status().is_success(), "status {}", resp.status());
            resp.bytes().await?;
            Ok(t.elapsed().as_secs_f64() * 1000.0)
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let wall = started.elapsed().as_secs_f64();
    let mut lat = results.into_iter().collect::<anyhow::Result<Vec<f64>>>()?;
    lat.sort_by(f64::total_cmp);
    Ok((lat, wall))
}

/// `bench gateway`: added latency of the chat gateway on the upstream path, against a local
/// stand-in for the provider that answers at once.
/// Prepares a bench's store: sled with a key generated into the bench's temporary data
/// directory, or the configured PostgreSQL (a scratch database: the bench writes its own
/// organisation there) with the configured key, or a random one.
fn bench_store(config: &mut Config) -> callstream::config::StorageBackend {
    let backend = config.storage.backend;
    if backend == callstream::config::StorageBackend::Sled {
        config.storage.secret_key = String::new();
    } else if config.storage.secret_key.is_empty() {
        use base64::Engine as _;
        config.storage.secret_key =
            base64::engine::general_purpose::STANDARD.encode(rand::random::<[u8; 32]>());
    }
    backend
}

pub fn gateway(
    config: &Config,
    requests: usize,
    concurrency: usize,
    token_quota: Option<u64>,
) -> anyhow::Result<()> {
    use warp::Filter;
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let sse: &'static str = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"},\"finish_reason\":null}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" there.\"},\"finish_reason\":\"stop\"}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":20,\"completion_tokens\":2,\"total_tokens\":22}}\n\n",
            "data: [DONE]\n\n"
        );
        let upstream = warp::path!("v1" / "chat" / "completions")
            .and(warp::post())
            .and(warp::body::bytes())
            .map(move |_| warp::http::Response::builder().header("content-type", "text/event-stream").body(sse).expect("static response"));
        let (up_addr, up_server) = warp::serve(upstream).bind_ephemeral(([127, 0, 0, 1], 0));
        tokio::spawn(up_server);

        let dir = tempfile_dir()?;
        let mut config = config.clone();
        config.storage.data_dir = dir.clone();
        let backend = bench_store(&mut config);
        config.llm.provider = callstream::config::LlmProviderKind::Upstream;
        config.llm.upstream.base_url = format!("http://{up_addr}/v1");
        config.llm.upstream.model = "bench".into();
        config.llm.upstream.api_key = "bench".into();
        config.plans.insert(
            "bench".into(),
            callstream::config::Plan { rpm: u32::MAX, chat_tokens_per_month: token_quota, audio_minutes_per_month: None },
        );
        let app = callstream::app::App::open(config).await?;
        let callstream::admin::AdminResponse::Org(org) = app.admin.execute(callstream::admin::AdminRequest::OrgCreate { name: "bench".into(), plan: Some("bench".into()) }).await? else {
            anyhow::bail!("org create answered something else")
        };
        let callstream::admin::AdminResponse::KeyCreated { secret, .. } = app.admin.execute(callstream::admin::AdminRequest::KeyCreate { org: org.id, name: None }).await? else {
            anyhow::bail!("key create answered something else")
        };
        let server = callstream::server::start(app, "127.0.0.1:0".parse()?).await?;
        let client = reqwest::Client::new();
        let body = serde_json::json!({"messages": [{"role": "user", "content": "hi"}], "return_markdown": true});
        let direct_url = format!("http://{up_addr}/v1/chat/completions");
        let gateway_url = format!("http://{}/api/llm/chat/completions", server.addr);
        // Warm both paths.
        load(&client, &direct_url, None, &body, 50, concurrency).await?;
        load(&client, &gateway_url, Some(&secret), &body, 50, concurrency).await?;
        let (direct, direct_wall) = load(&client, &direct_url, None, &body, requests, concurrency).await?;
        let (through, through_wall) = load(&client, &gateway_url, Some(&secret), &body, requests, concurrency).await?;
        let quota = token_quota.map_or("unlimited".to_owned(), |q| format!("{q} tokens a month"));
        println!("{requests} requests, {concurrency} in flight, loopback, store {backend:?}, quota {quota}");
        println!("path       p50 ms  p99 ms  requests/s");
        println!("direct    {:>7.2} {:>7.2} {:>11.0}", percentile(&direct, 0.5), percentile(&direct, 0.99), requests as f64 / direct_wall);
        println!("gateway   {:>7.2} {:>7.2} {:>11.0}", percentile(&through, 0.5), percentile(&through, 0.99), requests as f64 / through_wall);
        println!(
            "added     {:>7.2} {:>7.2}   (key check, rate limit, quota, durable ledger write, SSE parse)",
            percentile(&through, 0.5) - percentile(&direct, 0.5),
            percentile(&through, 0.99) - percentile(&direct, 0.99)
        );
        server.stop().await;
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    })
}

fn tempfile_dir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("callstream-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// `bench llm`: time to first delta and tokens per second of the configured provider.
pub fn llm(config: &Config, runs: usize, context: usize) -> anyhow::Result<Table> {
    use callstream::llm::{Generation, Message, Role, Sampling};
    let runtime = tokio::runtime::Runtime::new()?;
    let provider = callstream::llm::build_provider(config)?;
    let mut table = Table::new(
        format!(
            "{}: {runs} runs, 128 new tokens each, about {context} tokens of context",
            provider.name()
        ),
        &["run", "prompt tok", "TTFD ms", "prompt tok/s", "gen tok/s"],
    );
    runtime.block_on(async {
        for run in 0..runs {
            let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(256);
            let generation = Generation {
                messages: vec![
                    Message::new(
                        Role::System,
                        "You are a helpful assistant for a contact center.",
                    ),
                    Message::new(
                        Role::User,
                        // Each run's own opening, so that nothing is reused from the last run;
                        // a line of call transcript is about 16 tokens.
                        format!(
                            "Run {run}. Earlier in the call:\n{}Explain in detail how a customer \
                             can track an order, step by step.",
                            "Customer: I ordered a desk last week and it has not arrived yet.\n"
                                .repeat(context / 16)
                        ),
                    ),
                ],
                tools: Vec::new(),
                sampling: Sampling {
                    max_tokens: 128,
                    temperature: 0.0,
                    ..Sampling::default()
                },
                json_schema: None,
                response_format: None,
                odds: None,
            };
            let started = Instant::now();
            let first = tokio::spawn(async move {
                let mut first = None;
                while rx.recv().await.is_some() {
                    first.get_or_insert_with(Instant::now);
                }
                first
            });
            let completion = provider.generate(generation, Some(tx)).await?;
            let done = Instant::now();
            let first = first.await?.unwrap_or(done);
            let ttfd = first.duration_since(started).as_secs_f64();
            let gen_secs = done.duration_since(first).as_secs_f64().max(1e-9);
            table.row(vec![
                run.to_string(),
                completion.usage.prompt_tokens.to_string(),
                format!("{:.0}", ttfd * 1000.0),
                format!("{:.1}", completion.usage.prompt_tokens as f64 / ttfd),
                format!(
                    "{:.1}",
                    completion.usage.completion_tokens.saturating_sub(1) as f64 / gen_secs
                ),
            ]);
        }
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(table)
}

/// A bench's results: printed as they come, and on request appended to a Markdown file with
/// what produced them.
pub struct Table {
    title: String,
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// Prints `title` and the column names.
    fn new(title: String, header: &[&str]) -> Self {
        println!("{title}");
        println!("{}", header.join("  "));
        Self {
            title,
            header: header.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    /// Prints a row, each cell under its column.
    fn row(&mut self, cells: Vec<String>) {
        let line: Vec<String> = cells
            .iter()
            .zip(&self.header)
            .map(|(cell, head)| format!("{cell:>width$}", width = head.len()))
            .collect();
        println!("{}", line.join("  "));
        self.rows.push(cells);
    }

    /// Appends the table to `path` under a heading with the command line, the date and the
    /// CPU; nothing without a path.
    fn record(self, path: Option<&std::path::Path>) -> anyhow::Result<()> {
        let Some(path) = path else {
            return Ok(());
        };
        let command: Vec<String> = std::env::args().skip(1).collect();
        let mut text = format!(
            "\n### `callstream {}`\n\n{} ({}; {}).\n\n| {} |\n|{}\n",
            command.join(" "),
            self.title,
            callstream::clock::rfc3339(callstream::clock::now_ms()),
            cpu_description(),
            self.header.join(" | "),
            "---|".repeat(self.header.len()),
        );
        for row in &self.rows {
            text.push_str(&format!("| {} |\n", row.join(" | ")));
        }
        use std::io::Write as _;
        std::fs::OpenOptions::new()
            .append(true)
            .open(path)
            .with_context(|| format!("cannot append to {}", path.display()))?
            .write_all(text.as_bytes())?;
        println!("appended to {}", path.display());
        Ok(())
    }
}

/// The CPU's model name, its core count and its widest vector and matrix instructions.
fn cpu_description() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        info.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_owned())
    };
    let flags = field("flags").unwrap_or_default();
    let has = |f: &str| flags.split_whitespace().any(|x| x == f);
    let isa: Vec<&str> = [
        ("avx2", "AVX2"),
        ("avx512f", "AVX-512"),
        ("avx512_vnni", "VNNI"),
        ("amx_bf16", "AMX"),
    ]
    .into_iter()
    .filter(|(flag, _)| has(flag))
    .map(|(_, name)| name)
    .collect();
    format!(
        "{}, {} cores, {}",
        field("model name").unwrap_or_else(|| "unknown CPU".into()),
        std::thread::available_parallelism().map_or(0, usize::from),
        isa.join(" ")
    )
}

/// CPU time of this process so far (user + system), in seconds.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    (ticks(11) + ticks(12)) / 100.0
}

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
pub fn calls(
    config: &Config,
    levels: &[usize],
    audio: &std::path::Path,
    target: f64,
    lockstep: bool,
    instances: usize,
) -> anyhow::Result<()> {
    use callstream::callclient::{load_audio, run_call, CallOptions};
    use std::sync::atomic::Ordering::Relaxed;
    anyhow::ensure!(
        instances == 1 || config.storage.backend == callstream::config::StorageBackend::Postgres,
        "--instances above 1 needs storage.backend = \"postgres\" (sled is one process's)"
    );
    let channels = load_audio(audio).map_err(anyhow::Error::msg)?;
    let audio_secs = channels[0].len() as f64 / 8000.0;
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
            callstream::config::Plan { rpm: u32::MAX, chat_tokens_per_month: None, audio_minutes_per_month: None },
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
        println!("calls  transcripts  p50 s  p95 s  max s  CPU cores  held  dropped");
        let mut best = None;
        for &n in levels {
            let (held0, dropped0) = (held(), dropped());
            let cpu0 = cpu_seconds();
            let started = Instant::now();
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
            for t in tasks {
                let outcome = t.await??;
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
            let wall = started.elapsed().as_secs_f64();
            let cores = (cpu_seconds() - cpu0) / wall;
            latencies.sort_by(f64::total_cmp);
            let (p50, p95) = (percentile(&latencies, 0.5), percentile(&latencies, 0.95));
            let max = latencies.last().copied().unwrap_or(0.0);
            println!(
                "{n:>5}  {:>11}  {p50:>5.2}  {p95:>5.2}  {max:>5.2}  {cores:>9.2}  {:>4}  {:>7}",
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
