//! The `callstream` command: the service, its administration, and local tools
//! (transcription, benchmarks).

mod cli;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};

use callstream::admin::{AdminClient, AdminRequest};
use callstream::app::App;
use callstream::config::Config;
use callstream::server;

/// Contact-center service: chat, file transcription and live call transcription.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// A configuration file laid over the built-in defaults (config.toml).
    #[arg(long, global = true, env = "CALLSTREAM_CONFIG")]
    config: Option<PathBuf>,
    /// Print results as JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the service (the default when no command is given).
    Serve,
    /// Manage organisations.
    #[command(subcommand)]
    Org(OrgCommand),
    /// Manage API keys.
    #[command(subcommand)]
    Key(KeyCommand),
    /// Manage AudioHook connectors.
    #[command(subcommand)]
    Connector(ConnectorCommand),
    /// Manage dashboard users.
    #[command(subcommand)]
    User(UserCommand),
    /// Show this month's usage and quotas of an organisation.
    Usage {
        /// Organisation id.
        org: String,
    },
    /// Stream an audio file to a live-call endpoint as an AudioHook v2 client would.
    Call(cli::call::CallArgs),
    /// Transcribe an audio file here, with the configured speech engine.
    Transcribe(cli::transcribe::TranscribeArgs),
    /// Measure performance.
    #[command(subcommand)]
    Bench(cli::bench::BenchCommand),
    /// Prepare or move the database (sled or PostgreSQL).
    #[command(subcommand)]
    Store(cli::store::StoreCommand),
}

#[derive(Subcommand)]
enum OrgCommand {
    /// Create an organisation.
    Create {
        /// Display name.
        name: String,
        /// Plan (default: limits.default_plan).
        #[arg(long)]
        plan: Option<String>,
    },
    /// List organisations.
    List,
    /// Delete an organisation; its keys then answer 404.
    Delete {
        /// Organisation id.
        org: String,
    },
    /// Set the system prompt applied before every chat of the organisation.
    SetPrompt {
        /// Organisation id.
        org: String,
        /// The prompt (omit with --clear).
        #[arg(required_unless_present = "clear")]
        prompt: Option<String>,
        /// Remove the prompt.
        #[arg(long)]
        clear: bool,
    },
    /// Set the MCP server (Streamable HTTP) whose tools chat may use.
    SetMcp {
        /// Organisation id.
        org: String,
        /// Endpoint URL (omit with --clear).
        #[arg(long, required_unless_present = "clear")]
        url: Option<String>,
        /// A header sent to it, NAME=VALUE; repeat for more.
        #[arg(long = "header", value_parser = parse_header)]
        headers: Vec<(String, String)>,
        /// Remove the MCP server.
        #[arg(long)]
        clear: bool,
    },
    /// Set the call-history settings, replacing the ones in force: how long records are kept
    /// (within the plan's retention_days) and whether transcripts are redacted.
    SetHistory {
        /// Organisation id.
        org: String,
        /// Days records are kept; omitted: as long as the plan keeps them.
        #[arg(long)]
        retention_days: Option<u32>,
        /// Replace card numbers, SSNs, e-mail addresses and phone numbers in transcripts.
        #[arg(long)]
        redact: bool,
        /// A connector's client id (or an API key id) that redacts otherwise than the
        /// organisation, ID=on or ID=off; repeat for more.
        #[arg(long = "redact-connector", value_parser = parse_switch)]
        redact_connectors: Vec<(String, bool)>,
    },
    /// Set the non-public networks (CIDR, such as 10.1.2.0/24) and host names the
    /// organisation's MCP server may have. Each counts only within llm.mcp_allow, the bound
    /// for every organisation; none given: public addresses only.
    SetMcpAllow {
        /// Organisation id.
        org: String,
        /// Networks and host names.
        allow: Vec<String>,
    },
}

fn parse_switch(s: &str) -> Result<(String, bool), String> {
    match s.split_once('=') {
        Some((id, "on")) if !id.trim().is_empty() => Ok((id.trim().to_owned(), true)),
        Some((id, "off")) if !id.trim().is_empty() => Ok((id.trim().to_owned(), false)),
        _ => Err(format!("{s:?} is not ID=on or ID=off")),
    }
}

