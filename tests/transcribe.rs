//! File transcription against a real server with a real multipart client: every format,
//! stereo calls with BANT and NEAT-P on the embedded model, every error status, and billing.

mod common;

use std::path::{Path, PathBuf};

use callstream::llm::profiles::{profile, ProfileKind};
use common::upstream::{FakeUpstream, Reply};
use common::Env;
use serde_json::Value;

const INTENT: &str = r#"{"intents": [{"intent": "billing_inquiry", "confidence": "high"}], "reasoning": "The caller was charged twice."}"#;

fn fixture(rel: &str) -> PathBuf {
    callstream_actors::package_dir(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(rel)
}

fn form(path: &Path, fields: &[(&str, &str)]) -> reqwest::multipart::Form {
    let bytes = std::fs::read(path).unwrap();
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    let mut form = reqwest::multipart::Form::new().part(
        "file",
        reqwest::multipart::Part::bytes(bytes).file_name(name),
    );
    for (k, v) in fields {
        form = form.text(k.to_string(), v.to_string());
    }
    form
}

async fn upload(
    server: &common::Server,
    key: Option<&str>,
    form: reqwest::multipart::Form,
) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .post(server.url("/api/transcribe"))
        .multipart(form);
    if let Some(key) = key {
        req = req.header("X-API-Key", key);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap())
}

#[tokio::test]
async fn every_format_transcribes_and_bills_its_duration() {
    let fake = FakeUpstream::start().await;
    fake.set_default(Reply::Text(vec![INTENT], (40, 20)));
    let env = Env::with(fake.env());
    let server = env.serve();
    let (org, _, secret) = env.org_with_key("Acme");
    let files = [
        "formats/pcm16-mono-16k.wav",
        "formats/pcm8-mono-8k.wav",
        "formats/pcm24-mono-22k.wav",
        "formats/float32-mono-16k.wav",
        "formats/alaw-mono-8k.wav",
        "formats/mulaw-mono-8k.wav",
        "formats/flac16-mono-44k.flac",
        "formats/vorbis-mono-44k.ogg",
        "formats/mp3-mono-44k.mp3",
        "formats/opus-mono.opus",
        "formats/pcm16-stereo-16k.wav",
    ];
    let mut billed = 0.0;
    for f in files {
        let (status, body) = upload(
            &server,
            Some(&secret),
            form(&fixture(f), &[("language", "en")]),
        )
        .await;
        assert_eq!(status, 200, "{f}: {body}");
        let text = body["text"].as_str().unwrap().to_lowercase();
        assert!(text.contains("charged twice"), "{f}: {text}");
        assert_eq!(body["language"], "en");
        assert_eq!(
            body["intent"],
            serde_json::from_str::<Value>(INTENT).unwrap()
        );
        assert!(body.get("bant").is_none() && body.get("neat_p").is_none());
        let seg = &body["segments"][0];
        assert_eq!(seg["id"], 0);
        assert_eq!(seg["channel"], 0);
        assert!(seg["start"].as_f64().unwrap() < seg["end"].as_f64().unwrap());
        assert!(seg["confidence"].as_f64().unwrap() > 0.0);
        assert!(seg["words"].as_array().is_some_and(|w| !w.is_empty()));
        let expected_speaker = if body["channels"] == 2 {
            "customer"
        } else {
            "speaker"
        };
        assert_eq!(seg["speaker"], expected_speaker, "{f}");
        billed += body["duration"].as_f64().unwrap();
    }
    let used = env.audio_used(&org);
    assert!(
        (used - billed).abs() < 0.01,
        "billed {used} s, durations add up to {billed} s"
    );
    // The upstream provider is asked for the intent as a JSON schema, in the files layout
    // (the transcript, then the task's name).
    let intent_schema = &profile(ProfileKind::Intent).schema;
    let seen = fake.seen();
    assert_eq!(seen.len(), files.len());
    for request in seen {
        let format = &request.body["response_format"];
        assert_eq!(format["type"], "json_schema", "{format}");
        assert_eq!(&format["json_schema"]["schema"], intent_schema);
        let messages = request.body["messages"].as_array().unwrap();
        let last = messages.last().unwrap()["content"].as_str().unwrap();
        assert!(last.ends_with("Task: intent"), "{last}");
    }
}

