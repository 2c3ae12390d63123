//! Typed configuration: the shipped `config.toml` (embedded in the binary), an optional file laid
//! over it, then `CALLSTREAM_*` environment variables laid over both.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

mod plans;
pub use plans::{LimitsConfig, Plan};

/// The shipped defaults; a new user runs with exactly these.
pub const DEFAULT_CONFIG: &str = include_str!("../config.toml");

/// Prefix of environment variables that override configuration values.
pub const ENV_PREFIX: &str = "CALLSTREAM_";

/// Environment variables with the prefix that are not configuration paths.
const ENV_NOT_PATHS: &[&str] = &["CALLSTREAM_CONFIG"];

/// Path of the live-call endpoint; the same for every organisation.
pub const CALLSTREAM_WS_PATH: &str = "/api/callstream/ws";

/// The whole configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Listener and public address.
    pub server: ServerConfig,
    /// Data directory and encryption key.
    pub storage: StorageConfig,
    /// Model files.
    pub models: ModelsConfig,
    /// Language model.
    pub llm: LlmConfig,
    /// Speech-recognition workers.
    pub asr: AsrConfig,
    /// File transcription.
    pub transcribe: TranscribeConfig,
    /// Utterance segmentation.
    pub vad: VadSettings,
    /// Live calls over AudioHook.
    pub calls: CallsConfig,
    /// Realtime chat sessions.
    pub realtime: RealtimeConfig,
    /// The web dashboard.
    pub dashboard: DashboardConfig,
    /// Service-wide limits.
    pub limits: LimitsConfig,
    /// Plans by name.
    pub plans: BTreeMap<String, Plan>,
}

/// `[server]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Address the server binds.
    pub listen: SocketAddr,
    /// The service's address as clients see it, `http(s)://host[:port]`.
    pub public_url: String,
    /// Open client connections; past this, new ones are answered 503 and closed.
    pub max_connections: usize,
    /// A client must send a request's headers within this long (also how long an idle
    /// keep-alive connection is kept).
    pub header_read_timeout_ms: u64,
    /// Open connections from one client address; past this, new ones from it are answered
    /// 503 and closed. Trusted proxies are not counted this way.
    pub max_connections_per_address: usize,
    /// Reverse proxies (addresses or CIDR blocks) whose `X-Forwarded-For` names the client.
    pub trusted_proxies: Vec<String>,
    /// A request body gets this long before its pace is judged.
    pub body_grace_ms: u64,
    /// After the grace, a body must arrive at this many bytes per second on average.
    pub min_body_bytes_per_s: u64,
    /// The longest a request body may take to arrive, whatever its pace.
    pub body_timeout_ms: u64,
    /// `GET /metrics` wants `Authorization: Bearer` this; empty: only loopback clients get
    /// it, and without per-organisation figures.
    pub metrics_token: String,
    /// How long a graceful stop waits for work in progress to finish and be billed.
    pub shutdown_timeout_ms: u64,
    /// On SIGTERM, how long live calls in progress may run on (new calls and sessions are
    /// refused, `/readyz` answers 503) before the graceful stop; 0 stops at once.
    pub drain_timeout_ms: u64,
    /// The authority (`host[:port]`) live-call signatures may also be made over, besides the
    /// request's `Host`: what clients connect to when a proxy rewrites `Host`. Empty: the host
    /// of `public_url`.
    pub public_authority: String,
}

/// `[realtime]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RealtimeConfig {
    /// Largest client frame, in bytes.
    pub max_frame_bytes: usize,
    /// Sessions open at once per API key.
    pub max_sessions_per_key: usize,
    /// A session with no client frame and no turn in progress for this long is closed.
    pub idle_timeout_ms: u64,
    /// A client that reads nothing of what it is sent for this long has gone.
    pub write_timeout_ms: u64,
}