fn parse_header(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| format!("{s:?} is not NAME=VALUE"))
}

#[derive(Subcommand)]
enum UserCommand {
    /// Create a dashboard user who administers an organisation (the first one of an
    /// organisation is made this way; it signs in at /dashboard).
    Create {
        /// Organisation id.
        org: String,
        /// Sign-in email.
        email: String,
        /// Read the password (at least 12 characters) from the first line of standard
        /// input. Without it, the password is taken from CALLSTREAM_USER_PASSWORD, or asked
        /// for at the terminal; it is never an argument, which `ps` would show.
        #[arg(long)]
        password_stdin: bool,
    },
}

#[derive(Subcommand)]
enum KeyCommand {
    /// Create an API key and print its secret, once.
    Create {
        /// Organisation id.
        org: String,
        /// A name to tell keys apart.
        #[arg(long)]
        name: Option<String>,
    },
    /// List an organisation's keys (last four characters only).
    List {
        /// Organisation id.
        org: String,
    },
    /// Revoke a key.
    Revoke {
        /// Key id.
        key: String,
    },
}

#[derive(Subcommand)]
enum ConnectorCommand {
    /// Create a connector and print its client id, client secret (once) and WebSocket URL.
    Create {
        /// Organisation id.
        org: String,
        /// A name to tell connectors apart.
        #[arg(long)]
        name: Option<String>,
    },
    /// List an organisation's connectors.
    List {
        /// Organisation id.
        org: String,
    },
    /// Replace a connector's client secret and print the new one, once.
    Rotate {
        /// Client id.
        client_id: String,
    },
    /// Revoke a connector.
    Revoke {
        /// Client id.
        client_id: String,
    },
}