/// A language is named by its code or by a BCP-47 tag; the response shows it as sent, and the
/// speech comes back in that language.
#[tokio::test]
async fn languages_by_code_or_tag() {
    let fake = FakeUpstream::start().await;
    fake.set_default(Reply::Text(vec![INTENT], (40, 20)));
    let env = Env::with(fake.env());
    let server = env.serve();
    let (_, _, secret) = env.org_with_key("Acme");
    for (file, language, word) in [
        ("speech-cases/es.wav", "es-MX", "gracias"),
        ("speech-cases/de.wav", "de", "bestellung"),
        ("speech-cases/fr.wav", "fr-FR", "facture"),
    ] {
        let (status, body) = upload(
            &server,
            Some(&secret),
            form(&fixture(file), &[("language", language)]),
        )
        .await;
        assert_eq!(status, 200, "{file}: {body}");
        assert_eq!(body["language"], language);
        let text = body["text"].as_str().unwrap().to_lowercase();
        assert!(text.contains(word), "{file} in {language}: {text}");
    }
    let (status, body) = upload(
        &server,
        Some(&secret),
        form(&fixture("speech-cases/es.wav"), &[("language", "xx-YY")]),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "invalid_language");
}

#[tokio::test]
async fn stereo_call_with_bant_and_neat_p_on_the_embedded_model() {
    let env = Env::new(&[]);
    let server = env.serve();
    let (org, _, secret) = env.org_with_key("Acme");
    let (status, body) = upload(
        &server,
        Some(&secret),
        form(
            &fixture("genesys-test-transcript-connector.wav"),
            &[("extract_bant", "true"), ("extract_neat", "true")],
        ),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["channels"], 2);
    let segments = body["segments"].as_array().unwrap();
    for channel in [0, 1] {
        assert!(
            segments.iter().any(|s| s["channel"] == channel),
            "no segment on channel {channel}"
        );
    }
    assert!(segments
        .windows(2)
        .all(|w| w[0]["start"].as_f64() <= w[1]["start"].as_f64()));
    assert!(segments
        .iter()
        .all(|s| (s["channel"] == 0 && s["speaker"] == "customer")
            || (s["channel"] == 1 && s["speaker"] == "agent")));
    let text = body["text"].as_str().unwrap();
    assert!(text.contains("Singapore Post"), "{text}");
    assert!(body["intent"]["intents"]
        .as_array()
        .is_some_and(|i| !i.is_empty()));
    for (record, fields) in [
        ("bant", &["budget", "authority", "need", "timeline"][..]),
        (
            "neat_p",
            &[
                "need",
                "economic_impact",
                "access_to_authority",
                "timeline",
                "priority",
            ][..],
        ),
    ] {
        for field in fields {
            let c = &body[record][field];
            assert!(
                c["status"].is_string() && c["summary"].is_string() && c["confidence"].is_number(),
                "{record}.{field}: {c}"
            );
            for quote in c["evidence"].as_array().unwrap() {
                assert!(
                    text.contains(quote.as_str().unwrap()),
                    "{record}.{field} quote {quote} is not in the transcript"
                );
            }
        }
    }
    assert!((env.audio_used(&org) - 70.848).abs() < 0.01);
}

