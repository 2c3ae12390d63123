//! The dashboard in a real headless browser (Debian's chromium driven through chromedriver):
//! sign in, create and revoke an API key (its realtime session closes with 1011), create a
//! connector and stream the Genesys call with its credentials through `callstream call`, watch
//! the call's transcripts arrive on the live page, see usage move, set the system prompt and an
//! MCP server and test it, follow the live call to its page in the call history, search,
//! export and erase it, set retention and redaction, and stay inside one's own organisation.
//! A screenshot of each page is saved under `$CARGO_TARGET_TMPDIR/dashboard/`.

mod common;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use futures_util::StreamExt;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

use common::upstream::{FakeUpstream, Reply};
use common::Env;

const PASSWORD: &str = "correct horse battery staple";

struct Driver(Child);

impl Drop for Driver {
    /// Ends chromedriver and the browser it started (its process group): a test that fails
    /// before closing its session leaves no browser behind.
    fn drop(&mut self) {
        // SAFETY: kill(2) on the process group this test created.
        unsafe {
            libc::kill(-(self.0.id() as i32), libc::SIGKILL);
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn browser() -> (Driver, Client) {
    let port = free_port();
    use std::os::unix::process::CommandExt as _;
    let child = Command::new("chromedriver")
        .arg(format!("--port={port}"))
        .process_group(0)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromedriver runs (scripts/setup.sh --test installs chromium-driver)");
    let driver = Driver(child);
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({
            "binary": "/usr/bin/chromium",
            "args": ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--window-size=1280,1000"]
        }),
    );
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    let url = format!("http://127.0.0.1:{port}");
    for _ in 0..100 {
        if let Ok(client) = ClientBuilder::new(connector.clone())
            .capabilities(caps.clone())
            .connect(&url)
            .await
        {
            return (driver, client);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("chromedriver did not start a browser session");
}

fn shots_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn shot(c: &Client, name: &str) {
    let png = c.screenshot().await.unwrap();
    assert!(png.starts_with(b"\x89PNG"));
    let path = shots_dir().join(format!("{name}.png"));
    std::fs::write(&path, png).unwrap();
    eprintln!("screenshot {}", path.display());
}

/// The text of the first element matching `css`, waiting up to 20 s for it.
async fn text(c: &Client, css: &str) -> String {
    for _ in 0..200 {
        if let Ok(e) = c.find(Locator::Css(css)).await {
            // The page may be replaced between finding and reading.
            if let Ok(t) = e.text().await {
                return t;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no {css} within 20 s")
}

/// Clicks a submit button and waits until the page it was on has been replaced.
async fn click(c: &Client, css: &str) {
    let old = c.find(Locator::Css("html")).await.unwrap();
    c.find(Locator::Css(css))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    for _ in 0..200 {
        if old.tag_name().await.is_err() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("clicking {css} did not load a page");
}

async fn fill(c: &Client, css: &str, value: &str) {
    let e = c.find(Locator::Css(css)).await.unwrap();
    e.clear().await.unwrap();
    e.send_keys(value).await.unwrap();
}

async fn source(c: &Client) -> String {
    c.source().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_manages_keys_connectors_and_settings_and_watches_a_call() {
    let fake = FakeUpstream::start().await;
    fake.set_default(Reply::Text(vec!["ok"], (5, 1)));
    let mut vars = fake.env();
    // Served over plain HTTP here: cookies without the Secure flag.
    vars.push((
        "CALLSTREAM_SERVER__PUBLIC_URL",
        "http://localhost:8080".into(),
    ));
    let env = Env::with(vars);
    let server = env.serve();
    let org = env.cli_json(&["org", "create", "Acme Support"])["id"]
        .as_str()
        .unwrap()
        .to_owned();
    env.create_user(&org, "Admin@Acme.test", PASSWORD);
    let other = env.cli_json(&["org", "create", "Other"])["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (other_key, other_secret) = env.key(&other);
    let (driver, c) = browser().await;
    let base = server.url("/dashboard");

    // Sign in; a wrong password first.
    c.goto(&base).await.unwrap();
    assert!(c
        .current_url()
        .await
        .unwrap()
        .path()
        .ends_with("/dashboard/login"));
    shot(&c, "01-login").await;
    fill(&c, "#email", "admin@acme.test").await;
    fill(&c, "#password", "not the password").await;
    click(&c, "form button[type=submit]").await;
    assert!(text(&c, ".notice.error")
        .await
        .contains("Wrong email or password"));
    fill(&c, "#email", "admin@acme.test").await;
    fill(&c, "#password", PASSWORD).await;
    click(&c, "form button[type=submit]").await;
    assert_eq!(text(&c, "h1").await, "API keys");
    let cookie = c.get_named_cookie("cs_session").await.unwrap();
    assert_eq!(cookie.http_only(), Some(true));

    // Create a key: shown once, in full, with a copy button.
    fill(&c, "#key-name", "ci").await;
    click(&c, "form[action='/dashboard/keys/create'] button").await;
    let secret = text(&c, "#new-key").await;
    assert!(secret.starts_with("cs_"), "{secret}");
    assert!(c
        .find(Locator::Css("button.copy[data-copy='new-key']"))
        .await
        .is_ok());
    shot(&c, "02-keys-created").await;
    let account = reqwest::Client::new()
        .get(server.url("/api/account"))
        .header("X-API-Key", &secret)
        .send()
        .await
        .unwrap();
    assert_eq!(account.status(), 200);
    // The list shows the last four characters only.
    c.goto(&format!("{base}/keys")).await.unwrap();
    let page = source(&c).await;
    assert!(!page.contains(&secret));
    assert!(page.contains(&secret[secret.len() - 4..]));

    // Revoke it while a realtime chat session of the key is open: the session closes with 1011.
    let mut request = format!("ws://{}/api/llm/chat/realtime", server.addr)
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("x-api-key", secret.parse().unwrap());
    let (mut ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    click(&c, "form[action='/dashboard/keys/revoke'] button").await;
    assert!(text(&c, ".notice.ok").await.contains("revoked"));
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match ws.next().await {
                Some(Ok(Message::Close(f))) => return f.map(|f| u16::from(f.code)),
                Some(Ok(_)) => continue,
                _ => return None,
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(closed, Some(1011));
    assert!(source(&c).await.contains("revoked"));

    // Create a connector: client id, secret once, and the fixed URL, each with a copy button.
    c.goto(&format!("{base}/connectors")).await.unwrap();
    fill(&c, "#connector-name", "genesys").await;
    click(&c, "form[action='/dashboard/connectors/create'] button").await;
    let client_id = text(&c, "#client-id").await;
    let client_secret = text(&c, "#client-secret").await;
    assert_eq!(
        text(&c, "#ws-url").await,
        "ws://localhost:8080/api/callstream/ws"
    );
    for id in ["client-id", "client-secret", "ws-url"] {
        assert!(c
            .find(Locator::Css(&format!("button.copy[data-copy='{id}']")))
            .await
            .is_ok());
    }
    shot(&c, "03-connector-created").await;

    // Stream the Genesys call with those credentials and watch it on the live page.
    c.goto(&format!("{base}/calls")).await.unwrap();
    text(&c, "#no-calls").await;
    let call = env
        .command()
        .args([
            "call",
            callstream_actors::package_dir(env!("CARGO_MANIFEST_DIR"))
                .join("fixtures/genesys-test-transcript-connector.wav")
                .to_str()
                .unwrap(),
            "--url",
            &server.url(""),
            "--key",
            &client_id,
            "--secret",
            &client_secret,
            "--speed",
            "2",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let first = c
        .wait()
        .at_most(Duration::from_secs(60))
        .for_element(Locator::Css(".call li .text"))
        .await
        .expect("a transcript appears on the live page");
    assert!(!first.text().await.unwrap().is_empty());
    tokio::time::sleep(Duration::from_secs(4)).await;
    shot(&c, "04-live-call").await;
    // The live call links to its page in the call history, which fills in as it streams.
    let link = c
        .find(Locator::Css(".call a.record-link"))
        .await
        .unwrap()
        .attr("href")
        .await
        .unwrap()
        .expect("the live call links to its record");
    c.goto(&server.url(&link)).await.unwrap();
    assert!(c.find(Locator::Css("#record[data-live='1']")).await.is_ok());
    let lines_at_open = c
        .find_all(Locator::Css(".conversation li"))
        .await
        .unwrap()
        .len();
    let mut grew = false;
    for _ in 0..200 {
        let now = c
            .find_all(Locator::Css(".conversation li"))
            .await
            .unwrap()
            .len();
        if now > lines_at_open {
            grew = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(grew, "the call page fills in while the call streams");
    shot(&c, "05-call-page-live").await;
    let status = tokio::task::spawn_blocking(move || {
        let mut call = call;
        call.wait().unwrap()
    })
    .await
    .unwrap();
    assert!(status.success());
    // The call ended: the call page says so by itself, and the call leaves the live page.
    c.wait()
        .at_most(Duration::from_secs(20))
        .for_element(Locator::Css("#record[data-live='0']"))
        .await
        .expect("the call page sees the call end");
    assert!(text(&c, "#record-meta").await.contains("Ended"));
    let said = text(&c, ".conversation li .text").await;
    let customer_and_agent = source(&c).await;
    assert!(customer_and_agent.contains("class=\"customer\""));
    assert!(customer_and_agent.contains("class=\"agent\""));
    shot(&c, "06-call-page").await;
    c.goto(&format!("{base}/calls")).await.unwrap();
    text(&c, "#no-calls").await;

    // Usage moved: 70.8 s of audio is 1.18 audio-minutes.
    let used = env.audio_used(&org);
    assert!((used - 70.848).abs() < 0.01, "{used}");
    c.goto(&format!("{base}/usage")).await.unwrap();
    let audio = text(&c, "#quota-audio").await;
    assert!(audio.contains("1.18"), "{audio}");
    assert!(c.find(Locator::Css("#chart-audio svg rect")).await.is_ok());
    shot(&c, "07-usage").await;

    // Rotating the connector's secret shows a new one once; revoking ends the connector.
    c.goto(&format!("{base}/connectors")).await.unwrap();
    click(&c, "form[action='/dashboard/connectors/rotate'] button").await;
    let rotated = text(&c, "#client-secret").await;
    assert_ne!(rotated, client_secret);
    assert_eq!(text(&c, "#client-id").await, client_id);
    click(&c, "form[action='/dashboard/connectors/revoke'] button").await;
    assert!(text(&c, ".notice.ok").await.contains("revoked"));

    // System prompt and MCP server, with a connection test that lists the tools.
    let (mcp_url, _orders) = common::mcp::start().await;
    common::mcp::allow_loopback(&env, &org);
    c.goto(&format!("{base}/settings")).await.unwrap();
    fill(&c, "#system_prompt", "You are Acme's support assistant.").await;
    click(&c, "form[action='/dashboard/settings/prompt'] button").await;
    assert!(text(&c, ".notice.ok").await.contains("saved"));
    fill(&c, "#mcp-url", &mcp_url).await;
    fill(
        &c,
        "#mcp-headers",
        &format!("Authorization: Bearer {}", common::mcp::TOKEN),
    )
    .await;
    click(
        &c,
        "form[action='/dashboard/settings/mcp'] button:not([name])",
    )
    .await;
    assert!(text(&c, ".notice.ok").await.contains("saved"));
    click(&c, "form[action='/dashboard/settings/mcp-test'] button").await;
    assert!(text(&c, "#mcp-result").await.contains("get_order_status"));
    // The token is not shown again; saving without header lines keeps it.
    let page = source(&c).await;
    assert!(!page.contains(common::mcp::TOKEN));
    assert!(text(&c, "#mcp-stored").await.contains("Authorization"));
    click(
        &c,
        "form[action='/dashboard/settings/mcp'] button:not([name])",
    )
    .await;
    click(&c, "form[action='/dashboard/settings/mcp-test'] button").await;
    assert!(text(&c, "#mcp-result").await.contains("get_order_status"));
    shot(&c, "08-mcp-settings").await;
    let listed = env.cli_json(&["org", "list"]);
    let acme = listed["orgs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["id"] == org.as_str())
        .unwrap()
        .clone();
    assert_eq!(acme["has_system_prompt"], true);
    assert_eq!(acme["mcp_url"], mcp_url.as_str());
    // Call history: keep records 7 days (within the plan's 30) and redact. Longer than the
    // plan is refused (the form's field stops it in the browser; the server checks too).
    let longer = env.cli(&["org", "set-history", &org, "--retention-days", "400"]);
    assert!(!longer.status.success());
    assert!(String::from_utf8_lossy(&longer.stderr).contains("longer than the plan"));
    fill(&c, "#retention_days", "7").await;
    c.find(Locator::Css("#redact"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    click(&c, "form[action='/dashboard/settings/history'] button").await;
    assert!(text(&c, ".notice.ok").await.contains("saved"));
    assert!(text(&c, "#retention-now").await.contains("7 days"));
    assert!(c.find(Locator::Css("#redact:checked")).await.is_ok());
    let listed = env.cli_json(&["org", "list"]);
    let acme = listed["orgs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["id"] == org.as_str())
        .unwrap()
        .clone();
    assert_eq!(acme["retention_days"], 7);
    assert_eq!(acme["history"]["redact"], true);
    c.goto(&format!("{base}/settings#history-h")).await.unwrap();
    shot(&c, "08-history-settings").await;

    // A wrong header makes the test fail with the server's answer.
    fill(&c, "#mcp-headers", "Authorization: Bearer wrong").await;
    click(
        &c,
        "form[action='/dashboard/settings/mcp'] button:not([name])",
    )
    .await;
    click(&c, "form[action='/dashboard/settings/mcp-test'] button").await;
    assert!(text(&c, "#mcp-result h2").await.contains("failed"));

    // Another organisation's key cannot be revoked from this session, and forms without the
    // session's CSRF token are refused.
    let session = c.get_named_cookie("cs_session").await.unwrap();
    let page = source(&c).await;
    let csrf = page
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap()
        .to_owned();
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let post = |form: Vec<(&'static str, String)>| {
        http.post(server.url("/dashboard/keys/revoke"))
            .header("cookie", format!("cs_session={}", session.value()))
            .header("content-type", "application/x-www-form-urlencoded")
            // The values are hex and ids: nothing to escape.
            .body(
                form.iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join("&"),
            )
            .send()
    };
    let r = post(vec![("csrf", csrf.clone()), ("id", other_key.clone())])
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("No such record"));
    let keys = env.cli_json(&["key", "list", &other]);
    assert!(keys["keys"][0]["revoked_at"].is_null());
    let r = post(vec![("csrf", "forged".into()), ("id", other_key)])
        .await
        .unwrap();
    assert_eq!(r.status(), 403);

    // The call history lists the call; search by a word said, or by one never said.
    let record_id = link.rsplit('/').next().unwrap().to_owned();
    c.goto(&format!("{base}/history")).await.unwrap();
    assert!(source(&c).await.contains(&record_id));
    let word = said
        .split(|ch: char| !ch.is_alphanumeric())
        .filter(|w| w.len() >= 3)
        .max_by_key(|w| w.len())
        .expect("the first line has a word")
        .to_lowercase();
    fill(&c, "#q", &word).await;
    click(&c, "form.filters button").await;
    assert!(source(&c).await.contains(&record_id), "search for {word:?}");
    shot(&c, "09-history-search").await;
    fill(&c, "#q", "xylophonequartz").await;
    click(&c, "form.filters button").await;
    text(&c, "#no-records").await;
    // Exports carry the transcript, the session's organisation only.
    let export = |id: String, format: &'static str| {
        http.get(server.url(&format!(
            "/dashboard/history/{id}/transcript?format={format}"
        )))
        .header("cookie", format!("cs_session={}", session.value()))
        .send()
    };
    let vtt = export(record_id.clone(), "vtt").await.unwrap();
    assert_eq!(vtt.status(), 200);
    assert!(vtt.text().await.unwrap().starts_with("WEBVTT"));
    let txt = export(record_id.clone(), "txt")
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(txt.contains("Customer:") || txt.contains("Agent:"), "{txt}");
    // Another organisation's transcription is not found here, page or export.
    fake.set_default(Reply::Text(
        vec![r#"{"intents": [{"intent": "other", "confidence": "low"}], "reasoning": "A test tone."}"#],
        (40, 20),
    ));
    let (status, theirs) = common::upload(
        server.url("/api/transcribe"),
        &other_secret,
        "short.wav",
        std::fs::read(
            callstream_actors::package_dir(env!("CARGO_MANIFEST_DIR"))
                .join("fixtures/formats/pcm16-mono-16k.wav"),
        )
        .unwrap(),
    )
    .await;
    assert_eq!(status, 200, "{theirs}");
    let their_id = theirs["id"]
        .as_str()
        .expect("the file was archived")
        .to_owned();
    assert_eq!(export(their_id.clone(), "txt").await.unwrap().status(), 404);
    let page = http
        .get(server.url(&format!("/dashboard/history/{their_id}")))
        .header("cookie", format!("cs_session={}", session.value()))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 404);
    // Erasure asks for confirmation, then the record is gone.
    c.goto(&server.url(&link)).await.unwrap();
    c.find(Locator::Css("input[name=confirm]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    click(&c, "form[action='/dashboard/history/delete'] button").await;
    assert!(text(&c, ".notice.ok").await.contains("erased"));
    assert!(!source(&c)
        .await
        .contains(&format!("/dashboard/history/{record_id}\"")));
    assert_eq!(
        export(record_id.clone(), "json").await.unwrap().status(),
        404
    );

    // Sign out: the session no longer opens pages.
    click(&c, "form[action='/dashboard/logout'] button").await;
    assert!(c
        .current_url()
        .await
        .unwrap()
        .path()
        .ends_with("/dashboard/login"));
    let r = http
        .get(server.url("/dashboard/keys"))
        .header("cookie", format!("cs_session={}", session.value()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    c.close().await.unwrap();
    drop(driver);
}