fn main() -> ExitCode {
    // Everything this process creates (the database, keys, the admin socket) is its user's
    // alone: files 0600, directories 0700, whatever the libraries that create them ask for.
    // SAFETY: umask only sets the process's file-mode mask; no thread exists yet to race it.
    unsafe {
        libc::umask(0o077);
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    if let Some(Command::Call(args)) = cli.command {
        // A client of a remote service: it needs no configuration.
        return match cli::call::run(args, cli.json) {
            Ok(code) => code,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let config = Config::load(cli.config.as_deref())?;
    let request = match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => return serve(config),
        Command::Org(OrgCommand::Create { name, plan }) => AdminRequest::OrgCreate { name, plan },
        Command::Org(OrgCommand::List) => AdminRequest::OrgList,
        Command::Org(OrgCommand::Delete { org }) => AdminRequest::OrgDelete { org },
        Command::Org(OrgCommand::SetPrompt { org, prompt, clear }) => AdminRequest::OrgSetPrompt {
            org,
            system_prompt: if clear { None } else { prompt },
        },
        Command::Org(OrgCommand::SetHistory {
            org,
            retention_days,
            redact,
            redact_connectors,
        }) => AdminRequest::OrgSetHistory {
            org,
            history: callstream::store::HistorySettings {
                retention_days,
                redact,
                redact_connectors: redact_connectors.into_iter().collect(),
            },
        },
        Command::Org(OrgCommand::SetMcpAllow { org, allow }) => {
            AdminRequest::OrgSetMcpAllow { org, allow }
        }
        Command::Org(OrgCommand::SetMcp {
            org,
            url,
            headers,
            clear,
        }) => AdminRequest::OrgSetMcp {
            org,
            mcp: match url {
                Some(url) if !clear => Some(callstream::store::McpIntegration {
                    url,
                    headers: headers.into_iter().collect(),
                }),
                _ => None,
            },
        },
        Command::Key(KeyCommand::Create { org, name }) => AdminRequest::KeyCreate { org, name },
        Command::Key(KeyCommand::List { org }) => AdminRequest::KeyList { org },
        Command::Key(KeyCommand::Revoke { key }) => AdminRequest::KeyRevoke { key },
        Command::Connector(ConnectorCommand::Create { org, name }) => {
            AdminRequest::ConnectorCreate { org, name }
        }
        Command::Connector(ConnectorCommand::List { org }) => AdminRequest::ConnectorList { org },
        Command::Connector(ConnectorCommand::Rotate { client_id }) => {
            AdminRequest::ConnectorRotate { client_id }
        }
        Command::Connector(ConnectorCommand::Revoke { client_id }) => {
            AdminRequest::ConnectorRevoke { client_id }
        }
        Command::Usage { org } => AdminRequest::Usage { org },
        Command::User(UserCommand::Create {
            org,
            email,
            password_stdin,
        }) => AdminRequest::UserCreate {
            org,
            email,
            password: cli::password::read(
                password_stdin,
                std::env::var("CALLSTREAM_USER_PASSWORD").ok(),
            )?,
        },
        Command::Transcribe(args) => return cli::transcribe::run(&config, args, cli.json),
        Command::Call(_) => unreachable!("handled before the configuration is loaded"),
        Command::Bench(command) => return cli::bench::run(&config, command),
        Command::Store(command) => return cli::store::run(&config, command, cli.json),
    };
    let response = AdminClient::connect(Arc::new(config))?.execute(request)?;
    if cli.json {
        println!("{}", serde_json::to_string_pretty(&response)?);
    } else {
        cli::admin::print_text(&response);
    }
    Ok(())
}

fn serve(config: Config) -> anyhow::Result<()> {
    let listen = config.server.listen;
    let drain = std::time::Duration::from_millis(config.server.drain_timeout_ms);
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async move {
        let app = App::open(config).await?;
        let server = server::start(app.clone(), listen).await?;
        // The first line on stdout says where to connect; scripts and tests read it.
        println!("callstream listening on http://{}", server.addr);
        let mut signals = Signals::new();
        if signals.next().await == Signal::Terminate && !drain.is_zero() {
            drain_calls(&app, drain, &mut signals).await;
        }
        tracing::info!("shutting down");
        server.stop().await;
        app.shared.stop_instance().await;
        // The model's thread ends before the process does (see `Provider::stop`).
        if !app.llm.stop(ENGINE_STOP_WAIT) {
            tracing::error!(
                within_s = ENGINE_STOP_WAIT.as_secs(),
                "the model did not stop; leaving without the exit handlers"
            );
            // SAFETY: `_exit` ends the process at once. It skips the exit handlers, which
            // would tear the engine's static state down under its running thread; what the
            // service acknowledged is on disk already (every store write is durable when it
            // returns), and the log is unbuffered standard error.
            unsafe { libc::_exit(1) }
        }
        Ok(())
    })
}

/// How long a stopping service waits for the model to give up its work and free itself
/// (a decode in progress ends its chunk of prompt first).
const ENGINE_STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Stops taking new calls and sessions (the readiness check says so) and lets the live calls
/// in progress run on, until they have all ended, `within` has passed, or another signal comes.
async fn drain_calls(app: &App, within: std::time::Duration, signals: &mut Signals) {
    tracing::info!(
        calls = app.calls.running(),
        within_ms = within.as_millis() as u64,
        "draining: no new calls or sessions; calls in progress run on"
    );
    app.lifecycle.drain();
    app.shared.set_draining().await;
    let deadline = tokio::time::Instant::now() + within;
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(100));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = signals.next() => {
                tracing::info!("second signal: stopping now");
                return;
            }
        }
        if app.calls.running() == 0 {
            tracing::info!("drained: no call in progress");
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!(
                calls = app.calls.running(),
                "drain time is over; stopping the calls left"
            );
            return;
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Signal {
    Interrupt,
    Terminate,
}

/// SIGINT and SIGTERM, as they come.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> Self {
        use tokio::signal::unix::{signal, SignalKind};
        Self {
            term: signal(SignalKind::terminate())
                .expect("installing a SIGTERM handler succeeds on Unix"),
            int: signal(SignalKind::interrupt())
                .expect("installing a SIGINT handler succeeds on Unix"),
        }
    }

    async fn next(&mut self) -> Signal {
        tokio::select! {
            _ = self.int.recv() => Signal::Interrupt,
            _ = self.term.recv() => Signal::Terminate,
        }
    }
}
