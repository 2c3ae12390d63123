//! The HTTP edge against a real server: authentication statuses, the shared RPM budget,
//! quota refusals, the public routes and the error body shape.

mod common;

use std::sync::Arc;

use callstream::app::App;
use callstream::config::Config;
use callstream::http::{self, errors, filters};
use callstream_actors::usage::{UsageEvent, UsageKind, UsageSource};
use common::{get, Env};
use warp::Filter;

/// A speech engine for routes that never transcribe: any use is an error.
struct NoSpeech;

impl callstream_actors::asr::AsrEngine for NoSpeech {
    fn transcribe(
        &mut self,
        _: &[&[f32]],
        _: &str,
    ) -> Result<Vec<callstream_actors::asr::Transcript>, callstream_actors::asr::AsrError> {
        Err(callstream_actors::asr::AsrError::Engine(
            "no speech engine here".into(),
        ))
    }

    fn languages(&self) -> &[callstream_actors::asr::Language] {
        &[]
    }
}

/// A language model for routes that never chat: any use is an error.
struct NoModel;

#[async_trait::async_trait]
impl callstream::llm::Provider for NoModel {
    async fn generate(
        &self,
        _: callstream::llm::Generation,
        _: callstream::llm::Deltas,
    ) -> Result<callstream::llm::Completion, callstream::llm::LlmError> {
        Err(callstream::llm::LlmError::Engine("no model here".into()))
    }

    fn name(&self) -> &str {
        "none"
    }
}

fn assert_error(body: &serde_json::Value, code: &str) {
    assert_eq!(body["error"]["code"], code, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{body}"
    );
}

#[tokio::test]
async fn missing_unknown_revoked_keys_and_deleted_orgs() {
    let env = Env::new(&[]);
    let server = env.serve();
    let client = reqwest::Client::new();
    // The CLI reaches the running server through its admin socket.
    let (org_id, key_id, secret) = env.org_with_key("Acme");
    let usage = server.url("/api/usage");

    let (status, _, body) = get(&client, &usage, None).await;
    assert_eq!(status, 401);
    assert_error(&body, "missing_api_key");

    let (status, _, body) = get(&client, &usage, Some("cs_not-a-key")).await;
    assert_eq!(status, 401);
    assert_error(&body, "invalid_api_key");

    let (status, _, body) = get(&client, &usage, Some(&secret)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["org_id"], org_id.as_str());

    env.cli_json(&["key", "revoke", &key_id]);
    let (status, _, body) = get(&client, &usage, Some(&secret)).await;
    assert_eq!(status, 401);
    assert_error(&body, "invalid_api_key");

    let (_, second) = env.key(&org_id);
    let (status, _, _) = get(&client, &server.url("/api/account"), Some(&second)).await;
    assert_eq!(status, 200);
    env.cli_json(&["org", "delete", &org_id]);
    let (status, _, body) = get(&client, &server.url("/api/account"), Some(&second)).await;
    assert_eq!(status, 404);
    assert_error(&body, "organisation_not_found");
}

#[tokio::test]
async fn rpm_budget_is_shared_by_every_route_of_a_key() {
    let env = Env::new(&[("CALLSTREAM_PLANS__FREE__RPM", "3")]);
    let server = env.serve();
    let client = reqwest::Client::new();
    let (org_id, _, secret) = env.org_with_key("Acme");
    let (account, usage) = (server.url("/api/account"), server.url("/api/usage"));

    for url in [&account, &usage, &account] {
        let (status, _, body) = get(&client, url, Some(&secret)).await;
        assert_eq!(status, 200, "{body}");
    }
    let (status, headers, body) = get(&client, &usage, Some(&secret)).await;
    assert_eq!(status, 429);
    assert_error(&body, "rate_limited");
    let retry: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=20).contains(&retry), "Retry-After {retry}");

    // Another key of the same organisation has a budget of its own.
    let (_, other) = env.key(&org_id);
    let (status, _, _) = get(&client, &account, Some(&other)).await;
    assert_eq!(status, 200);
    // Unauthenticated routes are not rate limited.
    for _ in 0..5 {
        let (status, _, _) = get(&client, &server.url("/api/languages"), None).await;
        assert_eq!(status, 200);
    }
}

