//! Test harness: the real `callstream` binary on 127.0.0.1:0 with its own data directory, and
//! the CLI run against the same directory.

#![allow(dead_code)]

pub mod audiohook;
pub mod calls;
pub mod dashboard;
pub mod mcp;
pub mod upstream;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// The Whisper model installed by `scripts/setup.sh --test`.
pub fn whisper_dir() -> PathBuf {
    let dir =
        callstream_actors::package_dir(env!("CARGO_MANIFEST_DIR")).join("models/whisper-base");
    assert!(
        dir.join("model.bin").exists(),
        "{} is missing: run scripts/setup.sh --test",
        dir.display()
    );
    dir
}

/// The small LLM installed by `scripts/setup.sh --test`.
pub fn llm_path() -> PathBuf {
    let path = callstream_actors::package_dir(env!("CARGO_MANIFEST_DIR"))
        .join("models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    assert!(
        path.exists(),
        "{} is missing: run scripts/setup.sh --test",
        path.display()
    );
    path
}

/// A data directory and the environment that points the binary at it.
pub struct Env {
    pub dir: tempfile::TempDir,
    pub vars: Vec<(String, String)>,
}

impl Env {
    /// An environment with extra variables given as owned pairs.
    pub fn with(extra: Vec<(&'static str, String)>) -> Self {
        let pairs: Vec<(&str, &str)> = extra.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Self::new(&pairs)
    }

    pub fn new(extra: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut vars = vec![
            (
                "CALLSTREAM_SERVER__LISTEN".to_owned(),
                "127.0.0.1:0".to_owned(),
            ),
            (
                "CALLSTREAM_STORAGE__DATA_DIR".to_owned(),
                dir.path().join("data").display().to_string(),
            ),
            (
                "CALLSTREAM_MODELS__WHISPER".to_owned(),
                whisper_dir().display().to_string(),
            ),
            (
                "CALLSTREAM_MODELS__LLM".to_owned(),
                llm_path().display().to_string(),
            ),
            // Several test servers share two cores.
            ("CALLSTREAM_LLM__THREADS".to_owned(), "1".to_owned()),
            // The service's window: a file's analyses need the files prompt (about 3,200
            // tokens), the transcript and room for the answer (1,280).
            (
                "CALLSTREAM_LLM__CONTEXT_TOKENS".to_owned(),
                "8192".to_owned(),
            ),
            // The tests' MCP servers listen on loopback, which is refused by default.
            (
                "CALLSTREAM_LLM__MCP_ALLOW".to_owned(),
                "[\"127.0.0.1\"]".to_owned(),
            ),
        ];
        vars.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        Self { dir, vars }
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The binary with this environment, to run as the test likes.
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_callstream"));
        cmd.current_dir(self.dir.path())
            .env_remove("CALLSTREAM_CONFIG")
            .env("RUST_LOG", "warn")
            .envs(self.vars.iter().map(|(k, v)| (k, v)));
        cmd
    }

    /// Runs the CLI and returns its output.
    pub fn cli(&self, args: &[&str]) -> Output {
        self.command()
            .args(args)
            .output()
            .expect("the callstream binary runs")
    }

    /// Creates a dashboard user of `org`, the password written to the CLI's standard input.
    pub fn create_user(&self, org: &str, email: &str, password: &str) -> serde_json::Value {
        use std::io::Write;
        let mut child = self
            .command()
            .args(["--json", "user", "create", org, email, "--password-stdin"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("the callstream binary runs");
        let mut stdin = child.stdin.take().unwrap();
        writeln!(stdin, "{password}").unwrap();
        drop(stdin);
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "callstream user create failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("--json prints JSON")
    }

    /// Runs the CLI with `--json`, asserts success and parses stdout.
    pub fn cli_json(&self, args: &[&str]) -> serde_json::Value {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let out = self.cli(&all);
        assert!(
            out.status.success(),
            "callstream {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("--json prints JSON")
    }

    /// Creates an organisation (plan `free` unless given) and one API key; returns
    /// (org id, key id, secret).
    pub fn org_with_key(&self, name: &str) -> (String, String, String) {
        let org = self.cli_json(&["org", "create", name]);
        let org_id = org["id"].as_str().unwrap().to_owned();
        let (key_id, secret) = self.key(&org_id);
        (org_id, key_id, secret)
    }

    /// Creates an organisation on `plan`; returns its id.
    pub fn org_on_plan(&self, name: &str, plan: &str) -> String {
        self.cli_json(&["org", "create", name, "--plan", plan])["id"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// Creates an AudioHook connector for `org_id`; returns (client id, client secret).
    pub fn connector(&self, org_id: &str) -> (String, String) {
        let c = self.cli_json(&["connector", "create", org_id]);
        (
            c["connector"]["client_id"].as_str().unwrap().to_owned(),
            c["client_secret"].as_str().unwrap().to_owned(),
        )
    }

    /// Creates a key for `org_id`; returns (key id, secret).
    pub fn key(&self, org_id: &str) -> (String, String) {
        let key = self.cli_json(&["key", "create", org_id]);
        (
            key["key"]["id"].as_str().unwrap().to_owned(),
            key["secret"].as_str().unwrap().to_owned(),
        )
    }

    /// Seconds of audio the organisation used this month, as `callstream usage` reports them.
    pub fn audio_used(&self, org_id: &str) -> f64 {
        self.cli_json(&["usage", org_id])["audio_seconds"]["used"]
            .as_f64()
            .unwrap()
    }

    /// Sets or replaces an environment variable of the binary.
    pub fn set(&mut self, name: &str, value: &str) {
        self.vars.retain(|(k, _)| k != name);
        self.vars.push((name.to_owned(), value.to_owned()));
    }

    /// Starts `callstream serve` and waits until it listens.
    pub fn serve(&self) -> Server {
        self.serve_with(Stdio::inherit())
    }

    /// Starts `callstream serve` with its log (at `info`) written to `log`.
    pub fn serve_logged(&self, log: &Path) -> Server {
        let file = std::fs::File::create(log).unwrap();
        let mut child = self
            .command()
            .env("RUST_LOG", "info")
            .arg("serve")
            .stdout(Stdio::piped())
            .stderr(file)
            .spawn()
            .expect("the callstream binary starts");
        let stdout = child.stdout.take().unwrap();
        Self::listening(child, stdout)
    }

    fn serve_with(&self, stderr: Stdio) -> Server {
        let mut child = self
            .command()
            .arg("serve")
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("the callstream binary starts");
        let stdout = child.stdout.take().unwrap();
        Self::listening(child, stdout)
    }

    fn listening(child: Child, stdout: std::process::ChildStdout) -> Server {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx
            .recv_timeout(Duration::from_secs(120))
            .expect("the server prints its address");
        let addr: SocketAddr = line
            .trim()
            .strip_prefix("callstream listening on http://")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .parse()
            .unwrap();
        Server { child, addr }
    }
}

/// A running server process; killed when dropped.
pub struct Server {
    child: Child,
    pub addr: SocketAddr,
}

impl Server {
    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A field of `/proc/<pid>/status` in MiB (`VmRSS`, `VmHWM` for the peak).
    pub fn memory_mib(&self, field: &str) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("the server is alive");
        let kib: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{field}:")))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no {field} in /proc status"));
        kib / 1024.0
    }

    /// True while the process runs.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Sends SIGTERM and waits for a graceful exit.
    pub fn stop(mut self) {
        let pid = self.child.id().to_string();
        let status = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(status.success());
        let exit = self.child.wait().unwrap();
        assert!(exit.success(), "server exited with {exit}");
    }

    /// Sends SIGTERM and returns at once.
    pub fn terminate(&self) {
        let pid = self.child.id().to_string();
        let status = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(status.success());
    }

    /// Waits up to `within` for the process to exit by itself; its exit status.
    pub fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + within;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// Kills the process without letting it shut down.
    pub fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// POST JSON to `url` with an API key; returns status and JSON body.
pub async fn post(
    client: &reqwest::Client,
    url: &str,
    key: &str,
    body: &serde_json::Value,
) -> (u16, serde_json::Value) {
    let resp = client
        .post(url)
        .header("X-API-Key", key)
        .json(body)
        .send()
        .await
        .expect("the server answers");
    let status = resp.status().as_u16();
    (status, resp.json().await.expect("every answer is JSON"))
}

/// A WAV file: format tag, channels, rate, bits per sample, and the data.
pub fn wav(format_tag: u16, channels: u16, rate: u32, bits: u16, data: &[u8]) -> Vec<u8> {
    let block = (channels.max(1) * bits / 8).max(1);
    let mut h = Vec::new();
    h.extend_from_slice(b"RIFF");
    h.extend_from_slice(&(36 + data.len() as u32).to_le_bytes());
    h.extend_from_slice(b"WAVEfmt ");
    h.extend_from_slice(&16u32.to_le_bytes());
    h.extend_from_slice(&format_tag.to_le_bytes());
    h.extend_from_slice(&channels.to_le_bytes());
    h.extend_from_slice(&rate.to_le_bytes());
    h.extend_from_slice(&rate.wrapping_mul(u32::from(block)).to_le_bytes());
    h.extend_from_slice(&block.to_le_bytes());
    h.extend_from_slice(&bits.to_le_bytes());
    h.extend_from_slice(b"data");
    h.extend_from_slice(&(data.len() as u32).to_le_bytes());
    h.extend_from_slice(data);
    h
}

/// Uploads `bytes` as the file `name` to `url` (`POST /api/transcribe`) with the API key; returns
/// the status and the JSON answer.
pub async fn upload(
    url: String,
    key: &str,
    name: &str,
    bytes: Vec<u8>,
) -> (u16, serde_json::Value) {
    let form = reqwest::multipart::Form::new().part(
        "file",
        reqwest::multipart::Part::bytes(bytes).file_name(name.to_owned()),
    );
    let resp = reqwest::Client::new()
        .post(url)
        .header("X-API-Key", key)
        .multipart(form)
        .timeout(Duration::from_secs(300))
        .send()
        .await
        .expect("the server answers");
    let status = resp.status().as_u16();
    (status, resp.json().await.expect("every answer is JSON"))
}

/// Where `scripts/setup.sh --test` installs the Python client libraries the tests use.
pub fn pydeps() -> String {
    std::env::var("CALLSTREAM_PYDEPS").unwrap_or_else(|_| {
        format!(
            "{}/.cache/callstream/pydeps",
            std::env::var("HOME").unwrap()
        )
    })
}

/// Runs `tests/support/<script>` with `args` under the test clients' Python path, asserts it
/// succeeded and parses the JSON it printed.
pub fn python_json(script: &str, args: &[&str]) -> serde_json::Value {
    let path = callstream_actors::package_dir(env!("CARGO_MANIFEST_DIR"))
        .join("tests/support")
        .join(script);
    let out = Command::new("python3")
        .arg(&path)
        .args(args)
        .env("PYTHONPATH", pydeps())
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{script} failed (scripts/setup.sh --test installs its libraries): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the script prints JSON")
}

/// An organisation's ledger, read from the data directory's store (the server must be
/// stopped).
pub fn usage_events(data_dir: &Path, org_id: &str) -> Vec<callstream_actors::usage::UsageEvent> {
    use callstream::store::Store as _;
    let secrets = callstream::store::SecretBox::from_config("", data_dir).unwrap();
    let store = callstream::store::SledStore::open(data_dir, secrets).unwrap();
    // On a runtime of its own, on a thread of its own: callers may be inside a runtime.
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap()
                    .block_on(store.usage_events(org_id, 0, i64::MAX))
                    .unwrap()
            })
            .join()
            .unwrap()
    })
}

/// GET `url` with an optional API key; returns status, headers and JSON body.
pub async fn get(
    client: &reqwest::Client,
    url: &str,
    key: Option<&str>,
) -> (u16, reqwest::header::HeaderMap, serde_json::Value) {
    let mut req = client.get(url);
    if let Some(key) = key {
        req = req.header("X-API-Key", key);
    }
    let resp = req.send().await.expect("the server answers");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.json().await.expect("every answer is JSON");
    (status, headers, body)
}
