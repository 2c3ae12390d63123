//! Two real instances of the service on loopback sharing one real PostgreSQL (a throw-away
//! cluster): records, sessions, nonces, rate limits and quotas are one across them; a
//! revocation on one ends a call on the other; one dashboard shows the calls of both; a
//! draining instance refuses new calls while its call completes and is billed.

mod common;
#[path = "../src/store/testpg.rs"]
mod testpg;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use futures_util::StreamExt;
use serde_json::{json, Value};

use callstream_actors::call::{QUOTA_INFO, REVOKED_INFO};
use common::audiohook::{request, signed_headers_at};
use common::calls::{real_time_call, stream_call};
use common::dashboard::{form_body, session_cookie, user_and_client};
use common::upstream::{FakeUpstream, Reply};
use common::{Env, Server};

/// What clients sign live-call requests over: the load balancer's address, the same for
/// every instance behind it.
const PUBLIC_AUTHORITY: &str = "calls.example.com";

/// Two instances on a new database, with `extra` settings; the language model is a scripted
/// upstream, so the instances load only the speech engine.
async fn two_instances(extra: &[(&'static str, &str)]) -> (FakeUpstream, Env, Server, Env, Server) {
    let fake = FakeUpstream::start().await;
    let url = testpg::Cluster::shared().fresh_database();
    let key = base64::engine::general_purpose::STANDARD.encode([7u8; 32]);
    let mut vars = fake.env();
    vars.extend([
        ("CALLSTREAM_STORAGE__BACKEND", "postgres".to_owned()),
        ("CALLSTREAM_STORAGE__POSTGRES_URL", url),
        ("CALLSTREAM_STORAGE__SECRET_KEY", key),
        (
            "CALLSTREAM_SERVER__PUBLIC_AUTHORITY",
            PUBLIC_AUTHORITY.to_owned(),
        ),
        ("CALLSTREAM_ASR__WORKERS", "1".to_owned()),
    ]);
    vars.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
    let (env_a, env_b) = (Env::with(vars.clone()), Env::with(vars));
    let (a, b) = (env_a.serve(), env_b.serve());
    (fake, env_a, a, env_b, b)
}

/// A signed upgrade request to `server`, signed over the public authority.
fn call_request(
    server: &Server,
    client_id: &str,
    secret: &str,
) -> tokio_tungstenite::tungstenite::handshake::client::Request {
    let headers = signed_headers_at(
        PUBLIC_AUTHORITY,
        client_id,
        secret,
        common::audiohook::now(),
    );
    request(server, &headers)
}

/// The value of the first `name="csrf"` field of a dashboard page.
fn csrf_of(page: &str) -> String {
    page.split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the page has a form")
        .to_owned()
}

/// Posts a dashboard form on `server` with the session `cookie`; the page answered.
async fn dashboard_post(
    client: &reqwest::Client,
    server: &Server,
    cookie: &str,
    path: &str,
    fields: &[(&str, &str)],
) -> String {
    let page = client
        .get(server.url("/dashboard/keys"))
        .header("cookie", cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let csrf = csrf_of(&page);
    let mut all = vec![("csrf", csrf.as_str())];
    all.extend_from_slice(fields);
    let resp = client
        .post(server.url(path))
        .header("cookie", cookie)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form_body(&all))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{path}");
    resp.text().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_sessions_and_the_rate_budget_are_one_across_instances() {
    let (_fake, env, a, _, b) = two_instances(&[]).await;
    let org = env.org_on_plan("Acme", "free");
    let client = user_and_client(&env, &org, "lead@example.com", "a long and good password");

    // Signed in on A: the same session opens B's dashboard.
    let cookie = session_cookie(&client, &a, "lead@example.com", "a long and good password").await;
    let on_b = client
        .get(b.url("/dashboard/keys"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(on_b.status(), 200, "B serves A's session");

    // A key created on A's dashboard works on B.
    let page = dashboard_post(
        &client,
        &a,
        &cookie,
        "/dashboard/keys/create",
        &[("name", "ci")],
    )
    .await;
    let secret = page
        .split("<code id=\"new-key\">")
        .nth(1)
        .and_then(|rest| rest.split('<').next())
        .expect("the new key is shown once")
        .to_owned();
    let http = reqwest::Client::new();
    let account = |server: &Server| {
        http.get(server.url("/api/account"))
            .header("X-API-Key", &secret)
            .send()
    };
    let resp = account(&b).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.json::<Value>().await.unwrap()["organisation"]["id"],
        org
    );

    // A burst split across A and B gets the key's 60 requests per minute once. One request
    // was spent above; the budget refills one a second, so a burst lasting `s` seconds may
    // get `s` more.
    let started = Instant::now();
    let burst = (0..120).map(|i| account(if i % 2 == 0 { &a } else { &b }));
    let statuses: Vec<(usize, u16)> = futures_util::future::join_all(burst)
        .await
        .into_iter()
        .enumerate()
        .map(|(i, r)| (i % 2, r.unwrap().status().as_u16()))
        .collect();
    let elapsed = started.elapsed().as_secs_f64();
    let ok = statuses.iter().filter(|(_, s)| *s == 200).count();
    let limited: Vec<usize> = statuses
        .iter()
        .filter(|(_, s)| *s == 429)
        .map(|(i, _)| *i)
        .collect();
    println!("{ok} of 120 allowed across two instances in {elapsed:.2} s");
    assert_eq!(ok + limited.len(), 120, "{statuses:?}");
    assert!(
        ok >= 59 && ok as f64 <= 59.0 + elapsed.ceil() + 1.0,
        "{ok} allowed"
    );
    assert!(
        limited.contains(&0) && limited.contains(&1),
        "both instances refuse once the shared budget is spent"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_nonce_and_a_revocation_reach_the_other_instance() {
    let (_fake, env, a, _, b) = two_instances(&[]).await;
    let org = env.org_on_plan("Acme", "team");
    let (client_id, secret) = env.connector(&org);

    // Accepted by A ...
    let headers = signed_headers_at(
        PUBLIC_AUTHORITY,
        &client_id,
        &secret,
        common::audiohook::now(),
    );
    let (mut first, _) = tokio_tungstenite::connect_async(request(&a, &headers))
        .await
        .expect("A accepts the signature");
    first.close(None).await.unwrap();
    // ... and the same signed request replayed to B is refused before any message.
    let (mut replay, _) = tokio_tungstenite::connect_async(request(&b, &headers))
        .await
        .unwrap();
    match replay.next().await {
        Some(Ok(tokio_tungstenite::tungstenite::Message::Close(Some(frame)))) => {
            assert_eq!(u16::from(frame.code), 4401)
        }
        other => panic!("expected close 4401, got {other:?}"),
    }

    // A call on B ends within 2 s of its connector being revoked on A's dashboard.
    let client = user_and_client(&env, &org, "lead@example.com", "a long and good password");
    let cookie = session_cookie(&client, &a, "lead@example.com", "a long and good password").await;
    let (call, sent) = real_time_call(call_request(&b, &client_id, &secret), 1_000).await;
    let at = Instant::now();
    dashboard_post(
        &client,
        &a,
        &cookie,
        "/dashboard/connectors/revoke",
        &[("id", &client_id)],
    )
    .await;
    let log = tokio::time::timeout(Duration::from_secs(30), call)
        .await
        .expect("the call ends")
        .unwrap();
    let (params, when) = log.disconnect.clone().expect("a disconnect");
    let took = when - at;
    println!("revoked on A: the call on B was disconnected {took:?} later");
    assert_eq!(
        params,
        json!({"reason": "unauthorized", "info": REVOKED_INFO})
    );
    assert!(took <= Duration::from_secs(2), "{took:?}");
    let streamed = sent.load(Ordering::SeqCst) as f64 / 1000.0;
    let used = env.audio_used(&org);
    assert!(
        used > 0.9 && used <= streamed,
        "{used} s billed of {streamed} s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dashboard_shows_the_calls_of_every_instance() {
    let (_fake, env, a, _, b) = two_instances(&[]).await;
    let org = env.org_on_plan("Acme", "team");
    let (client_id, secret) = env.connector(&org);
    let client = user_and_client(&env, &org, "lead@example.com", "a long and good password");
    let cookie = session_cookie(&client, &a, "lead@example.com", "a long and good password").await;

    let sent = Arc::new(AtomicU64::new(0));
    let call = tokio::spawn(stream_call(
        call_request(&b, &client_id, &secret),
        30,
        Duration::from_millis(100),
        sent.clone(),
    ));
    while sent.load(Ordering::SeqCst) < 500 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A runs no call, yet its live page lists B's ...
    let mut feed = client
        .get(a.url("/dashboard/calls/events"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(feed.status(), 200);
    let first = String::from_utf8(feed.chunk().await.unwrap().unwrap().to_vec()).unwrap();
    let snapshot: Value =
        serde_json::from_str(first.trim().strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(snapshot["type"], "snapshot");
    let calls = snapshot["calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{snapshot}");
    assert_eq!(calls[0]["channels"], json!(["external", "internal"]));
    let call_id = calls[0]["call_id"].as_str().unwrap().to_owned();
    let page = client
        .get(a.url("/dashboard/calls"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains(&call_id), "the calls page lists B's call");

    // ... and hears it end.
    let ended = tokio::time::timeout(Duration::from_secs(30), async {
        let mut seen = String::new();
        while let Ok(Some(chunk)) = feed.chunk().await {
            seen.push_str(&String::from_utf8_lossy(&chunk));
            if seen.contains("\"ended\"") && seen.contains(&call_id) {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(ended, Ok(true), "A's feed tells that B's call ended");
    let log = call.await.unwrap();
    assert_eq!(log.close, Some(1000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_instance_refuses_new_calls_while_its_call_completes_and_is_billed() {
    let (_fake, env, mut a, _, b) =
        two_instances(&[("CALLSTREAM_SERVER__DRAIN_TIMEOUT_MS", "60000")]).await;
    let org = env.org_on_plan("Acme", "team");
    let (client_id, secret) = env.connector(&org);
    let ready = |server: &Server| {
        let url = server.url("/readyz");
        async move {
            let r = reqwest::get(url).await.unwrap();
            let status = r.status().as_u16();
            let body = r.json::<Value>().await.unwrap();
            (status, body["status"].clone(), body["live_calls"].clone())
        }
    };
    assert_eq!(ready(&a).await, (200, json!("ready"), json!(0)));

    // A 6-second call on A; a second into it, A is told to stop.
    let sent = Arc::new(AtomicU64::new(0));
    let call = tokio::spawn(stream_call(
        call_request(&a, &client_id, &secret),
        60,
        Duration::from_millis(100),
        sent.clone(),
    ));
    while sent.load(Ordering::SeqCst) < 1_000 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    a.terminate();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The call still runs on A.
    assert_eq!(ready(&a).await, (503, json!("draining"), json!(1)));
    assert_eq!(ready(&b).await, (200, json!("ready"), json!(0)));
    // A new call is refused by A (the load balancer would send it to B, which takes it).
    match tokio_tungstenite::connect_async(call_request(&a, &client_id, &secret)).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            assert_eq!(resp.status(), 503);
            let body: Value = serde_json::from_slice(resp.body().as_deref().unwrap()).unwrap();
            assert_eq!(body["error"]["code"], "draining");
        }
        other => panic!("expected 503, got {other:?}"),
    }
    let sent_b = Arc::new(AtomicU64::new(0));
    let on_b = tokio::spawn(stream_call(
        call_request(&b, &client_id, &secret),
        5,
        Duration::from_millis(100),
        sent_b.clone(),
    ));
    assert_eq!(on_b.await.unwrap().close, Some(1000));

    // The call on A runs to its end, then A exits by itself.
    let log = tokio::time::timeout(Duration::from_secs(60), call)
        .await
        .expect("the call completes")
        .unwrap();
    assert!(log.disconnect.is_none(), "{log:?}");
    assert_eq!(log.close, Some(1000));
    let exit = tokio::task::block_in_place(|| a.wait_exit(Duration::from_secs(30)));
    assert!(exit.is_some_and(|s| s.success()), "{exit:?}");
    // Both calls are billed: A's 6 s and B's 0.5 s.
    let streamed = (sent.load(Ordering::SeqCst) + sent_b.load(Ordering::SeqCst)) as f64 / 1000.0;
    assert!((streamed - 6.5).abs() < 1e-9);
    assert!(
        (env.audio_used(&org) - streamed).abs() < 1e-9,
        "{} s billed",
        env.audio_used(&org)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_chats_and_calls_across_instances_never_pass_the_quota() {
    let (fake, env, a, _, b) = two_instances(&[
        ("CALLSTREAM_PLANS__TEAM__CHAT_TOKENS_PER_MONTH", "1500"),
        ("CALLSTREAM_PLANS__FREE__AUDIO_MINUTES_PER_MONTH", "1"),
    ])
    .await;
    // Each answer is 40 prompt tokens and up to 300 completion tokens.
    fake.set_default(Reply::Text(vec!["a", "b", "c"], (40, 300)));
    fake.set_delay(Duration::from_millis(300));
    let org = env.org_on_plan("Chatty", "team");
    let (_, secret) = env.key(&org);
    let client = reqwest::Client::new();
    let body = json!({"messages": [{"role": "user", "content": "Tell me a long story."}],
        "return_markdown": true, "max_tokens": 4096});
    let mut billed = 0;
    loop {
        let urls: Vec<String> = (0..10)
            .map(|i| {
                let server = if i % 2 == 0 { &a } else { &b };
                server.url("/api/llm/chat/completions")
            })
            .collect();
        let wave = urls
            .iter()
            .map(|url| common::post(&client, url, &secret, &body));
        let results = futures_util::future::join_all(wave).await;
        for (status, body) in &results {
            assert!(*status == 200 || *status == 402, "{status} {body}");
        }
        let answered: u64 = results
            .iter()
            .filter(|(s, _)| *s == 200)
            .map(|(_, b)| b["usage"]["total_tokens"].as_u64().unwrap())
            .sum();
        billed += answered;
        if answered == 0 {
            break;
        }
    }
    let used = env.cli_json(&["usage", &org])["chat_tokens"]["used"]
        .as_u64()
        .unwrap();
    println!("{used} of 1500 tokens used by chats on two instances");
    assert_eq!(used, billed);
    assert!(used <= 1500, "{used} tokens of a 1500-token quota");

    // Four calls at once, two per instance, each sending 45 s of audio far faster than real
    // time against one minute: together they get exactly the minute.
    let org = env.org_on_plan("Calls", "free");
    let (client_id, secret) = env.connector(&org);
    let calls = (0..4).map(|i| {
        let server = if i % 2 == 0 { &a } else { &b };
        stream_call(
            call_request(server, &client_id, &secret),
            450,
            Duration::from_millis(1),
            Arc::default(),
        )
    });
    let logs = futures_util::future::join_all(calls).await;
    let used = env.audio_used(&org);
    println!("{used} s of a 60 s quota used by calls on two instances");
    assert!((used - 60.0).abs() < 1e-9, "{used} s used of a 60 s quota");
    assert!(
        logs.iter().any(|l| l
            .disconnect
            .as_ref()
            .is_some_and(|(p, _)| p["info"] == QUOTA_INFO)),
        "{logs:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_installation_moves_from_sled_to_postgres() {
    // A single machine on sled, its key generated into its data directory.
    let fake = FakeUpstream::start().await;
    let single = Env::with(fake.env());
    let org = single.org_on_plan("Moving", "team");
    let (_, api_secret) = single.key(&org);
    let (client_id, client_secret) = single.connector(&org);

    // Copied into a new database, with the key the instances will share.
    let url = testpg::Cluster::shared().fresh_database();
    let key = base64::engine::general_purpose::STANDARD.encode([9u8; 32]);
    let mut shared = single.vars.clone();
    shared.retain(|(k, _)| !k.starts_with("CALLSTREAM_STORAGE__"));
    shared.extend([
        (
            "CALLSTREAM_STORAGE__DATA_DIR".to_owned(),
            single.dir.path().join("pg-data").display().to_string(),
        ),
        ("CALLSTREAM_STORAGE__SECRET_KEY".to_owned(), key),
    ]);
    let moved = Env {
        dir: tempfile::tempdir().unwrap(),
        vars: shared.clone(),
    };
    let from = format!("sled:{}", single.data_dir().display());
    let to = format!("postgres:{url}");
    let report = moved.cli_json(&["store", "copy", "--from", &from, "--to", &to]);
    assert_eq!(report["orgs"], 1, "{report}");
    assert_eq!(
        (report["api_keys"].as_u64(), report["connectors"].as_u64()),
        (Some(1), Some(1))
    );
    // A second copy is refused: the target is no longer empty.
    let again = moved.cli(&["store", "copy", "--from", &from, "--to", &to]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("not empty"));

    // An instance on the database serves the old key and the old connector's signatures.
    let mut on_pg = Env {
        dir: tempfile::tempdir().unwrap(),
        vars: shared,
    };
    on_pg.set("CALLSTREAM_STORAGE__BACKEND", "postgres");
    on_pg.set("CALLSTREAM_STORAGE__POSTGRES_URL", &url);
    on_pg.set("CALLSTREAM_SERVER__PUBLIC_AUTHORITY", PUBLIC_AUTHORITY);
    let server = on_pg.serve();
    let account = reqwest::Client::new()
        .get(server.url("/api/account"))
        .header("X-API-Key", &api_secret)
        .send()
        .await
        .unwrap();
    assert_eq!(account.status(), 200);
    let log = stream_call(
        call_request(&server, &client_id, &client_secret),
        10,
        Duration::from_millis(10),
        Arc::default(),
    )
    .await;
    assert_eq!(log.close, Some(1000), "{log:?}");
    assert!(log.disconnect.is_none(), "{log:?}");
    assert!((on_pg.audio_used(&org) - 1.0).abs() < 1e-9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_reaches_the_running_server_or_refuses_naming_both_stores() {
    let fake = FakeUpstream::start().await;
    let url = testpg::Cluster::shared().fresh_database();
    let key = base64::engine::general_purpose::STANDARD.encode([5u8; 32]);
    let mut vars = fake.env();
    vars.extend([
        ("CALLSTREAM_STORAGE__BACKEND", "postgres".to_owned()),
        ("CALLSTREAM_STORAGE__POSTGRES_URL", url.clone()),
        ("CALLSTREAM_STORAGE__SECRET_KEY", key),
        ("CALLSTREAM_ASR__WORKERS", "1".to_owned()),
    ]);
    let env = Env::with(vars);
    let server = env.serve();

    // Run without the server's storage settings: sled, in the same data directory. Refused,
    // naming both stores, and no sled database appears beside the server's socket.
    let mut on_sled = Env {
        dir: tempfile::tempdir().unwrap(),
        vars: env.vars.clone(),
    };
    on_sled.vars.retain(|(k, _)| {
        k == "CALLSTREAM_STORAGE__DATA_DIR" || !k.starts_with("CALLSTREAM_STORAGE__")
    });
    let refused = on_sled.cli(&["org", "create", "Lost"]);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        said.contains("postgres at 127.0.0.1") && said.contains("sled in"),
        "{said}"
    );
    assert!(!said.contains("password"), "{said}");
    assert!(!env
        .data_dir()
        .join(callstream::store::sled::DB_DIR)
        .exists());

    // Another PostgreSQL database than the server's: refused the same way.
    let other = testpg::Cluster::shared().fresh_database();
    let mut elsewhere = Env {
        dir: tempfile::tempdir().unwrap(),
        vars: env.vars.clone(),
    };
    elsewhere.set("CALLSTREAM_STORAGE__POSTGRES_URL", &other);
    let refused = elsewhere.cli(&["org", "list"]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("keeps its data in postgres"));

    // With the server's settings the CLI goes through its socket, and what it creates works
    // on the server.
    let org = env.cli_json(&["org", "create", "Found"]);
    let created = env.cli_json(&["key", "create", org["id"].as_str().unwrap()]);
    let account = reqwest::Client::new()
        .get(server.url("/api/account"))
        .header("X-API-Key", created["secret"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(account.status(), 200);
}

/// An upgrade to `path` on `server` with `headers`: the HTTP status it is answered with (101
/// when it is taken) and the socket, if any.
async fn upgrade(
    request: tokio_tungstenite::tungstenite::handshake::client::Request,
) -> (
    u16,
    Option<
        tokio_tungstenite::WebSocketStream<
            tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
        >,
    >,
) {
    match tokio_tungstenite::connect_async(request).await {
        Ok((ws, response)) => (response.status().as_u16(), Some(ws)),
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            (response.status().as_u16(), None)
        }
        Err(e) => panic!("upgrade failed: {e}"),
    }
}

/// A plan's caps hold over both instances together: realtime sessions and live calls open on
/// either count on the other, and keys and connectors added on either count on both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_organisations_caps_hold_over_every_instance() {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let (_fake, env_a, a, env_b, b) = two_instances(&[
        ("CALLSTREAM_PLANS__FREE__MAX_REALTIME_SESSIONS", "2"),
        ("CALLSTREAM_PLANS__FREE__MAX_LIVE_CALLS", "1"),
        ("CALLSTREAM_PLANS__FREE__MAX_API_KEYS", "3"),
        ("CALLSTREAM_PLANS__FREE__MAX_CONNECTORS", "1"),
    ])
    .await;
    let (org, _, secret) = env_a.org_with_key("Acme");
    let realtime = |server: &Server| {
        let mut req = server
            .url("/api/llm/chat/realtime")
            .replace("http://", "ws://")
            .into_client_request()
            .unwrap();
        req.headers_mut()
            .insert("x-api-key", secret.parse().unwrap());
        req
    };
    let (status, one) = upgrade(realtime(&a)).await;
    assert_eq!(status, 101);
    let (status, two) = upgrade(realtime(&b)).await;
    assert_eq!(status, 101);
    // Two open, one on each: a third is refused on either instance.
    assert_eq!(upgrade(realtime(&a)).await.0, 429);
    assert_eq!(upgrade(realtime(&b)).await.0, 429);
    // A session that closes frees its place for the other instance.
    drop(one);
    let mut taken = false;
    for _ in 0..100 {
        if let (101, Some(ws)) = upgrade(realtime(&b)).await {
            drop(ws);
            taken = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(taken, "the closed session's place never came free");
    drop(two);

    // One live call in all: the first takes it on A, the second is refused on B.
    let (client_id, client_secret) = env_a.connector(&org);
    let first = {
        let request = call_request(&a, &client_id, &client_secret);
        tokio::spawn(stream_call(
            request,
            30,
            Duration::from_millis(100),
            Arc::new(AtomicU64::new(0)),
        ))
    };
    // The first call has taken its place before the second asks.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let mut refused = false;
    for _ in 0..100 {
        let (status, ws) = upgrade(call_request(&b, &client_id, &client_secret)).await;
        drop(ws);
        if status == 429 {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(refused, "a second call was taken beside the first");
    first.await.unwrap();

    // Keys and connectors: three keys and one connector in all, whichever instance adds them.
    env_b.key(&org);
    env_a.key(&org);
    let over = env_b.cli(&["key", "create", &org]);
    assert!(!over.status.success());
    assert!(
        String::from_utf8_lossy(&over.stderr).contains("as many as its plan allows"),
        "{}",
        String::from_utf8_lossy(&over.stderr)
    );
    let over = env_b.cli(&["connector", "create", &org]);
    assert!(!over.status.success());
}
