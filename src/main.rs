//! The `callstream` command: the service and its administration.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};

use callstream::admin::{
    AdminClient, AdminRequest, AdminResponse, ConnectorView, KeyView, OrgView,
};
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
    /// Show this month's usage and quotas of an organisation.
    Usage {
        /// Organisation id.
        org: String,
    },
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
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
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
    };
    let response = AdminClient::connect(Arc::new(config))?.execute(request)?;
    if cli.json {
        println!("{}", serde_json::to_string_pretty(&response)?);
    } else {
        print_text(&response);
    }
    Ok(())
}

fn serve(config: Config) -> anyhow::Result<()> {
    let listen = config.server.listen;
    let app = App::open(config)?;
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async move {
        let server = server::start(app, listen).await?;
        // The first line on stdout says where to connect; scripts and tests read it.
        println!("callstream listening on http://{}", server.addr);
        shutdown_signal().await;
        tracing::info!("shutting down");
        server.stop().await;
        Ok(())
    })
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing a SIGTERM handler succeeds on Unix");
    tokio::select! {
        _ = ctrl_c => {}
        _ = term.recv() => {}
    }
}

fn print_text(response: &AdminResponse) {
    match response {
        AdminResponse::Org(o) => print_org(o),
        AdminResponse::Orgs { orgs } => {
            if orgs.is_empty() {
                println!("no organisations");
            }
            orgs.iter().for_each(print_org);
        }
        AdminResponse::KeyCreated { key, secret } => {
            print_key(key);
            println!("secret      {secret}");
            println!("(the secret is shown this once; store it now)");
        }
        AdminResponse::Key(k) => print_key(k),
        AdminResponse::Keys { keys } => {
            if keys.is_empty() {
                println!("no API keys");
            }
            keys.iter().for_each(print_key);
        }
        AdminResponse::ConnectorSecret {
            connector,
            client_secret,
            websocket_url,
        } => {
            print_connector(connector);
            println!("client secret  {client_secret}");
            println!("websocket url  {websocket_url}");
            println!("(the client secret is shown this once; store it now)");
        }
        AdminResponse::Connector(c) => print_connector(c),
        AdminResponse::Connectors {
            connectors,
            websocket_url,
        } => {
            if connectors.is_empty() {
                println!("no connectors");
            }
            connectors.iter().for_each(print_connector);
            println!("websocket url  {websocket_url}");
        }
        AdminResponse::Usage(report) => {
            println!(
                "organisation {}  plan {}  month {}",
                report.org_id, report.plan, report.month
            );
            let t = &report.chat_tokens;
            println!(
                "chat tokens      used {}  quota {}  remaining {}",
                t.used,
                opt(t.quota),
                opt(t.remaining)
            );
            let a = &report.audio_seconds;
            let minutes = |s: f64| format!("{:.2}", s / 60.0);
            println!(
                "audio minutes    used {}  quota {}  remaining {}",
                minutes(a.used),
                a.quota.map_or("unlimited".into(), minutes),
                a.remaining.map_or("unlimited".into(), minutes)
            );
            for day in &report.days {
                println!("  {}  {:?}  {}", day.day, day.kind, day.amount);
            }
        }
    }
}

fn opt(v: Option<u64>) -> String {
    v.map_or_else(|| "unlimited".to_owned(), |v| v.to_string())
}

fn print_org(o: &OrgView) {
    let state = if o.deleted { "  (deleted)" } else { "" };
    println!(
        "{}  {}  plan={}  created={}{state}",
        o.id, o.name, o.plan, o.created_at
    );
}

fn print_key(k: &KeyView) {
    let state = k
        .revoked_at
        .as_deref()
        .map(|t| format!("  revoked={t}"))
        .unwrap_or_default();
    let name = k.name.as_deref().unwrap_or("-");
    println!(
        "{}  org={}  name={name}  ...{}  created={}{state}",
        k.id, k.org_id, k.last4, k.created_at
    );
}

fn print_connector(c: &ConnectorView) {
    let name = c.name.as_deref().unwrap_or("-");
    let rotated = c
        .rotated_at
        .as_deref()
        .map(|t| format!("  rotated={t}"))
        .unwrap_or_default();
    let revoked = c
        .revoked_at
        .as_deref()
        .map(|t| format!("  revoked={t}"))
        .unwrap_or_default();
    println!(
        "client id      {}  org={}  name={name}  created={}{rotated}{revoked}",
        c.client_id, c.org_id, c.created_at
    );
}
