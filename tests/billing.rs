//! Billing integrity against the real server and its real store: a `kill -9` loses at most
//! about a second of each call in progress; parallel chats, files and calls against a nearly
//! used-up quota never pass it; revoking a connector or deleting an organisation ends its
//! calls; SIGTERM with the dashboard's live page open exits and writes every call's usage.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use callstream_actors::call::{QUOTA_INFO, REVOKED_INFO, STOPPING_INFO};
use callstream_actors::usage::UsageSource;
use common::audiohook::{audiohook_request, metric};
use common::calls::{real_time_call, stream_call};
use common::upstream::{FakeUpstream, Reply};
use common::{usage_events, Env};

/// An organisation on `plan` with a connector: (org id, client id, secret).
fn connector(env: &Env, plan: &str) -> (String, String, String) {
    let org = env.org_on_plan("Acme", plan);
    let (client_id, secret) = env.connector(&org);
    (org, client_id, secret)
}

fn total(sent: &[Arc<AtomicU64>]) -> u64 {
    sent.iter().map(|s| s.load(Ordering::SeqCst)).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_loses_at_most_about_a_second_of_each_call() {
    let env = Env::new(&[]);
    let server = env.serve();
    let (org, client_id, secret) = connector(&env, "team");
    let sent: Vec<Arc<AtomicU64>> = (0..3).map(|_| Arc::default()).collect();
    let calls: Vec<_> = sent
        .iter()
        .map(|s| {
            let request = audiohook_request(&server, &client_id, &secret);
            tokio::spawn(stream_call(
                request,
                10_000,
                Duration::from_millis(100),
                s.clone(),
            ))
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(8)).await;
    let before_kill = total(&sent);
    server.kill();
    let after_kill = total(&sent);
    for call in calls {
        call.await.unwrap();
    }
    let server = env.serve();
    let used_ms = (env.audio_used(&org) * 1000.0).round() as u64;
    println!(
        "streamed {before_kill}-{after_kill} ms in 3 calls; {used_ms} ms billed after kill -9"
    );
    assert!(used_ms <= after_kill, "more billed than streamed");
    // The running totals are written every second: each call loses at most about that.
    assert!(
        used_ms + 3 * 1_500 >= before_kill,
        "{used_ms} ms billed of {before_kill} ms streamed"
    );
    server.stop();
    // One running-total row per call, written over in place.
    let events = usage_events(&env.data_dir(), &org);
    assert_eq!(events.len(), 3, "{events:?}");
    assert!(events.iter().all(|e| e.source == UsageSource::Callstream));
    let mut calls: Vec<_> = events.iter().map(|e| e.call_id.clone().unwrap()).collect();
    calls.dedup();
    assert_eq!(calls.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_chats_never_pass_the_token_quota() {
    let fake = FakeUpstream::start().await;
    // Each answer is 40 prompt tokens and up to 300 completion tokens.
    fake.set_default(Reply::Text(vec!["a", "b", "c"], (40, 300)));
    fake.set_delay(Duration::from_millis(300));
    let mut extra = fake.env();
    extra.push(("CALLSTREAM_PLANS__FREE__CHAT_TOKENS_PER_MONTH", "10".into()));
    extra.push((
        "CALLSTREAM_PLANS__TEAM__CHAT_TOKENS_PER_MONTH",
        "1500".into(),
    ));
    let env = Env::with(extra);
    let server = env.serve();
    let client = reqwest::Client::new();
    let body = json!({"messages": [{"role": "user", "content": "Tell me a long story."}],
        "return_markdown": true, "max_tokens": 4096});
    let wave = |secret: String| {
        let (client, url, body) = (
            client.clone(),
            server.url("/api/llm/chat/completions"),
            body.clone(),
        );
        async move {
            let requests = (0..9).map(|_| common::post(&client, &url, &secret, &body));
            futures_util::future::join_all(requests).await
        }
    };
    let used = |org: &str| {
        env.cli_json(&["usage", org])["chat_tokens"]["used"]
            .as_u64()
            .unwrap()
    };

    // Ten tokens left: not even a prompt fits; nine parallel chats are all refused.
    let (poor, _, secret) = env.org_with_key("Poor");
    for (status, body) in wave(secret).await {
        assert_eq!(status, 402, "{body}");
        assert_eq!(body["error"]["code"], "quota_exhausted", "{body}");
    }
    assert_eq!(used(&poor), 0);

    // 1,500 tokens: waves of nine parallel chats until none gets through.
    let org = env.org_on_plan("Rich", "team");
    let (_, secret) = env.key(&org);
    let mut answered = 0;
    let mut billed = 0;
    loop {
        let results = wave(secret.clone()).await;
        let ok: Vec<&Value> = results
            .iter()
            .filter(|(s, _)| *s == 200)
            .map(|(_, b)| b)
            .collect();
        for (status, body) in &results {
            assert!(*status == 200 || *status == 402, "{status} {body}");
        }
        billed += ok
            .iter()
            .map(|b| b["usage"]["total_tokens"].as_u64().unwrap())
            .sum::<u64>();
        answered += ok.len();
        if ok.is_empty() {
            break;
        }
    }
    let used = used(&org);
    println!("{answered} chats answered, {used} of 1500 tokens used");
    assert!(answered >= 2, "the quota served more than one chat");
    assert_eq!(used, billed, "the ledger has what the answers report");
    assert!(used <= 1500, "{used} tokens used of a 1500-token quota");
}

/// A WAV file of `secs` seconds of 8 kHz 16-bit mono silence.
fn silent_wav(secs: u32) -> Vec<u8> {
    common::wav(1, 1, 8000, 16, &vec![0u8; (secs * 8000 * 2) as usize])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_files_and_calls_never_pass_the_audio_quota() {
    // Six files at once: the plan's cap on files in progress is raised past them, so only the
    // audio quota decides.
    let env = Env::new(&[
        ("CALLSTREAM_PLANS__FREE__AUDIO_MINUTES_PER_MONTH", "1"),
        ("CALLSTREAM_PLANS__FREE__MAX_FILE_TRANSCRIPTIONS", "8"),
    ]);
    let server = env.serve();

    // Six 20-second files at once against one minute: three fit, whatever the order.
    let (org, _, secret) = env.org_with_key("Files");
    let uploads = (0..6).map(|_| {
        common::upload(
            server.url("/api/transcribe"),
            &secret,
            "call.wav",
            silent_wav(20),
        )
    });
    let results = futures_util::future::join_all(uploads).await;
    let statuses: Vec<u16> = results.iter().map(|(s, _)| *s).collect();
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        3,
        "{results:?}"
    );
    for (status, body) in &results {
        if *status != 200 {
            assert_eq!(*status, 402, "{body}");
            assert_eq!(body["error"]["code"], "quota_exhausted", "{body}");
        }
    }
    assert!((env.audio_used(&org) - 60.0).abs() < 1e-9);

    // Three calls at once, each sending 45 s of audio far faster than real time, against one
    // minute: audio is served only under a lease, so together they get exactly the minute.
    let (org, client_id, secret) = connector(&env, "free");
    let sent: Vec<Arc<AtomicU64>> = (0..3).map(|_| Arc::default()).collect();
    let calls = sent.iter().map(|s| {
        let request = audiohook_request(&server, &client_id, &secret);
        stream_call(request, 450, Duration::from_millis(1), s.clone())
    });
    let logs = futures_util::future::join_all(calls).await;
    let used = env.audio_used(&org);
    println!("calls sent {} ms, {used} s billed: {logs:?}", total(&sent));
    assert!((used - 60.0).abs() < 1e-9, "{used} s used of a 60 s quota");
    assert!(
        logs.iter().any(|l| l
            .disconnect
            .as_ref()
            .is_some_and(|(p, _)| p["info"] == QUOTA_INFO)),
        "a call was disconnected for the quota"
    );
    assert!(logs.iter().all(|l| l.close == Some(1000)), "{logs:?}");
}

/// `secs` seconds of a 300 Hz tone as a 16 kHz FLAC (written by sox), its STREAMINFO
/// declaring one second.
fn flac_declaring_one_second(env: &Env, secs: u32) -> Vec<u8> {
    let path = env.dir.path().join(format!("tone-{secs}.flac"));
    let made = std::process::Command::new("sox")
        .args(["-n", "-r", "16000", "-c", "1", "-b", "16"])
        .arg(&path)
        .args(["synth", &secs.to_string(), "sine", "300"])
        .status()
        .unwrap();
    assert!(made.success());
    let mut f = std::fs::read(&path).unwrap();
    assert_eq!(&f[..4], b"fLaC");
    // STREAMINFO's 36-bit total sample count: the low nibble of byte 21 and bytes 22-25.
    f[21] &= 0xF0;
    f[22..26].copy_from_slice(&16_000u32.to_be_bytes());
    f
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_that_declares_less_than_it_holds_is_billed_for_what_it_holds() {
    let env = Env::new(&[("CALLSTREAM_PLANS__FREE__AUDIO_MINUTES_PER_MONTH", "1")]);
    let server = env.serve();
    let (org, _, secret) = env.org_with_key("Liar");
    let upload = |bytes| common::upload(server.url("/api/transcribe"), &secret, "x.flac", bytes);

    // Ninety seconds declared as one, against a minute: refused before any speech work.
    let (status, body) = upload(flac_declaring_one_second(&env, 90)).await;
    assert_eq!(status, 402, "{body}");
    assert_eq!(body["error"]["code"], "quota_exhausted", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("the file is 1.50 audio-minutes"),
        "{body}"
    );
    assert_eq!(env.audio_used(&org), 0.0);

    // Thirty seconds declared as one: transcribed and billed for the thirty.
    let (status, body) = upload(flac_declaring_one_second(&env, 30)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["duration"], 30.0, "{body}");
    assert_eq!(env.audio_used(&org), 30.0);

    // Two more such files: the first fits the thirty seconds left, the second does not.
    let (first, _) = upload(flac_declaring_one_second(&env, 30)).await;
    let (second, body) = upload(flac_declaring_one_second(&env, 30)).await;
    assert_eq!((first, second), (200, 402), "{body}");
    assert_eq!(env.audio_used(&org), 60.0);
}

/// Tokens used by `org` this month.
fn tokens_used(env: &Env, org: &str) -> u64 {
    env.cli_json(&["usage", org])["chat_tokens"]["used"]
        .as_u64()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_work_that_fails_after_it_ran_is_billed_for_what_it_used() {
    let fake = FakeUpstream::start().await;
    let env = Env::with(fake.env());
    let server = env.serve();
    let client = reqwest::Client::new();
    let url = server.url("/api/llm/chat/completions");
    let ask = json!({"messages": [{"role": "user", "content": "Where is my order 1?"}], "return_markdown": true});

    // A tool loop whose second model call fails: the first call's tokens are billed.
    let (mcp_url, orders) = common::mcp::start().await;
    let (org, _, key) = env.org_with_key("ToolLoop");
    common::mcp::attach(&env, &org, &mcp_url);
    fake.push(Reply::ToolCall(
        "get_order_status",
        json!({"order_id": "1"}),
        (30, 8),
    ));
    fake.push(Reply::Status(500, "{\"error\": {\"message\": \"boom\"}}"));
    let (status, body) = common::post(&client, &url, &key, &ask).await;
    assert_eq!(status, 502, "{body}");
    assert!(orders.calls.load(Ordering::SeqCst) >= 1);
    assert_eq!(tokens_used(&env, &org), 38);

    // Text streamed, then the provider's stream breaks: the streamed text is billed.
    let (org, _, key) = env.org_with_key("Streamed");
    fake.push(Reply::Cut(vec![
        "Your order ",
        "left the ",
        "warehouse ",
        "on Monday",
    ]));
    let mut streaming = ask.clone();
    streaming["stream"] = json!(true);
    let resp = client
        .post(&url)
        .header("x-api-key", &key)
        .json(&streaming)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let events = resp.text().await.unwrap();
    assert!(events.contains("warehouse"), "{events}");
    assert!(events.contains("\"error\""), "{events}");
    let streamed = tokens_used(&env, &org);
    assert!(
        streamed >= 4,
        "{streamed} tokens billed for 4 pieces streamed"
    );

    // The same on a whole (not streamed) answer: nothing reaches the client, but the model
    // ran and is billed as far as it got.
    let (org, _, key) = env.org_with_key("Whole");
    fake.push(Reply::Cut(vec!["Your order ", "left the "]));
    let (status, body) = common::post(&client, &url, &key, &ask).await;
    assert_eq!(status, 502, "{body}");
    assert!(tokens_used(&env, &org) >= 2);

    // A client that hangs up before the answer: what was generated is billed.
    let (org, _, key) = env.org_with_key("HungUp");
    // Slower than the client waits, quicker than the service waits for the provider (1.5 s).
    fake.set_delay(Duration::from_millis(1000));
    let hung_up = tokio::time::timeout(
        Duration::from_millis(500),
        client
            .post(&url)
            .header("x-api-key", &key)
            .json(&ask)
            .send(),
    )
    .await;
    assert!(hung_up.is_err(), "answered before the client left");
    let deadline = Instant::now() + Duration::from_secs(20);
    while tokens_used(&env, &org) == 0 {
        assert!(
            Instant::now() < deadline,
            "the abandoned turn was never billed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    fake.set_delay(Duration::ZERO);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_the_connector_or_deleting_the_organisation_ends_its_calls() {
    let env = Env::new(&[]);
    let server = env.serve();
    for how in ["revoke the connector", "delete the organisation"] {
        let (org, client_id, secret) = connector(&env, "team");
        let (call, sent) =
            real_time_call(audiohook_request(&server, &client_id, &secret), 1_000).await;
        let at = Instant::now();
        if how == "revoke the connector" {
            env.cli_json(&["connector", "revoke", &client_id]);
        } else {
            env.cli_json(&["org", "delete", &org]);
        }
        let log = tokio::time::timeout(Duration::from_secs(30), call)
            .await
            .expect("the call ends")
            .unwrap();
        let (params, when) = log.disconnect.clone().expect("a disconnect");
        println!("{how}: disconnect {:?} after the change", when - at);
        assert_eq!(
            params,
            json!({"reason": "unauthorized", "info": REVOKED_INFO})
        );
        assert_eq!(log.close, Some(1000));
        let streamed = sent.load(Ordering::SeqCst) as f64 / 1000.0;
        let used = env.audio_used(&org);
        assert!(
            used > 0.9 && used <= streamed,
            "{used} s billed of {streamed} s"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_an_open_live_page_exits_and_writes_every_call() {
    let env = Env::new(&[]);
    let server = env.serve();
    let (org, client_id, secret) = connector(&env, "team");
    let client = common::dashboard::user_and_client(
        &env,
        &org,
        "lead@example.com",
        "a long and good password",
    );
    let cookie = common::dashboard::session_cookie(
        &client,
        &server,
        "lead@example.com",
        "a long and good password",
    )
    .await;
    let mut live = client
        .get(server.url("/dashboard/calls/events"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(live.status(), 200);
    let first = live.chunk().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("snapshot"));

    let (call, sent) = real_time_call(audiohook_request(&server, &client_id, &secret), 2_000).await;
    let stopping = Instant::now();
    let stopped = tokio::task::spawn_blocking(move || server.stop());
    // The live page's stream ends, so the stop is not held up by it.
    let feed_ended = tokio::time::timeout(Duration::from_secs(30), async {
        while let Ok(Some(_)) = live.chunk().await {}
    })
    .await;
    assert!(feed_ended.is_ok(), "the live feed did not end");
    tokio::time::timeout(Duration::from_secs(30), stopped)
        .await
        .expect("the server exits within its shutdown bound")
        .unwrap();
    println!("stopped {:?} after SIGTERM", stopping.elapsed());
    let log = call.await.unwrap();
    let (params, _) = log.disconnect.clone().expect("a disconnect");
    assert_eq!(params, json!({"reason": "error", "info": STOPPING_INFO}));

    // Every second the call streamed before the disconnect is in the ledger.
    let streamed = sent.load(Ordering::SeqCst);
    let events = usage_events(&env.data_dir(), &org);
    let used: u64 = events.iter().map(|e| e.amount).sum();
    println!("streamed {streamed} ms, billed {used} ms");
    assert!(
        used <= streamed && used + 300 >= streamed,
        "{used} ms billed of {streamed} ms"
    );
}

/// The data chunk of a WAV file.
fn wav_data(bytes: &[u8]) -> &[u8] {
    let at = bytes
        .windows(4)
        .position(|w| w == b"data")
        .expect("a data chunk");
    &bytes[at + 8..]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_whose_client_leaves_stops_its_speech_work_and_bills_nothing() {
    // The intent analysis comes from a scripted provider: this test is about the speech work.
    let fake = FakeUpstream::start().await;
    fake.set_default(Reply::Least((10, 2)));
    // One decode per utterance (no packing into shared windows), so the count of decodes
    // measures how far into the file the work got.
    let mut vars = fake.env();
    vars.push(("CALLSTREAM_TRANSCRIBE__PACK_WINDOW_MS", "0".into()));
    let env = Env::with(vars);
    let server = env.serve();
    let (org, _, key) = env.org_with_key("Uploads");
    let url = server.url("/api/transcribe");
    let call = std::fs::read(
        callstream_actors::package_dir(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/genesys-test-transcript-connector.wav"),
    )
    .unwrap();
    let utterances = || metric(&server, "callstream_asr_utterances_total");

    // The whole 70.8 s call, for the number of utterances it takes.
    let before = utterances().await;
    let (status, body) = common::upload(url.clone(), &key, "call.wav", call.clone()).await;
    assert_eq!(status, 200, "{body}");
    let per_call = utterances().await - before;
    assert!(per_call >= 4.0, "{per_call}");
    assert!((env.audio_used(&org) - 70.848).abs() < 1e-9);

    // Six times the call (stereo mu-law, 7 minutes): the client leaves once work has begun.
    let data = wav_data(&call).repeat(6);
    let long = common::wav(7, 2, 8000, 8, &data);
    let before = utterances().await;
    let upload = tokio::spawn({
        let (url, key) = (url.clone(), key.clone());
        async move { common::upload(url, &key, "long.wav", long).await }
    });
    while utterances().await == before {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    upload.abort();
    // The work stops: the count settles (queued utterances are skipped, not decoded).
    let mut last = utterances().await;
    let mut steady = 0;
    while steady < 6 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = utterances().await;
        steady = if now == last { steady + 1 } else { 0 };
        last = now;
    }
    let decoded = last - before;
    println!(
        "{decoded} utterances decoded of about {} in the whole upload",
        6.0 * per_call
    );
    assert!(
        decoded < 3.0 * per_call,
        "{decoded} utterances decoded after the client left; the whole file is about {}",
        6.0 * per_call
    );
    assert!(
        (env.audio_used(&org) - 70.848).abs() < 1e-9,
        "the abandoned upload bills nothing"
    );
}
