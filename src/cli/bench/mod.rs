//! `callstream bench ...`: performance measurements that need the real engines. One file per
//! benchmark (`asr`, `files`, `gateway`, `llm`, `calls`, `fairness`, `history`); here the command, its dispatch, and
//! what they share: the load driver, percentiles, the result table and CPU readings.

mod asr;
mod calls;
mod fairness;
mod files;
mod gateway;
mod history;
mod llm;

use self::asr::asr;
use self::calls::calls;
use self::fairness::fairness;
use self::files::files;
use self::gateway::gateway;
use self::history::history;
use self::llm::llm;

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
        /// A recording (any format `POST /api/transcribe` takes) transcribed on the first
        /// instance's speech workers at the start of each round, as an upload beside the calls
        /// would be (no analyses): its wall time is reported, and the calls' latency beside it.
        #[arg(long)]
        with_file: Option<PathBuf>,
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
        /// Rounds of this many generations at once (comma-separated, `1,2,4`), each from an
        /// organisation of its own: aggregate tokens per second and time to first delta. Unset:
        /// one generation at a time.
        #[arg(long, value_delimiter = ',')]
        concurrency: Vec<usize>,
        /// Also append the table to this Markdown file (docs/benchmarks.md), headed by the
        /// command, the date and the CPU.
        #[arg(long)]
        record: Option<PathBuf>,
    },
    /// How long one organisation waits for the language model while another keeps it busy: a
    /// one-word chat beside a long generation, and a live call's intent beside a file's
    /// analyses.
    Fairness {
        /// The labelled set whose written dialogues make the transcripts.
        #[arg(long, default_value = "fixtures/analysis")]
        set: PathBuf,
        /// Seconds between the busy organisation's request and the other's (and between the
        /// live call's asks).
        #[arg(long, default_value_t = 3.0)]
        delay: f64,
        /// The live call's transcript is not read ahead before it asks (a call past
        /// `calls.ready_before_analyze`): its first ask reads all of it.
        #[arg(long)]
        cold: bool,
    },
    /// Search over the call history at size: fills the configured store (sled in a temporary
    /// directory, or the configured PostgreSQL: use a scratch database) with calls whose lines
    /// are turns of the labelled set's dialogues, then times `GET /api/calls` with one word,
    /// two words, no words and an intent filter.
    History {
        /// Calls to store.
        #[arg(long, default_value_t = 10_000)]
        calls: usize,
        /// Transcript lines per call (40 is a call of about four minutes).
        #[arg(long, default_value_t = 40)]
        lines: usize,
        /// Searches of each kind to time.
        #[arg(long, default_value_t = 300)]
        searches: usize,
        /// The labelled set whose dialogues make the lines.
        #[arg(long, default_value = "fixtures/analysis")]
        set: PathBuf,
        /// Also append the table to this Markdown file (docs/benchmarks.md), headed by the
        /// command, the date and the CPU.
        #[arg(long)]
        record: Option<PathBuf>,
    },
    /// How the evidence check sorts the labelled sales calls' buyer sentences by topic (each
    /// sentence against the topics its turn states), optionally with another wording of the
    /// check's instructions or worked examples.
    Topics {
        /// The labelled set.
        #[arg(long, default_value = "fixtures/analysis")]
        set: PathBuf,
        /// Sort the recordings' transcripts kept in this directory by `bench analysis
        /// --transcripts` instead of the written dialogues.
        #[arg(long)]
        transcripts: Option<PathBuf>,
        /// Only the calls whose id starts with one of these, comma-separated.
        #[arg(long, value_delimiter = ',')]
        calls: Vec<String>,
        /// The check's instructions from this file instead of the built-in ones (check.md).
        #[arg(long)]
        instructions: Option<PathBuf>,
        /// The check's worked examples from this file instead of the built-in ones
        /// (check.examples.json).
        #[arg(long)]
        examples: Option<PathBuf>,
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
            concurrency,
            record,
        } => llm(config, runs, context, &concurrency)?.record(record.as_deref()),
        BenchCommand::Fairness { set, delay, cold } => fairness(config, &set, delay, cold),
        BenchCommand::History {
            calls,
            lines,
            searches,
            set,
            record,
        } => history(config, calls, lines, searches, &set, record.as_deref()),
        BenchCommand::Topics {
            set,
            transcripts,
            calls,
            instructions,
            examples,
        } => super::bench_topics::bench(
            config,
            &super::bench_topics::Options {
                set,
                transcripts,
                calls,
                instructions,
                examples,
            },
        ),
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
            with_file,
        } => calls(
            config,
            &concurrency,
            &audio,
            target,
            lockstep,
            instances,
            with_file.as_deref(),
        ),
    }
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

fn tempfile_dir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("callstream-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
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
