//! The call history end to end, on the real speech engine and the embedded store: a live call
//! (the Genesys recording through `callstream call`) and a file are archived as they go, listed,
//! searched, filtered, exported and erased through the API, always within the key's
//! organisation; and redaction, with an organisation-wide switch and a per-connector override,
//! on a card number spoken by espeak-ng, in what is sent, stored and analysed.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use common::upstream::{FakeUpstream, Reply};
use common::{Env, Server};

const INTENT: &str = r#"{"intents": [{"intent": "order_status", "confidence": "high"}], "reasoning": "The caller asks about an order."}"#;

fn fixture(rel: &str) -> PathBuf {
    callstream_actors::package_dir(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(rel)
}

/// Lines of `callstream call --json` (one server message each).
fn messages(stdout: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The transcripts a call received.
fn transcripts(messages: &[Value]) -> Vec<String> {
    messages
        .iter()
        .filter(|m| m["type"] == "event")
        .flat_map(|m| {
            m["parameters"]["entities"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|e| {
            e["data"]["alternatives"][0]["interpretations"][0]["transcript"]
                .as_str()
                .map(str::to_owned)
        })
        .collect()
}

/// Streams `file` as a call with a connector's credentials; the server's messages.
fn call(
    env: &Env,
    server: &Server,
    file: &Path,
    client: &(String, String),
    extra: &[&str],
) -> Vec<Value> {
    let url = server.url("");
    let mut args = vec![
        "--json",
        "call",
        file.to_str().unwrap(),
        "--url",
        &url,
        "--key",
        &client.0,
        "--secret",
        &client.1,
    ];
    args.extend_from_slice(extra);
    let out = env.cli(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    messages(&out.stdout)
}

async fn get(http: &reqwest::Client, server: &Server, path: &str, key: &str) -> (u16, String) {
    let r = http
        .get(server.url(path))
        .header("X-API-Key", key)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.text().await.unwrap())
}

async fn get_json(http: &reqwest::Client, server: &Server, path: &str, key: &str) -> (u16, Value) {
    let (status, body) = get(http, server, path, key).await;
    (
        status,
        serde_json::from_str(&body).unwrap_or_else(|_| panic!("{path}: not JSON: {body}")),
    )
}

async fn delete(http: &reqwest::Client, server: &Server, path: &str, key: &str) -> u16 {
    http.delete(server.url(path))
        .header("X-API-Key", key)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// The organisation's calls, once the newest has ended (the archive is written as the call
/// goes, by a writer of its own).
async fn ended_calls(http: &reqwest::Client, server: &Server, key: &str) -> Vec<Value> {
    for _ in 0..100 {
        let (status, page) = get_json(http, server, "/api/calls", key).await;
        assert_eq!(status, 200, "{page}");
        let calls = page["calls"].as_array().unwrap().clone();
        if calls.first().is_some_and(|c| !c["ended_at"].is_null()) {
            return calls;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the call did not end in the archive within 10 s");
}

/// The longest run of digits in `text`.
fn longest_digits(text: &str) -> usize {
    text.split(|c: char| !c.is_ascii_digit())
        .map(str::len)
        .max()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_and_files_are_archived_searched_exported_and_erased_per_organisation() {
    let fake = FakeUpstream::start().await;
    fake.set_default(Reply::Text(vec![INTENT], (40, 20)));
    let env = Env::with(fake.env());
    let server = env.serve();
    let http = reqwest::Client::new();
    let (org, _, key) = env.org_with_key("Acme");
    let connector = env.connector(&org);
    let (_, _, their_key) = env.org_with_key("Other");

    // A live call, with intent asked for on the way.
    let received = call(
        &env,
        &server,
        &fixture("genesys-test-transcript-connector.wav"),
        &connector,
        &["--speed", "3", "--analyze-every", "8"],
    );
    let sent = transcripts(&received);
    assert!(sent.len() >= 4, "{sent:?}");
    let calls = ended_calls(&http, &server, &key).await;
    assert_eq!(calls.len(), 1, "{calls:?}");
    let head = &calls[0];
    let id = head["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("call_"), "{id}");
    assert_eq!(head["connector"], connector.0.as_str());
    assert_eq!(head["ani"], "+15550100");
    assert_eq!(head["dnis"], "+15550199");
    assert_eq!(head["language"], "en-US");
    assert!(head["conversation_id"].is_string());
    assert!(head["close_reason"].is_string());
    assert!(head.get("org_id").is_none(), "the owner is not shown");
    // The call's 70.8 s, as billing counted them.
    let billed = head["billed_ms"].as_u64().unwrap();
    assert!((70_000..=71_500).contains(&billed), "{billed}");

    // The record: every final transcript sent, in time order, and the intent updates.
    let (status, record) = get_json(&http, &server, &format!("/api/calls/{id}"), &key).await;
    assert_eq!(status, 200);
    let lines = record["transcript"].as_array().unwrap();
    let stored: Vec<&str> = lines.iter().map(|l| l["text"].as_str().unwrap()).collect();
    let mut sorted_sent = sent.clone();
    sorted_sent.sort();
    let mut sorted_stored: Vec<String> = stored.iter().map(|s| (*s).to_owned()).collect();
    sorted_stored.sort();
    assert_eq!(
        sorted_stored, sorted_sent,
        "the archive holds what was sent"
    );
    let offsets: Vec<f64> = lines
        .iter()
        .map(|l| l["offset"].as_f64().unwrap())
        .collect();
    assert!(offsets.windows(2).all(|w| w[0] <= w[1]), "{offsets:?}");
    for l in lines {
        assert!(l["duration"].as_f64().unwrap() > 0.0);
        let confidence = l["confidence"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&confidence));
        assert!(l["channel"].as_u64().unwrap() < 2);
    }
    let intents = record["intents"].as_array().unwrap();
    assert!(!intents.is_empty(), "analyze every 8 s of a 70 s call");
    // The first may come before anything was said ("other"); the model's answer follows.
    let last = intents.last().unwrap();
    assert_eq!(last["result"]["intents"][0]["intent"], "order_status");
    assert!(last["at_ms"].as_i64().unwrap() >= intents[0]["at_ms"].as_i64().unwrap());
    assert_eq!(record["intent"], "order_status");

    // Search: a word said finds it, a word never said does not; filters narrow.
    let word = stored
        .iter()
        .flat_map(|t| t.split(|c: char| !c.is_alphanumeric()))
        .filter(|w| w.len() >= 5)
        .max_by_key(|w| w.len())
        .unwrap()
        .to_uppercase();
    let found = |query: String| {
        let http = http.clone();
        let key = key.clone();
        let server_url = server.url(&format!("/api/calls?{query}"));
        async move {
            let r = http
                .get(server_url)
                .header("X-API-Key", &key)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            let page: Value = r.json().await.unwrap();
            page["calls"].as_array().unwrap().len()
        }
    };
    assert_eq!(found(format!("q={word}")).await, 1, "search for {word}");
    assert_eq!(found("q=xylophonequartz".into()).await, 0);
    assert_eq!(found(format!("connector={}", connector.0)).await, 1);
    assert_eq!(found("connector=cc_someone_else".into()).await, 0);
    assert_eq!(found("intent=order_status".into()).await, 1);
    assert_eq!(found("intent=cancellation".into()).await, 0);
    assert_eq!(found("from=2099-01-01T00:00:00Z".into()).await, 0);
    assert_eq!(
        found("to=2099-01-01T00:00:00Z&from=2020-01-01T00:00:00Z".into()).await,
        1
    );
    let (status, bad) = get_json(&http, &server, "/api/calls?from=yesterday", &key).await;
    assert_eq!(status, 400, "{bad}");
    let (status, _) = get_json(&http, &server, "/api/calls?cursor=forged", &key).await;
    assert_eq!(status, 400);

    // Exports: text as speaker-labelled lines, SRT and WebVTT with cue times.
    let (status, txt) = get(
        &http,
        &server,
        &format!("/api/calls/{id}/transcript?format=txt"),
        &key,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(txt.lines().count(), lines.len());
    assert!(
        txt.lines()
            .all(|l| l.starts_with('[') && l.contains("]: ") || l.contains("] ")),
        "{txt}"
    );
    let (_, srt) = get(
        &http,
        &server,
        &format!("/api/calls/{id}/transcript?format=srt"),
        &key,
    )
    .await;
    assert!(srt.starts_with("1\n00:00:"), "{srt}");
    assert!(srt.contains(" --> "));
    let (_, vtt) = get(
        &http,
        &server,
        &format!("/api/calls/{id}/transcript?format=vtt"),
        &key,
    )
    .await;
    assert!(vtt.starts_with("WEBVTT\n\n"), "{vtt}");
    assert_eq!(vtt.matches(" --> ").count(), lines.len());
    let (_, json) = get_json(
        &http,
        &server,
        &format!("/api/calls/{id}/transcript?format=json"),
        &key,
    )
    .await;
    assert_eq!(json["transcript"].as_array().unwrap().len(), lines.len());
    let (status, _) = get_json(
        &http,
        &server,
        &format!("/api/calls/{id}/transcript?format=doc"),
        &key,
    )
    .await;
    assert_eq!(status, 400);

    // A file is archived too, under the id the response gives.
    let (status, file) = common::upload(
        server.url("/api/transcribe"),
        &key,
        "greeting.wav",
        std::fs::read(fixture("formats/pcm16-mono-16k.wav")).unwrap(),
    )
    .await;
    assert_eq!(status, 200, "{file}");
    let file_id = file["id"]
        .as_str()
        .expect("the response names its record")
        .to_owned();
    assert!(file_id.starts_with("tr_"));
    let (status, stored_file) = get_json(
        &http,
        &server,
        &format!("/api/transcriptions/{file_id}"),
        &key,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(stored_file["file_name"], "greeting.wav");
    assert_eq!(
        stored_file["transcript"].as_array().unwrap().len(),
        file["segments"].as_array().unwrap().len()
    );
    assert_eq!(
        stored_file["analyses"]["intent"]["intents"][0]["intent"],
        "order_status"
    );
    let (_, files) = get_json(&http, &server, "/api/transcriptions", &key).await;
    assert_eq!(files["transcriptions"][0]["id"], file_id.as_str());
    assert!(files["next_cursor"].is_null());

    // Another organisation sees none of it: every route answers 404 (or an empty list).
    let (_, theirs) = get_json(&http, &server, "/api/calls", &their_key).await;
    assert_eq!(theirs["calls"], serde_json::json!([]));
    let (_, theirs) = get_json(&http, &server, "/api/transcriptions", &their_key).await;
    assert_eq!(theirs["transcriptions"], serde_json::json!([]));
    for path in [
        format!("/api/calls/{id}"),
        format!("/api/calls/{id}/transcript?format=txt"),
        format!("/api/transcriptions/{file_id}"),
        format!("/api/transcriptions/{file_id}/transcript"),
        // The other kind's route does not serve a record either.
        format!("/api/transcriptions/{id}"),
        format!("/api/calls/{file_id}"),
    ] {
        let key_for = if path.contains(&id) && path.starts_with("/api/transcriptions")
            || path.contains(&file_id) && path.starts_with("/api/calls")
        {
            &key
        } else {
            &their_key
        };
        let (status, body) = get_json(&http, &server, &path, key_for).await;
        assert_eq!(status, 404, "{path}: {body}");
        assert_eq!(body["error"]["code"], "not_found", "{path}");
    }
    assert_eq!(
        delete(&http, &server, &format!("/api/calls/{id}"), &their_key).await,
        404
    );
    assert_eq!(
        delete(
            &http,
            &server,
            &format!("/api/transcriptions/{file_id}"),
            &their_key
        )
        .await,
        404
    );
    let anonymous = http.get(server.url("/api/calls")).send().await.unwrap();
    assert_eq!(anonymous.status(), 401);

    // Erasure: gone from the record, search and exports; a second delete finds nothing.
    assert_eq!(
        delete(&http, &server, &format!("/api/calls/{id}"), &key).await,
        204
    );
    let (status, _) = get_json(&http, &server, &format!("/api/calls/{id}"), &key).await;
    assert_eq!(status, 404);
    assert_eq!(found(format!("q={word}")).await, 0);
    assert_eq!(found(String::new()).await, 0);
    let (status, _) = get(&http, &server, &format!("/api/calls/{id}/transcript"), &key).await;
    assert_eq!(status, 404);
    assert_eq!(
        delete(&http, &server, &format!("/api/calls/{id}"), &key).await,
        404
    );
    assert_eq!(
        delete(
            &http,
            &server,
            &format!("/api/transcriptions/{file_id}"),
            &key
        )
        .await,
        204
    );
    let (_, files) = get_json(&http, &server, "/api/transcriptions", &key).await;
    assert_eq!(files["transcriptions"], serde_json::json!([]));
}

/// A card number spoken by espeak-ng, on an 8 kHz line.
fn spoken_card(dir: &Path) -> PathBuf {
    let voice = dir.join("card-22k.wav");
    let line = dir.join("card.wav");
    let status = Command::new("espeak-ng")
        .args(["-v", "en-us", "-s", "140", "-w"])
        .arg(&voice)
        .arg("Hello, I would like to pay my bill. My card number is 4 1 1 1, 1 1 1 1, 1 1 1 1, 1 1 1 1. The expiry is next year.")
        .status()
        .expect("espeak-ng runs (scripts/setup.sh installs it)");
    assert!(status.success());
    let status = Command::new("sox")
        .arg(&voice)
        .args(["-r", "8000", "-c", "1"])
        .arg(&line)
        .status()
        .expect("sox runs (scripts/setup.sh installs it)");
    assert!(status.success());
    line
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spoken_card_number_is_redacted_where_asked_in_what_is_sent_stored_and_analysed() {
    let fake = FakeUpstream::start().await;
    fake.set_default(Reply::Text(vec![INTENT], (40, 20)));
    let env = Env::with(fake.env());
    let server = env.serve();
    let http = reqwest::Client::new();
    let dir = tempfile::tempdir().unwrap();
    let card = spoken_card(dir.path());
    let (org, _, key) = env.org_with_key("Acme");
    let redacted = env.connector(&org);
    let exempt = env.connector(&org);
    let set = env.cli(&[
        "org",
        "set-history",
        &org,
        "--redact",
        "--redact-connector",
        &format!("{}=off", exempt.0),
    ]);
    assert!(
        set.status.success(),
        "{}",
        String::from_utf8_lossy(&set.stderr)
    );

    // A file: the response, the archive and the model's prompt hold the tag, not the digits.
    let (status, file) = common::upload(
        server.url("/api/transcribe"),
        &key,
        "card.wav",
        std::fs::read(&card).unwrap(),
    )
    .await;
    assert_eq!(status, 200, "{file}");
    let text = file["text"].as_str().unwrap().to_owned();
    assert!(text.contains("[card]"), "{text}");
    assert!(longest_digits(&text) < 12, "{text}");
    for segment in file["segments"].as_array().unwrap() {
        for word in segment["words"].as_array().into_iter().flatten() {
            assert!(
                longest_digits(word["text"].as_str().unwrap()) < 12,
                "{word}"
            );
        }
    }
    let prompts =
        serde_json::to_string(&fake.seen().iter().map(|s| &s.body).collect::<Vec<_>>()).unwrap();
    assert!(
        prompts.contains("[card]"),
        "the analysis saw the redacted transcript"
    );
    assert!(!prompts.contains("1111"), "{prompts}");
    let id = file["id"].as_str().unwrap();
    let (_, stored) = get_json(&http, &server, &format!("/api/transcriptions/{id}"), &key).await;
    let stored: Vec<&str> = stored["transcript"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["text"].as_str().unwrap())
        .collect();
    let stored = stored.join(" ");
    assert!(stored.contains("[card]"), "{stored}");
    assert!(longest_digits(&stored) < 12, "{stored}");

    // A live call through the redacting connector: sent and stored with the tag.
    let sent = transcripts(&call(&env, &server, &card, &redacted, &["--speed", "2"]));
    let said = sent.join(" ");
    assert!(said.contains("[card]"), "{said}");
    assert!(longest_digits(&said) < 12, "{said}");
    let calls = ended_calls(&http, &server, &key).await;
    let call_id = calls[0]["id"].as_str().unwrap();
    let (_, txt) = get(
        &http,
        &server,
        &format!("/api/calls/{call_id}/transcript?format=txt"),
        &key,
    )
    .await;
    assert!(txt.contains("[card]"), "{txt}");
    assert!(longest_digits(&txt.replace(':', " ")) < 12, "{txt}");

    // The exempt connector's call keeps the number as heard.
    let sent = transcripts(&call(&env, &server, &card, &exempt, &["--speed", "2"]));
    let said = sent.join(" ");
    assert!(!said.contains("[card]"), "{said}");
    assert!(said.contains("1111"), "{said}");
}