#[tokio::test]
async fn public_routes_and_unknown_paths() {
    let env = Env::new(&[]);
    let server = env.serve();
    let client = reqwest::Client::new();

    let (status, _, body) = get(&client, &server.url("/api/languages"), None).await;
    assert_eq!(status, 200);
    // The multilingual model's 99 languages, each with its BCP-47 tags.
    let languages = body["languages"].as_array().unwrap();
    assert_eq!(languages.len(), 99);
    assert_eq!(
        languages[0],
        serde_json::json!({"code": "en", "name": "English", "tags": ["en-US", "en-GB", "en-AU",
            "en-CA", "en-IN", "en-IE", "en-NZ", "en-ZA", "en-PH", "en-SG"]})
    );
    let es = languages.iter().find(|l| l["code"] == "es").unwrap();
    assert_eq!(es["name"], "Spanish");
    assert_eq!(es["tags"][0], "es-ES");

    let (status, _, body) = get(&client, &server.url("/healthz"), None).await;
    assert_eq!((status, body), (200, serde_json::json!({"status": "ok"})));

    let (status, _, body) = get(&client, &server.url("/api/nope"), None).await;
    assert_eq!(status, 404);
    assert_error(&body, "not_found");
}

/// Routes that bill refuse with 402 once the organisation's pool for them is used up. The
/// billed routes themselves arrive with the chat and transcription surfaces; this serves the
/// production filter and error mapping on a probe route.
#[tokio::test]
async fn exhausted_quota_is_402_for_that_pool_only() {
    let env = Env::new(&[]);
    let vars = env.vars.clone();
    let config = Config::load_with_env(None, vars).unwrap();
    // The edge alone: the service is put together on engines that are never used, so no
    // model is loaded.
    let speech = callstream_actors::asr::pool::AsrPool::start(
        callstream_actors::asr::pool::PoolConfig::default(),
        |_| Ok(Box::new(NoSpeech) as Box<dyn callstream_actors::asr::AsrEngine>),
    )
    .unwrap();
    let app = App::builder(config)
        .speech(speech, Vec::new())
        .llm(Arc::new(NoModel))
        .open()
        .await
        .unwrap();
    let admin = app.admin.clone();
    let created = admin
        .execute(callstream::admin::AdminRequest::OrgCreate {
            name: "Acme".into(),
            plan: None,
        })
        .await
        .unwrap();
    let callstream::admin::AdminResponse::Org(org) = created else {
        panic!("{created:?}")
    };
    let callstream::admin::AdminResponse::KeyCreated { secret, .. } = admin
        .execute(callstream::admin::AdminRequest::KeyCreate {
            org: org.id.clone(),
            name: None,
        })
        .await
        .unwrap()
    else {
        panic!()
    };

    let audio = warp::path!("probe" / "audio")
        .and(filters::billed(app.clone(), UsageKind::AudioMs))
        .map(|_| "billed");
    let tokens = warp::path!("probe" / "tokens")
        .and(filters::billed(app.clone(), UsageKind::Tokens))
        .map(|_| "billed");
    let routes = audio
        .or(tokens)
        .map(|r| Box::new(r) as Box<dyn warp::Reply>)
        .or(http::api(app.clone()).map(|r| Box::new(r) as Box<dyn warp::Reply>))
        .unify()
        .recover(errors::recover);
    let (addr, serving) = warp::serve(routes).bind_ephemeral(([127, 0, 0, 1], 0));
    tokio::spawn(serving);
    let url = |p: &str| format!("http://{addr}{p}");
    let client = reqwest::Client::new();
    let probe = |path: &'static str| {
        client
            .get(url(path))
            .header("X-API-Key", secret.as_str())
            .send()
    };

    let resp = probe("/probe/audio").await.unwrap();
    assert_eq!(resp.status(), 200);

    // The free plan has 60 audio-minutes a month: use 59 min 59.999 s, then the rest.
    let store = Arc::clone(&app.store);
    let record = |amount| {
        let (store, org_id) = (store.clone(), org.id.clone());
        async move {
            store
                .record(&UsageEvent {
                    org_id,
                    key_id: "key_x".into(),
                    end_user: None,
                    kind: UsageKind::AudioMs,
                    amount,
                    source: UsageSource::Transcribe,
                    at_ms: callstream::clock::now_ms(),
                    call_id: None,
                })
                .await
                .unwrap()
        }
    };
    record(3_599_999).await;
    let resp = probe("/probe/audio").await.unwrap();
    assert_eq!(resp.status(), 200, "one millisecond is left");
    record(1).await;
    let resp = probe("/probe/audio").await.unwrap();
    assert_eq!(resp.status(), 402);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_error(&body, "quota_exhausted");

    let resp = probe("/probe/tokens").await.unwrap();
    assert_eq!(resp.status(), 200, "the chat pool is separate");

    let (status, _, body) = get(&client, &url("/api/usage"), Some(&secret)).await;
    assert_eq!(
        status, 200,
        "usage stays readable when a quota is exhausted"
    );
    assert_eq!(body["audio_seconds"]["used"], 3600.0);
    assert_eq!(body["audio_seconds"]["remaining"], 0.0);
    assert_eq!(body["chat_tokens"]["remaining"], 100_000);
}
