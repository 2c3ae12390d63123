//! A throw-away PostgreSQL cluster for tests: `initdb` into a temporary directory, `pg_ctl` on
//! a free loopback port, stopped and removed when the test process exits.
//!
//! PostgreSQL refuses to run as root, so under root the cluster belongs to the `postgres`
//! system user the Debian package creates (commands run through `runuser`); otherwise it runs
//! as the invoking user. Clusters left behind by a killed test process are stopped and removed
//! by the next one. Each test takes a database of its own from the shared cluster.
//!
//! This file is compiled into the library's unit tests and, by path, into the integration
//! tests that run several instances on one database.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Superuser of the test clusters (trust authentication on loopback only).
pub const USER: &str = "callstream";
const PREFIX: &str = "callstream-pg-";

/// A running cluster.
pub struct Cluster {
    dir: PathBuf,
    bin: PathBuf,
    port: u16,
    run_as_postgres: bool,
    databases: AtomicUsize,
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The newest installed server's binary directory.
fn bin_dir() -> PathBuf {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).unwrap_or_else(|| {
        panic!(
            "PostgreSQL server binaries not found under /usr/lib/postgresql; \
             scripts/setup.sh --test installs them"
        )
    })
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

impl Cluster {
    fn command(&self, program: &str) -> Command {
        command(&self.bin, program, self.run_as_postgres)
    }

    /// Starts a new cluster.
    pub fn start() -> Cluster {
        sweep_abandoned();
        let run_as_postgres = is_root();
        let bin = bin_dir();
        let dir = std::env::temp_dir().join(format!("{PREFIX}{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the cluster directory");
        if run_as_postgres {
            let (uid, gid) = postgres_ids();
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
                .expect("hand the cluster directory to the postgres user");
        }
        let data = dir.join("data");
        let out = command(&bin, "initdb", run_as_postgres)
            .arg("-D")
            .arg(&data)
            .args(["-U", USER, "--auth=trust", "--no-sync", "-E", "UTF8"])
            .args(["--locale=C"])
            .output()
            .expect("run initdb");
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        for attempt in 0.. {
            let cluster = Cluster {
                dir: dir.clone(),
                bin: bin.clone(),
                port: free_port(),
                run_as_postgres,
                databases: AtomicUsize::new(0),
            };
            let options = format!(
                "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=300 \
                 -c shared_buffers=32MB",
                cluster.port,
                dir.display()
            );
            let status = cluster
                .command("pg_ctl")
                .arg("-D")
                .arg(&data)
                .arg("-l")
                .arg(dir.join("log"))
                .args(["-w", "-t", "60", "-o", &options, "start"])
                .status()
                .expect("run pg_ctl");
            if status.success() {
                return cluster;
            }
            // Another process may have taken the port in between.
            assert!(
                attempt < 3,
                "pg_ctl start failed; see {}",
                dir.join("log").display()
            );
        }
        unreachable!()
    }

    /// The process-wide cluster, started on first use and stopped when the process exits.
    pub fn shared() -> &'static Cluster {
        static SHARED: OnceLock<Cluster> = OnceLock::new();
        SHARED.get_or_init(|| {
            let cluster = Cluster::start();
            extern "C" fn stop_at_exit() {
                if let Some(cluster) = SHARED.get() {
                    cluster.stop();
                }
            }
            // SAFETY: registering a plain extern "C" function with no arguments.
            unsafe { libc::atexit(stop_at_exit) };
            cluster
        })
    }

    /// The loopback port the cluster listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A `postgres://` URL of database `db` of this cluster.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://{USER}@127.0.0.1:{}/{db}", self.port)
    }

    /// Creates a new, empty database and returns its URL.
    pub fn fresh_database(&self) -> String {
        let n = self.databases.fetch_add(1, Ordering::Relaxed);
        let name = format!("test_{n}");
        let url = self.url("postgres");
        let create = format!("CREATE DATABASE {name}");
        super::testpg::on_own_runtime(async move {
            let (admin, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .expect("connect");
            tokio::spawn(connection);
            admin.batch_execute(&create).await.expect("create database");
        });
        self.url(&name)
    }

    /// Stops the server and removes its files.
    pub fn stop(&self) {
        let _ = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-m", "immediate", "-w", "stop"])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn command(bin: &Path, program: &str, run_as_postgres: bool) -> Command {
    let path = bin.join(program);
    if run_as_postgres {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(path);
        c
    } else {
        Command::new(path)
    }
}

fn postgres_ids() -> (u32, u32) {
    let name = std::ffi::CString::new("postgres").expect("no NUL");
    // SAFETY: getpwnam reads a NUL-terminated name and returns a pointer to static storage
    // (or null), which is read at once, before any other call could overwrite it.
    let entry = unsafe { libc::getpwnam(name.as_ptr()) };
    assert!(
        !entry.is_null(),
        "no postgres system user; scripts/setup.sh --test installs PostgreSQL, which creates it"
    );
    // SAFETY: checked non-null above.
    unsafe { ((*entry).pw_uid, (*entry).pw_gid) }
}

/// Stops and removes the clusters of test processes that no longer run.
fn sweep_abandoned() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(PREFIX))
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: signal 0 only checks that the process exists.
        let alive = unsafe { libc::kill(pid, 0) } == 0;
        if alive {
            continue;
        }
        let data = entry.path().join("data");
        let _ = command(&bin_dir(), "pg_ctl", is_root())
            .arg("-D")
            .arg(&data)
            .args(["-m", "immediate", "-w", "stop"])
            .output();
        let _ = std::fs::remove_dir_all(entry.path());
    }
}

/// Runs `work` to its end on a runtime of its own, on a thread of its own: callers may be
/// inside a runtime (an async test) or not.
pub fn on_own_runtime<T: Send>(work: impl std::future::Future<Output = T> + Send) -> T {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime")
                    .block_on(work)
            })
            .join()
            .expect("the work ended")
    })
}
