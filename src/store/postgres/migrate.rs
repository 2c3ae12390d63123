//! The database schema: the migrations in `src/store/migrations/` (`V<n>__<what>.sql`, each
//! listed in [`FILES`]), applied in order by refinery's migrator and recorded in its
//! `refinery_schema_history` table.
//!
//! Instances starting together take turns: each holds a session advisory lock while it
//! migrates. All pending migrations go in one transaction, so a failure leaves the schema as it
//! was. A database that records a migration this build does not have was written by a newer
//! version, and is refused rather than guessed at.
//!
//! Databases created before refinery kept their versions in `schema_migrations`; the first
//! open records those versions in refinery's table as applied (without running them again),
//! then applies what is newer.

use refinery_core::{Migration, Runner, Target};

use super::{backend, StoreError};

/// The migrations, by file name; a test checks that every file of the directory is here.
pub const FILES: &[(&str, &str)] = &[
    ("V1__initial", include_str!("../migrations/V1__initial.sql")),
    (
        "V2__shared_state",
        include_str!("../migrations/V2__shared_state.sql"),
    ),
    (
        "V3__instances",
        include_str!("../migrations/V3__instances.sql"),
    ),
    (
        "V4__org_mcp_allow",
        include_str!("../migrations/V4__org_mcp_allow.sql"),
    ),
    ("V5__places", include_str!("../migrations/V5__places.sql")),
    ("V6__history", include_str!("../migrations/V6__history.sql")),
];

/// The migrator over [`FILES`].
fn runner() -> Runner {
    let migrations: Vec<Migration> = FILES
        .iter()
        .map(|(name, sql)| {
            Migration::unapplied(name, sql).expect("migration file names are V<n>__<what>")
        })
        .collect();
    Runner::new(&migrations)
}

/// Key of the advisory lock that serialises migrations between instances starting together.
const MIGRATION_LOCK: i64 = 0x6361_6c6c_7374_726d; // "callstrm"

/// The schema versions this build knows, in order: (version, name).
pub static MIGRATIONS: std::sync::LazyLock<Vec<(i32, String)>> = std::sync::LazyLock::new(|| {
    let mut known: Vec<(i32, String)> = runner()
        .get_migrations()
        .iter()
        .map(|m| (m.version(), m.name().to_owned()))
        .collect();
    known.sort();
    known
});

/// Applies the migrations the database at `config` lacks, one instance at a time, on a
/// connection of its own; returns the versions applied.
pub async fn migrate(config: &tokio_postgres::Config) -> Result<Vec<i32>, StoreError> {
    let (mut client, connection) = config
        .connect(tokio_postgres::NoTls)
        .await
        .map_err(|e| StoreError::Backend(format!("cannot connect to PostgreSQL: {e}")))?;
    let driver = tokio::spawn(connection);
    let result = migrate_on(&mut client).await;
    drop(client);
    let _ = driver.await;
    result
}

async fn migrate_on(client: &mut tokio_postgres::Client) -> Result<Vec<i32>, StoreError> {
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(backend)?;
    let result = migrate_locked(client).await;
    // Closing the connection would free the lock too; an error here changes nothing.
    let _ = client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
        .await;
    result
}

async fn migrate_locked(client: &mut tokio_postgres::Client) -> Result<Vec<i32>, StoreError> {
    // "relation already exists, skipping" is not news.
    client
        .batch_execute("SET client_min_messages = warning")
        .await
        .map_err(backend)?;
    if let Some(legacy) = legacy_version(client).await? {
        let known = MIGRATIONS.last().map_or(0, |m| m.0);
        if legacy > known {
            return Err(newer(legacy, known));
        }
        runner()
            .set_target(Target::FakeVersion(legacy))
            .run_async(client)
            .await
            .map_err(|e| {
                StoreError::Backend(format!("recording the schema version failed: {e}"))
            })?;
    }
    let report = runner()
        .set_grouped(true)
        .run_async(client)
        .await
        .map_err(|e| {
            let known = MIGRATIONS.last().map_or(0, |m| m.0);
            match e.kind() {
                refinery_core::error::Kind::MissingVersion(m) if m.version() > known => {
                    newer(m.version(), known)
                }
                _ => StoreError::Backend(format!("migrating the database failed: {e}")),
            }
        })?;
    Ok(report
        .applied_migrations()
        .iter()
        .map(|m| m.version())
        .collect())
}

fn newer(version: i32, known: i32) -> StoreError {
    StoreError::Backend(format!(
        "the database schema is at version {version}, newer than this build knows ({known}); \
         run the newer callstream against it"
    ))
}

/// The version a database migrated before refinery recorded in `schema_migrations`, when
/// refinery's table does not exist yet.
async fn legacy_version(client: &tokio_postgres::Client) -> Result<Option<i32>, StoreError> {
    let row = client
        .query_one(
            "SELECT to_regclass('schema_migrations') IS NOT NULL,
                    to_regclass('refinery_schema_history') IS NOT NULL",
            &[],
        )
        .await
        .map_err(backend)?;
    let (legacy, current): (bool, bool) = (row.get(0), row.get(1));
    if !legacy || current {
        return Ok(None);
    }
    let version: Option<i32> = client
        .query_one("SELECT MAX(version) FROM schema_migrations", &[])
        .await
        .map_err(backend)?
        .get(0);
    Ok(version.filter(|v| *v > 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_migration_file_is_listed_in_order() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/store/migrations");
        let mut on_disk: Vec<(String, String)> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "sql"))
            .map(|p| {
                let name = p.file_stem().unwrap().to_string_lossy().into_owned();
                (name, std::fs::read_to_string(&p).unwrap())
            })
            .collect();
        on_disk.sort_by_key(|(name, _)| Migration::unapplied(name, "").unwrap().version());
        let listed: Vec<(String, String)> = FILES
            .iter()
            .map(|(name, sql)| (name.to_string(), sql.to_string()))
            .collect();
        assert_eq!(listed, on_disk);
        let versions: Vec<i32> = MIGRATIONS.iter().map(|m| m.0).collect();
        assert_eq!(versions, (1..=FILES.len() as i32).collect::<Vec<_>>());
    }
}