/// `[dashboard]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DashboardConfig {
    /// Sign-in attempts per minute from one address.
    pub sign_in_per_minute_per_address: u32,
    /// Sign-in attempts per minute for one account (email) from one client address.
    pub sign_in_per_minute_per_account: u32,
    /// Sign-in pages served per minute to one client address.
    pub login_page_per_minute_per_address: u32,
    /// Live event feeds (`/dashboard/live/events`) open at once per dashboard session.
    pub max_feeds_per_session: usize,
    /// Password hashes computed at once (each takes about 19 MiB and a core for a moment).
    pub password_workers: usize,
    /// Sign-ins waiting for a password worker; past this they are refused with 503.
    pub password_queue: usize,
}

/// `[storage]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageConfig {
    /// Which database holds the service's state.
    pub backend: StorageBackend,
    /// Directory of the sled database, the generated key and the admin socket.
    pub data_dir: PathBuf,
    /// Base64 of the 32-byte key that encrypts connector secrets; empty to use a generated one
    /// (sled only: instances sharing PostgreSQL must share the key).
    pub secret_key: String,
    /// PostgreSQL connection URL (`postgres://user:password@host:port/db`) or key=value string.
    pub postgres_url: String,
    /// Connections each instance keeps to PostgreSQL at most.
    pub postgres_pool: usize,
    /// Seconds between two passes of the call-history purge (records past their retention).
    #[serde(default = "default_history_purge_every_s")]
    pub history_purge_every_s: u64,
}

fn default_history_purge_every_s() -> u64 {
    3600
}

impl StorageConfig {
    /// Where the data is, for people: the sled data directory, or PostgreSQL's host, port and
    /// database (never its user or password).
    pub fn location(&self) -> String {
        match self.backend {
            StorageBackend::Sled => format!("sled in {}", self.data_dir.display()),
            StorageBackend::Postgres => {
                format!("postgres at {}", postgres_place(&self.postgres_url))
            }
        }
    }
}

/// `host:port/database` of a PostgreSQL URL (`postgres://user:password@host:port/db?...`) or
/// key=value string, without the credentials.
fn postgres_place(url: &str) -> String {
    let url = url.trim();
    if let Some(rest) = url
        .strip_prefix("postgres://")
        .or_else(|| url.strip_prefix("postgresql://"))
    {
        let rest = rest.rsplit_once('@').map_or(rest, |(_, place)| place);
        return rest.split('?').next().unwrap_or(rest).to_owned();
    }
    let (mut host, mut port, mut db) = ("localhost", "5432", "");
    for (key, value) in url.split_whitespace().filter_map(|p| p.split_once('=')) {
        match key {
            "host" | "hostaddr" => host = value,
            "port" => port = value,
            "dbname" => db = value,
            _ => {}
        }
    }
    format!("{host}:{port}/{db}")
}

/// `storage.backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StorageBackend {
    /// sled, embedded in this process: one instance per data directory.
    Sled,
    /// PostgreSQL, shared by every instance that points at it.
    Postgres,
}

/// `[models]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelsConfig {
    /// CTranslate2 Whisper model directory.
    pub whisper: PathBuf,
    /// GGUF file of the embedded LLM.
    pub llm: PathBuf,
}

/// Which language model serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LlmProviderKind {
    /// llama.cpp in this process.
    Embedded,
    /// An OpenAI-compatible API.
    Upstream,
}