#[tokio::test]
async fn errors_have_their_statuses_and_bill_nothing() {
    let fake = FakeUpstream::start().await;
    fake.set_default(Reply::Text(vec![INTENT], (40, 20)));
    let mut extra = fake.env();
    extra.push(("CALLSTREAM_TRANSCRIBE__MAX_UPLOAD_MB", "1".into()));
    let env = Env::with(extra);
    let server = env.serve();
    let (org, _, secret) = env.org_with_key("Acme");
    let wav = fixture("formats/pcm8-mono-8k.wav");

    let (status, _) = upload(&server, None, form(&wav, &[])).await;
    assert_eq!(status, 401);
    let cases: Vec<(reqwest::multipart::Form, u16, &str)> = vec![
        (
            reqwest::multipart::Form::new().text("language", "en"),
            400,
            "missing_file",
        ),
        (form(&wav, &[("language", "xx")]), 400, "invalid_language"),
        (form(&wav, &[("extract_bant", "yes")]), 400, "invalid_flag"),
        (
            form(&wav, &[("extract_neat", "maybe")]),
            400,
            "invalid_flag",
        ),
        (
            form(&fixture("formats/not-audio.txt"), &[]),
            415,
            "unsupported_media_type",
        ),
        (
            form(&fixture("formats/not-audio.mp3"), &[]),
            415,
            "unsupported_media_type",
        ),
        (
            form(&fixture("formats/truncated.wav"), &[]),
            400,
            "invalid_audio",
        ),
        (
            reqwest::multipart::Form::new().part(
                "file",
                reqwest::multipart::Part::bytes(Vec::new()).file_name("empty.wav"),
            ),
            400,
            "invalid_audio",
        ),
    ];
    for (f, status, code) in cases {
        let (got, body) = upload(&server, Some(&secret), f).await;
        assert_eq!(
            (got, body["error"]["code"].as_str()),
            (status, Some(code)),
            "{body}"
        );
    }

    // Over the size limit: refused on the declared length, before the body is read.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut raw = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let head = format!(
        "POST /api/transcribe HTTP/1.1\r\nHost: x\r\nX-API-Key: {secret}\r\nContent-Type: multipart/form-data; boundary=b\r\nContent-Length: {}\r\n\r\n",
        2 << 20
    );
    raw.write_all(head.as_bytes()).await.unwrap();
    let mut answer = vec![0u8; 256];
    let n = raw.read(&mut answer).await.unwrap();
    assert!(String::from_utf8_lossy(&answer[..n]).starts_with("HTTP/1.1 413"));
    assert_eq!(env.audio_used(&org), 0.0);
}

#[tokio::test]
async fn quota_is_checked_before_any_work_and_against_the_file_length() {
    let fake = FakeUpstream::start().await;
    fake.set_default(Reply::Text(vec![INTENT], (40, 20)));
    let mut extra = fake.env();
    extra.push((
        "CALLSTREAM_PLANS__FREE__AUDIO_MINUTES_PER_MONTH",
        "1".into(),
    ));
    extra.push((
        "CALLSTREAM_PLANS__TEAM__AUDIO_MINUTES_PER_MONTH",
        "0".into(),
    ));
    let env = Env::with(extra);
    let server = env.serve();
    let (org, _, secret) = env.org_with_key("Acme");
    // 70.8 s does not fit in the one minute left.
    let (status, body) = upload(
        &server,
        Some(&secret),
        form(&fixture("genesys-test-transcript-connector.wav"), &[]),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (402, Some("quota_exhausted")),
        "{body}"
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("1.18 audio-minutes"),
        "{body}"
    );
    assert_eq!(fake.seen().len(), 0, "no analysis ran");
    // 3.3 s does.
    let (status, _) = upload(
        &server,
        Some(&secret),
        form(&fixture("formats/pcm8-mono-8k.wav"), &[]),
    )
    .await;
    assert_eq!(status, 200);
    assert!((env.audio_used(&org) - 3.275).abs() < 0.01);

    let team = env.cli_json(&["org", "create", "Zero", "--plan", "team"]);
    let (_, zero_key) = env.key(team["id"].as_str().unwrap());
    let (status, body) = upload(
        &server,
        Some(&zero_key),
        form(&fixture("formats/pcm8-mono-8k.wav"), &[]),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (402, Some("quota_exhausted"))
    );
}
