//! `callstream store`: bring a PostgreSQL schema up to date, and move an installation between
//! sled and PostgreSQL.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Subcommand;

use callstream::config::{Config, StorageBackend};
use callstream::store::{self, PgStore, SecretBox, SledStore, Store};

/// `callstream store ...`
#[derive(Subcommand)]
pub enum StoreCommand {
    /// Create or update the configured PostgreSQL schema (the service also does this at
    /// start); nothing to do for sled.
    Migrate,
    /// Copy everything from one store into another, empty one: organisations, keys,
    /// connectors (secrets sealed again with the target's key), dashboard users and the usage
    /// ledger. Stop the service that uses the source first.
    Copy {
        /// `sled:DATA_DIR` (a data directory) or `postgres:URL`.
        #[arg(long)]
        from: Location,
        /// `sled:DATA_DIR` or `postgres:URL`.
        #[arg(long)]
        to: Location,
        /// The key the source's secrets are sealed with (base64 of 32 bytes). Default: the key
        /// file of a sled source's data directory if it has one, else `storage.secret_key`.
        #[arg(long, env = "CALLSTREAM_COPY_FROM_SECRET_KEY")]
        from_secret_key: Option<String>,
    },
}

/// Where a store is.
#[derive(Clone, Debug)]
pub enum Location {
    /// The sled database of a data directory.
    Sled(PathBuf),
    /// A PostgreSQL database.
    Postgres(String),
}

impl std::str::FromStr for Location {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once(':') {
            Some(("sled", path)) if !path.is_empty() => Ok(Location::Sled(path.into())),
            Some(("postgres", url)) if !url.is_empty() => Ok(Location::Postgres(url.into())),
            _ => Err(format!("{s:?} is neither sled:DATA_DIR nor postgres:URL")),
        }
    }
}

/// Opens a store at `location` whose secrets are sealed with `key` (base64); for sled without
/// one, with the key file of its data directory (which a source must already have).
async fn open(
    location: &Location,
    key: &str,
    data_dir: &Path,
    source: bool,
) -> anyhow::Result<Arc<dyn Store>> {
    Ok(match location {
        Location::Sled(dir) => {
            if source && !dir.join(store::sled::DB_DIR).is_dir() {
                anyhow::bail!("{} holds no sled database", dir.display());
            }
            std::fs::create_dir_all(dir)?;
            let secrets = SecretBox::from_config(key, dir)?;
            Arc::new(SledStore::open(dir, secrets)?)
        }
        Location::Postgres(url) => {
            if key.trim().is_empty() {
                anyhow::bail!(
                    "set storage.secret_key (CALLSTREAM_STORAGE__SECRET_KEY) to the key the \
                     PostgreSQL instances use: base64 of 32 bytes"
                );
            }
            let secrets = SecretBox::from_config(key, data_dir)?;
            Arc::new(PgStore::open(url, 2, secrets).await?)
        }
    })
}

/// The key a source's secrets were sealed with: the one given, else (as an empty key, which
/// `SecretBox::from_config` reads from the data directory) the key file of a sled source's
/// data directory, else the configured one.
fn source_key(config: &Config, from: &Location, given: Option<String>) -> anyhow::Result<String> {
    if let Some(key) = given {
        return Ok(key);
    }
    if let Location::Sled(dir) = from {
        if dir.join(store::crypto::KEY_FILE).exists() {
            // No key given: the store opens with its data directory's key file.
            return Ok(String::new());
        }
    }
    Ok(config.storage.secret_key.clone())
}

/// Runs a `store` subcommand.
pub fn run(config: &Config, command: StoreCommand, json: bool) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(run_on(config, command, json))
}

async fn run_on(config: &Config, command: StoreCommand, json: bool) -> anyhow::Result<()> {
    match command {
        StoreCommand::Migrate => {
            if config.storage.backend == StorageBackend::Sled {
                println!("storage.backend is sled: nothing to migrate");
                return Ok(());
            }
            store::open(&config.storage).await?;
            let latest = store::postgres::MIGRATIONS.last().map_or(0, |m| m.0);
            println!("PostgreSQL schema at version {latest}");
        }
        StoreCommand::Copy {
            from,
            to,
            from_secret_key,
        } => {
            let source_key = source_key(config, &from, from_secret_key)?;
            let data_dir = &config.storage.data_dir;
            let source = open(&from, &source_key, data_dir, true).await?;
            let target = open(&to, &config.storage.secret_key, data_dir, false).await?;
            let report = store::copy::copy(&*source, &*target).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                println!(
                    "copied {} organisations, {} API keys, {} connectors, {} dashboard users, \
                     {} ledger rows, {} call-history records",
                    report.orgs,
                    report.api_keys,
                    report.connectors,
                    report.users,
                    report.usage_events,
                    report.history_records
                );
            }
        }
    }
    Ok(())
}