/// `[llm]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlmConfig {
    /// Which model serves.
    pub provider: LlmProviderKind,
    /// CPU threads of the embedded model.
    pub threads: u32,
    /// Context window of the embedded model.
    pub context_tokens: u32,
    /// llama.cpp's flash attention in the embedded model.
    #[serde(default)]
    pub flash_attention: bool,
    /// Prompt tokens the embedded model evaluates in one pass (llama.cpp's `n_ubatch`).
    #[serde(default = "default_micro_batch")]
    pub micro_batch: u32,
    /// How the embedded model stores the attention keys of evaluated tokens; absent, q8_0.
    #[serde(default)]
    pub key_cache: Option<KeyCache>,
    /// Whether llama.cpp lays the weights out again for its CPU kernels at load.
    #[serde(default = "default_repack_weights")]
    pub repack_weights: bool,
    /// Most tokens the embedded model drafts ahead of a structured answer; absent, chosen by
    /// the CPU (8 with AMX, else 0).
    #[serde(default)]
    pub draft_tokens: Option<u32>,
    /// Whether the text a schema leaves no choice about in the middle of a structured answer
    /// (the rest of a label, the next property's name) is added after the token before it and
    /// evaluated with it, not written a token at a time.
    #[serde(default = "default_force_schema_text")]
    pub force_schema_text: bool,
    /// Chat requests that may wait for the model, from every organisation.
    pub queue: usize,
    /// Chat requests that one organisation may have waiting for the model.
    #[serde(default = "default_queue_per_org")]
    pub queue_per_org: usize,
    /// Requests the model serves at once (besides one place kept for live analyses): the
    /// embedded model's sequences, an upstream server's concurrent calls.
    #[serde(default = "default_parallel")]
    pub parallel: usize,
    /// Memory of the embedded model's attention cache, shared by its sequences, MiB.
    #[serde(default = "default_kv_cache_mb")]
    pub kv_cache_mb: usize,
    /// Evaluated prompts the embedded model keeps for reuse, besides the one in its context.
    pub prefix_cache_entries: usize,
    /// Memory those kept prompts may take, MiB.
    pub prefix_cache_mb: usize,
    /// Most model calls per chat turn with tools.
    pub max_tool_iterations: usize,
    /// Timeout of each MCP step, in milliseconds.
    pub mcp_timeout_ms: u64,
    /// Non-public addresses (CIDR) and host names an MCP server may have anyway.
    pub mcp_allow: Vec<String>,
    /// Ports an MCP server on a public address may have besides 80 and 443.
    pub mcp_ports: Vec<u16>,
    /// The upstream API.
    pub upstream: UpstreamSettings,
}

fn default_micro_batch() -> u32 {
    128
}

fn default_queue_per_org() -> usize {
    4
}

fn default_parallel() -> usize {
    4
}

fn default_kv_cache_mb() -> usize {
    768
}

fn default_force_schema_text() -> bool {
    true
}

fn default_repack_weights() -> bool {
    true
}

/// `llm.key_cache`: the type of the attention keys the embedded model keeps per token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum KeyCache {
    /// 16-bit floats, llama.cpp's default.
    #[serde(rename = "f16")]
    F16,
    /// 8-bit integers with a scale per 32 values (llama.cpp's `q8_0`).
    #[serde(rename = "q8_0")]
    Q8_0,
}

/// `[llm.upstream]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamSettings {
    /// Base URL.
    pub base_url: String,
    /// Bearer token.
    pub api_key: String,
    /// Model name.
    pub model: String,
    /// Response timeout, milliseconds.
    pub timeout_ms: u64,
    /// Connect timeout, milliseconds.
    pub connect_timeout_ms: u64,
    /// A JSON object whose fields are added to every request body (a field the service
    /// also sets is replaced); empty for none.
    #[serde(default)]
    pub extra_body: String,
}

impl UpstreamSettings {
    /// [`UpstreamSettings::extra_body`] as an object (empty when unset).
    pub fn extra_body(&self) -> Result<serde_json::Map<String, serde_json::Value>, String> {
        if self.extra_body.trim().is_empty() {
            return Ok(serde_json::Map::new());
        }
        match serde_json::from_str(&self.extra_body) {
            Ok(serde_json::Value::Object(fields)) => Ok(fields),
            _ => {
                Err("llm.upstream.extra_body must be a JSON object, such as {\"top_k\": 20}".into())
            }
        }
    }
}

/// `[asr]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AsrConfig {
    /// Worker threads, one engine each.
    pub workers: usize,
    /// Beam width.
    pub beam_size: usize,
    /// Shortest encoder window, milliseconds (an utterance is padded to max(this, itself)).
    pub min_window_ms: u64,
    /// Most file utterances per engine call.
    pub max_batch: usize,
    /// Most live utterances (of any calls) per engine call.
    pub live_batch: usize,
    /// Capacity of the live queue.
    pub live_queue: usize,
    /// Capacity of the file queue.
    pub file_queue: usize,
}

impl AsrConfig {
    /// The pool settings.
    pub fn pool(&self) -> callstream_actors::asr::pool::PoolConfig {
        callstream_actors::asr::pool::PoolConfig {
            workers: self.workers,
            max_batch: self.max_batch,
            live_batch: self.live_batch,
            live_queue: self.live_queue,
            file_queue: self.file_queue,
        }
    }
}

/// `[transcribe]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TranscribeConfig {
    /// Largest upload in MiB.
    pub max_upload_mb: u64,
    /// Longest recording accepted, in seconds.
    pub max_duration_s: f64,
    /// Speaker role of each channel, in channel order.
    pub channel_roles: Vec<String>,
    /// Longest encoder window a channel's utterances are packed into, ms; 0: no packing.
    pub pack_window_ms: u64,
    /// Silence between packed utterances, ms.
    pub pack_gap_ms: u64,
}

impl TranscribeConfig {
    /// How utterances are packed into encoder windows.
    pub fn packing(&self) -> callstream_actors::asr::file::Packing {
        callstream_actors::asr::file::Packing {
            window_secs: self.pack_window_ms as f64 / 1000.0,
            gap_secs: self.pack_gap_ms as f64 / 1000.0,
        }
    }

    /// Largest upload in bytes.
    pub fn max_upload_bytes(&self) -> u64 {
        self.max_upload_mb.saturating_mul(1 << 20)
    }

    /// The role of channel `c`.
    pub fn role(&self, c: usize) -> String {
        self.channel_roles
            .get(c)
            .cloned()
            .unwrap_or_else(|| format!("channel {c}"))
    }
}

/// `[vad]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VadSettings {
    /// Non-speech that ends an utterance.
    pub trailing_silence_ms: u32,
    /// Speech needed for an utterance to count.
    pub min_speech_ms: u32,
    /// Longest utterance.
    pub max_utterance_ms: u32,
}

impl VadSettings {
    /// The segmenter settings.
    pub fn config(&self) -> callstream_actors::audio::vad::VadConfig {
        callstream_actors::audio::vad::VadConfig {
            trailing_silence_ms: self.trailing_silence_ms,
            min_speech_ms: self.min_speech_ms,
            max_utterance_ms: self.max_utterance_ms,
            ..Default::default()
        }
    }
}

/// `[calls]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallsConfig {
    /// Audio leased from the pool at a time (ms of audio): the quota check of a call.
    pub quota_check_ms: u64,
    /// Interval of the running-total usage writes.
    pub billing_flush_ms: u64,
    /// How often calls in progress check their connector and organisation.
    pub revocation_check_ms: u64,
    /// How long the server waits for the client's `close` after sending `disconnect`.
    pub disconnect_grace_ms: u64,
    /// A call whose client sends nothing for this long ends (close 1000, reason `idle timeout`).
    pub idle_timeout_ms: u64,
    /// Utterances a channel holds while the speech workers' live queue is full.
    pub max_held_utterances: usize,
    /// The least time between the starts of two intent analyses of one call (`analyze`
    /// requests in between are coalesced into the next).
    pub analyze_interval_ms: u64,
    /// Live intent analyses waiting for or using the language model at once, across calls;
    /// more wait their turn (coalescing their requests) rather than fill the model's queue.
    pub max_live_analyses: usize,
    /// Calls of this instance whose transcript the language model reads ahead, line by line,
    /// before they have asked for their intent (after chats, before files' prompts), so that a first
    /// `analyze` finds it read; a call that has asked is always read ahead (as live work).
    pub ready_before_analyze: usize,
    /// Frames read from a call's socket and not yet taken by its transcribers.
    pub inbound_frames: usize,
    /// Messages queued for a call's socket.
    pub outbound_messages: usize,
    /// Largest binary frame, in bytes.
    pub max_frame_bytes: usize,
    /// Language used when a call names one the speech model does not accept.
    pub default_language: String,
    /// Speaker labels of the `external` and `internal` legs in the transcript the intent
    /// analysis reads.
    pub external_label: String,
    /// See `external_label`.
    pub internal_label: String,
    /// Calls in progress at once per connector.
    pub max_calls_per_connector: usize,
    /// Calls in progress at once per organisation.
    pub max_calls_per_org: usize,
    /// Calls in progress at once on this instance, whoever owns them, at most (admission
    /// control).
    pub max_calls_per_instance: usize,
    /// Calls this instance takes at once until it has measured what a call costs its speech
    /// workers (admission control).
    pub admit_unmeasured_calls: usize,
    /// Once measured: the share of the speech workers' time the calls in progress may be
    /// expected to take (admission control).
    pub admit_max_load: f64,
    /// A new call is refused while a live utterance is expected to wait longer than this for
    /// a speech worker (admission control).
    pub admit_max_wait_ms: u64,
    /// A client that reads nothing of what it is sent for this long has gone: the call ends.
    pub write_timeout_ms: u64,
    /// A connection probe (nil conversation and participant) is closed after this long.
    pub probe_timeout_ms: u64,
}

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file or the merged result is not valid TOML for the schema.
    #[error("invalid configuration ({origin}): {message}")]
    Invalid {
        /// Which layer: the defaults, a file, or the environment.
        origin: String,
        /// What is wrong.
        message: String,
    },
}

impl Config {
    /// Loads the defaults, then `file` if given, then the process environment.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_with_env(file, std::env::vars())
    }

    /// As [`Config::load`], with the environment given explicitly.
    pub fn load_with_env(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let mut merged = parse_table(DEFAULT_CONFIG, "built-in defaults")?;
        if let Some(path) = file {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.to_owned(),
                source,
            })?;
            let layer = parse_table(&text, &path.display().to_string())?;
            merge(&mut merged, layer);
        }
        apply_env(&mut merged, env);
        let config: Config =
            toml::Value::Table(merged)
                .try_into()
                .map_err(|e: toml::de::Error| ConfigError::Invalid {
                    origin: "merged configuration".into(),
                    message: e.message().to_owned(),
                })?;
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |message: String| ConfigError::Invalid {
            origin: "merged configuration".into(),
            message,
        };
        if !self.plans.contains_key(&self.limits.default_plan) {
            return Err(invalid(format!(
                "limits.default_plan {:?} is not one of the plans",
                self.limits.default_plan
            )));
        }
        if self.llm.provider == LlmProviderKind::Upstream
            && (self.llm.upstream.base_url.is_empty() || self.llm.upstream.model.is_empty())
        {
            return Err(invalid(
                "llm.provider is \"upstream\": set llm.upstream.base_url and llm.upstream.model"
                    .into(),
            ));
        }
        self.llm.upstream.extra_body().map_err(invalid)?;
        if !(1..=1_000).contains(&self.storage.postgres_pool) {
            return Err(invalid(
                "storage.postgres_pool must be between 1 and 1000".into(),
            ));
        }
        if self.storage.backend == StorageBackend::Postgres
            && self.storage.postgres_url.trim().is_empty()
        {
            return Err(invalid(
                "storage.backend is \"postgres\": set storage.postgres_url".into(),
            ));
        }
        if !(1..=64).contains(&self.llm.parallel) || self.llm.queue_per_org == 0 {
            return Err(invalid(
                "llm.parallel must be from 1 to 64 and llm.queue_per_org at least 1".into(),
            ));
        }
        if !(1..=512).contains(&self.llm.micro_batch) {
            return Err(invalid("llm.micro_batch must be from 1 to 512".into()));
        }
        if self.llm.context_tokens < 512 || self.llm.threads == 0 {
            return Err(invalid(
                "llm.context_tokens must be at least 512 and llm.threads at least 1".into(),
            ));
        }
        if self.transcribe.pack_window_ms > 30_000 || self.transcribe.pack_gap_ms > 5_000 {
            return Err(invalid(
                "transcribe.pack_window_ms must be at most 30000 and pack_gap_ms at most 5000"
                    .into(),
            ));
        }
        if !(1_000..=30_000).contains(&self.asr.min_window_ms) {
            return Err(invalid(
                "asr.min_window_ms must be between 1000 and 30000".into(),
            ));
        }
        if self.asr.workers == 0
            || self.asr.beam_size == 0
            || self.asr.max_batch == 0
            || self.asr.live_batch == 0
        {
            return Err(invalid(
                "asr.workers, asr.beam_size, asr.max_batch and asr.live_batch must be at least 1"
                    .into(),
            ));
        }
        if !(1_000..=30_000).contains(&self.vad.max_utterance_ms) {
            return Err(invalid(
                "vad.max_utterance_ms must be between 1000 and 30000 (Whisper's window)".into(),
            ));
        }
        let c = &self.calls;
        if c.quota_check_ms < 100
            || c.billing_flush_ms < 100
            || c.revocation_check_ms < 100
            || c.idle_timeout_ms < 100
            || c.inbound_frames == 0
            || c.outbound_messages == 0
            || c.max_frame_bytes < 1024
        {
            return Err(invalid(
                "calls: quota_check_ms, billing_flush_ms, revocation_check_ms and idle_timeout_ms must be at least 100, \
                 inbound_frames and outbound_messages at least 1, max_frame_bytes at least 1024"
                    .into(),
            ));
        }
        let r = &self.realtime;
        if r.max_frame_bytes < 1024
            || r.max_sessions_per_key == 0
            || r.idle_timeout_ms < 1000
            || r.write_timeout_ms < 100
            || c.max_calls_per_connector == 0
            || c.max_calls_per_org == 0
            || c.max_calls_per_instance == 0
            || c.admit_unmeasured_calls == 0
            || !(c.admit_max_load > 0.0 && c.admit_max_load <= 1.0)
            || c.admit_max_wait_ms < 100
            || c.write_timeout_ms < 100
            || c.probe_timeout_ms < 100
            || self.server.max_connections == 0
            || self.server.max_connections_per_address == 0
            || self.server.header_read_timeout_ms < 100
            || self.server.body_grace_ms < 100
            || self.server.body_timeout_ms < 100
        {
            return Err(invalid(
                "limits must be positive: realtime.max_frame_bytes at least 1024, \
                 idle_timeout_ms at least 1000, timeouts at least 100 ms, caps at least 1"
                    .into(),
            ));
        }
        let d = &self.dashboard;
        if d.sign_in_per_minute_per_address == 0
            || d.sign_in_per_minute_per_account == 0
            || d.login_page_per_minute_per_address == 0
            || d.max_feeds_per_session == 0
            || d.password_workers == 0
        {
            return Err(invalid(
                "dashboard: sign-in rates, max_feeds_per_session and password_workers must be at least 1"
                    .into(),
            ));
        }
        crate::netaddr::Network::parse_all(&self.server.trusted_proxies)
            .map_err(|e| invalid(format!("server.trusted_proxies: {e}")))?;
        if !(self.transcribe.max_duration_s.is_finite() && self.transcribe.max_duration_s >= 1.0) {
            return Err(invalid(
                "transcribe.max_duration_s must be a number of seconds, at least 1".into(),
            ));
        }
        if let Some((name, _)) = self.plans.iter().find(|(_, p)| p.rpm == 0) {
            return Err(invalid(format!("plans.{name}.rpm must be at least 1")));
        }
        self.callstream_ws_url().map_err(invalid)?;
        Ok(())
    }

    /// The authority live-call signatures may be made over besides the request's `Host`:
    /// `server.public_authority`, or the host of `server.public_url` (an `https` URL's default
    /// port 443, or `http`'s 80, is left out, as clients leave it out of `@authority`).
    pub fn public_authority(&self) -> String {
        let configured = self.server.public_authority.trim();
        if !configured.is_empty() {
            return configured.to_ascii_lowercase();
        }
        let url = self.server.public_url.trim_end_matches('/');
        let (scheme, host) = url.split_once("://").unwrap_or(("https", url));
        let default_port = if scheme == "http" { ":80" } else { ":443" };
        host.strip_suffix(default_port)
            .unwrap_or(host)
            .to_ascii_lowercase()
    }

    /// The fixed AudioHook WebSocket URL shown for every connector.
    pub fn callstream_ws_url(&self) -> Result<String, String> {
        let url = self.server.public_url.trim_end_matches('/');
        let (scheme, rest) = url.split_once("://").ok_or_else(|| {
            format!("server.public_url {url:?} must start with http:// or https://")
        })?;
        let ws = match scheme {
            "https" => "wss",
            "http" => "ws",
            _ => return Err(format!("server.public_url {url:?} must be http or https")),
        };
        if rest.is_empty() || rest.contains('/') {
            return Err(format!(
                "server.public_url {url:?} must be a scheme and host only"
            ));
        }
        Ok(format!("{ws}://{rest}{CALLSTREAM_WS_PATH}"))
    }

    /// The plan named `name`.
    pub fn plan(&self, name: &str) -> Option<&Plan> {
        self.plans.get(name)
    }
}

fn parse_table(text: &str, origin: &str) -> Result<toml::Table, ConfigError> {
    text.parse::<toml::Table>()
        .map_err(|e| ConfigError::Invalid {
            origin: origin.to_owned(),
            message: e.message().to_owned(),
        })
}

/// Lays `over` onto `base`: tables merge key by key, anything else replaces.
fn merge(base: &mut toml::Table, over: toml::Table) {
    for (key, value) in over {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

/// Applies `CALLSTREAM_A__B=value` as `a.b = value`. Where the default at that path is a
/// string the value is taken as it is; elsewhere it is read as a TOML value (number, boolean,
/// array) and taken as a string when it is not one.
fn apply_env(table: &mut toml::Table, env: impl IntoIterator<Item = (String, String)>) {
    for (name, raw) in env {
        let Some(path) = name.strip_prefix(ENV_PREFIX) else {
            continue;
        };
        if ENV_NOT_PATHS.contains(&name.as_str()) || path.is_empty() {
            continue;
        }
        let keys: Vec<String> = path.split("__").map(str::to_lowercase).collect();
        let (last, parents) = keys.split_last().expect("split yields at least one item");
        let mut node = &mut *table;
        for key in parents {
            let entry = node
                .entry(key.clone())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            if !entry.is_table() {
                *entry = toml::Value::Table(toml::Table::new());
            }
            node = entry.as_table_mut().expect("made a table just above");
        }
        let value = match node.get(last) {
            Some(toml::Value::String(_)) => toml::Value::String(raw),
            _ => format!("v = {raw}")
                .parse::<toml::Table>()
                .ok()
                .and_then(|mut t| t.remove("v"))
                .unwrap_or(toml::Value::String(raw)),
        };
        node.insert(last.clone(), value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn shipped_defaults_load() {
        let config = Config::load_with_env(None, env(&[])).unwrap();
        assert_eq!(config.server.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(config.limits.default_plan, "free");
        assert_eq!(
            config.plan("free").unwrap().audio_minutes_per_month,
            Some(60)
        );
        assert_eq!(
            config.plan("enterprise").unwrap().chat_tokens_per_month,
            None
        );
        assert_eq!(
            config.callstream_ws_url().unwrap(),
            "wss://localhost:8080/api/callstream/ws"
        );
    }

    #[test]
    fn a_store_location_never_shows_credentials() {
        assert_eq!(
            postgres_place("postgres://app:s3cret@db.internal:5433/calls?sslmode=require"),
            "db.internal:5433/calls"
        );
        assert_eq!(
            postgres_place("host=/run/postgresql user=app password=s3cret dbname=calls"),
            "/run/postgresql:5432/calls"
        );
        assert_eq!(postgres_place("postgresql://db/calls"), "db/calls");
    }

    #[test]
    fn environment_overrides_by_path_and_type() {
        let config = Config::load_with_env(
            None,
            env(&[
                ("CALLSTREAM_SERVER__LISTEN", "0.0.0.0:9000"),
                ("CALLSTREAM_PLANS__FREE__RPM", "7"),
                ("CALLSTREAM_STORAGE__SECRET_KEY", "123"),
                ("CALLSTREAM_PLANS__GOLD__RPM", "9"),
                ("CALLSTREAM_CONFIG", "/not/a/path"),
                ("OTHER", "x"),
            ]),
        )
        .unwrap();
        assert_eq!(config.server.listen.to_string(), "0.0.0.0:9000");
        assert_eq!(config.plan("free").unwrap().rpm, 7);
        assert_eq!(config.storage.secret_key, "123");
        assert_eq!(config.plan("gold").unwrap().rpm, 9);
    }

    #[test]
    fn file_layers_over_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "[server]\npublic_url = \"http://calls.example.com\"\n[plans.free]\nrpm = 3\n",
        )
        .unwrap();
        let config = Config::load_with_env(Some(&path), env(&[])).unwrap();
        assert_eq!(
            config.callstream_ws_url().unwrap(),
            "ws://calls.example.com/api/callstream/ws"
        );
        let free = config.plan("free").unwrap();
        assert_eq!((free.rpm, free.chat_tokens_per_month), (3, Some(100_000)));
    }

    #[test]
    fn mistakes_are_reported() {
        let bad_key = Config::load_with_env(None, env(&[("CALLSTREAM_SERVER__LISEN", "x")]));
        assert!(bad_key.unwrap_err().to_string().contains("lisen"));
        let bad_plan =
            Config::load_with_env(None, env(&[("CALLSTREAM_LIMITS__DEFAULT_PLAN", "x")]));
        assert!(bad_plan.unwrap_err().to_string().contains("default_plan"));
        let bad_url =
            Config::load_with_env(None, env(&[("CALLSTREAM_SERVER__PUBLIC_URL", "ftp://a")]));
        assert!(bad_url.is_err());
        let missing = Config::load_with_env(Some(Path::new("/nonexistent.toml")), env(&[]));
        assert!(matches!(missing, Err(ConfigError::Read { .. })));
        for micro_batch in ["0", "513"] {
            let bad =
                Config::load_with_env(None, env(&[("CALLSTREAM_LLM__MICRO_BATCH", micro_batch)]));
            assert!(bad.unwrap_err().to_string().contains("micro_batch"));
        }
        let keys = |v: &str| Config::load_with_env(None, env(&[("CALLSTREAM_LLM__KEY_CACHE", v)]));
        assert_eq!(keys("f16").unwrap().llm.key_cache, Some(KeyCache::F16));
        assert_eq!(keys("q8_0").unwrap().llm.key_cache, Some(KeyCache::Q8_0));
        let default = Config::load_with_env(None, env(&[])).unwrap();
        assert_eq!(default.llm.key_cache, None, "chosen by the CPU");
        let wrong = keys("q4_0").unwrap_err().to_string();
        assert!(wrong.contains("q4_0") && wrong.contains("q8_0"), "{wrong}");
        let ok = Config::load_with_env(None, env(&[("CALLSTREAM_LLM__MICRO_BATCH", "512")]));
        assert_eq!(ok.unwrap().llm.micro_batch, 512);
        assert_eq!(
            Config::load_with_env(None, env(&[]))
                .unwrap()
                .llm
                .micro_batch,
            128
        );
    }

    #[test]
    fn the_public_authority_comes_from_the_public_url_without_its_default_port() {
        let authority = |vars: &[(&str, &str)]| {
            Config::load_with_env(None, env(vars))
                .unwrap()
                .public_authority()
        };
        let url = "CALLSTREAM_SERVER__PUBLIC_URL";
        assert_eq!(
            authority(&[(url, "https://Calls.Example.com")]),
            "calls.example.com"
        );
        assert_eq!(
            authority(&[(url, "https://calls.example.com:443/")]),
            "calls.example.com"
        );
        assert_eq!(
            authority(&[(url, "http://calls.example.com:80")]),
            "calls.example.com"
        );
        assert_eq!(
            authority(&[(url, "https://calls.example.com:8443")]),
            "calls.example.com:8443"
        );
        assert_eq!(
            authority(&[
                (url, "https://calls.example.com"),
                ("CALLSTREAM_SERVER__PUBLIC_AUTHORITY", "edge.example.net"),
            ]),
            "edge.example.net"
        );
    }
}
