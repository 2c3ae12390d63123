//! The store's behaviour, checked on every backend: each test here runs once on sled and once
//! on a real PostgreSQL (a throw-away cluster, see `testpg`).

use std::collections::BTreeMap;
use std::sync::Arc;

use callstream_actors::usage::{UsageError, UsageEvent, UsageKind, UsageSink, UsageSource};
use futures_util::future::BoxFuture;

use super::crypto::KEY_LEN;
use super::testpg::Cluster;
use super::{
    ApiKey, Connector, DashboardUser, McpIntegration, Org, PgStore, SecretBox, SharedState,
    SledStore, Space, Store, StoreError,
};
use crate::clock;
use crate::history::{IntentEntry, Line, Query, Record, RecordHead, RecordKind};

/// A place a store lives, which can be opened (again) with a given key.
#[async_trait::async_trait]
trait Backend: Sync {
    /// Opens the store; a previous handle must have been dropped.
    async fn open_with(&self, key: u8) -> Arc<dyn Store>;
    /// Everything stored, as bytes, for plaintext checks (no store handle may be open).
    async fn raw(&self) -> Vec<u8>;

    async fn open(&self) -> Arc<dyn Store> {
        self.open_with(3).await
    }

    /// The shared state as two instances see it.
    async fn shared_pair(&self) -> (Arc<dyn SharedState>, Arc<dyn SharedState>);
}

struct Sled(tempfile::TempDir);

impl Sled {
    fn new() -> Self {
        Sled(tempfile::tempdir().unwrap())
    }
}

#[async_trait::async_trait]
impl Backend for Sled {
    async fn open_with(&self, key: u8) -> Arc<dyn Store> {
        Arc::new(SledStore::open(self.0.path(), SecretBox::new(&[key; KEY_LEN])).unwrap())
    }

    async fn shared_pair(&self) -> (Arc<dyn SharedState>, Arc<dyn SharedState>) {
        // One process, one state: what the embedded store's single instance uses.
        let local: Arc<dyn SharedState> = Arc::new(super::shared::Local::default());
        (local.clone(), local)
    }

    async fn raw(&self) -> Vec<u8> {
        let db = sled::open(self.0.path().join(super::sled::DB_DIR)).unwrap();
        let mut raw = Vec::new();
        for name in db.tree_names() {
            for item in db.open_tree(name).unwrap().iter() {
                let (k, v) = item.unwrap();
                raw.extend_from_slice(&k);
                raw.extend_from_slice(&v);
            }
        }
        raw
    }
}

struct Postgres(String);

impl Postgres {
    fn new() -> Self {
        Postgres(Cluster::shared().fresh_database())
    }
}

/// A client of the database at `url`, its connection driven by a task of its own.
async fn client(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

#[async_trait::async_trait]
impl Backend for Postgres {
    async fn open_with(&self, key: u8) -> Arc<dyn Store> {
        Arc::new(
            PgStore::open(&self.0, 4, SecretBox::new(&[key; KEY_LEN]))
                .await
                .unwrap(),
        )
    }

    async fn shared_pair(&self) -> (Arc<dyn SharedState>, Arc<dyn SharedState>) {
        let mut pair = Vec::new();
        for _ in 0..2 {
            let instance = PgStore::open(&self.0, 4, SecretBox::new(&[3; KEY_LEN]))
                .await
                .unwrap();
            instance.start_instance().await;
            pair.push(Arc::new(instance) as Arc<dyn SharedState>);
        }
        let other = pair.pop().unwrap();
        (pair.pop().unwrap(), other)
    }

    async fn raw(&self) -> Vec<u8> {
        let client = client(&self.0).await;
        let mut raw = Vec::new();
        for table in [
            "orgs",
            "api_keys",
            "connectors",
            "dashboard_users",
            "usage_ledger",
            "history_records",
            "history_lines",
            "history_intents",
        ] {
            for row in client
                .query(&format!("SELECT t::text FROM {table} t"), &[])
                .await
                .unwrap()
            {
                raw.extend_from_slice(row.get::<_, &str>(0).as_bytes());
            }
        }
        raw
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn org(id: &str) -> Org {
    Org {
        id: id.into(),
        name: "Acme".into(),
        system_prompt: Some("Be brief.".into()),
        mcp: Some(McpIntegration {
            url: "http://127.0.0.1:1/mcp".into(),
            headers: BTreeMap::from([("Authorization".into(), "Bearer hunter2".into())]),
        }),
        mcp_allow: vec!["10.0.0.0/8".into(), "mcp.internal".into()],
        plan: "free".into(),
        history: Default::default(),
        deleted: false,
        created_at_ms: 1,
    }
}

fn event(org: &str, at_ms: i64, kind: UsageKind, amount: u64) -> UsageEvent {
    UsageEvent {
        org_id: org.into(),
        key_id: "key_1".into(),
        end_user: Some("u1".into()),
        kind,
        amount,
        source: UsageSource::Chat,
        at_ms,
        call_id: None,
    }
}

fn running(call: &str, at_ms: i64, amount: u64) -> UsageEvent {
    UsageEvent {
        end_user: None,
        source: UsageSource::Callstream,
        call_id: Some(call.into()),
        ..event("org_a", at_ms, UsageKind::AudioMs, amount)
    }
}

fn key(id: &str, org: &str, hash_byte: u8) -> ApiKey {
    ApiKey {
        id: id.into(),
        org_id: org.into(),
        name: Some("ci".into()),
        hash: hex(&[hash_byte; 32]),
        last4: "wxyz".into(),
        created_at_ms: 5,
        revoked_at_ms: None,
    }
}

fn connector(id: &str, org: &str) -> Connector {
    Connector {
        client_id: id.into(),
        org_id: org.into(),
        name: Some("genesys".into()),
        created_at_ms: 1,
        rotated_at_ms: None,
        revoked_at_ms: None,
    }
}

/// 2026-11-25 23:59:59.999 UTC: one millisecond later is another day.
const BEFORE_MIDNIGHT: i64 = 1_795_651_199_999;

async fn running_totals_are_written_over_and_days_grow_by_the_difference(b: &dyn Backend) {
    {
        let s = b.open().await;
        s.checkpoint(&[
            running("c1", BEFORE_MIDNIGHT - 5000, 1000),
            running("c2", BEFORE_MIDNIGHT - 10, 300),
        ])
        .await
        .unwrap();
        s.checkpoint(&[running("c1", BEFORE_MIDNIGHT - 5000, 2500)])
            .await
            .unwrap();
        // The same total again (a batch sent twice) changes nothing.
        s.checkpoint(&[running("c1", BEFORE_MIDNIGHT - 5000, 2500)])
            .await
            .unwrap();
        // After midnight the call starts a new row.
        s.checkpoint(&[running("c1", BEFORE_MIDNIGHT + 1, 400)])
            .await
            .unwrap();
    }
    // What was acknowledged is there after reopening.
    let s = b.open().await;
    let events = s.usage_events("org_a", 0, i64::MAX).await.unwrap();
    let mut amounts: Vec<(Option<String>, u64)> = events
        .iter()
        .map(|e| (e.call_id.clone(), e.amount))
        .collect();
    amounts.sort();
    assert_eq!(
        amounts,
        [
            (Some("c1".into()), 400),
            (Some("c1".into()), 2500),
            (Some("c2".into()), 300)
        ]
    );
    let days = s
        .usage_by_day("org_a", "2026-11-25", "2026-11-26")
        .await
        .unwrap();
    let totals: Vec<u64> = days.iter().map(|d| d.amount).collect();
    assert_eq!(totals, [2800, 400]);
}

async fn orgs_round_trip_with_sealed_mcp_headers(b: &dyn Backend) {
    {
        let s = b.open().await;
        s.insert_org(&org("org_a")).await.unwrap();
        assert!(matches!(
            s.insert_org(&org("org_a")).await,
            Err(StoreError::Exists { .. })
        ));
        assert_eq!(s.org("org_a").await.unwrap().unwrap(), org("org_a"));
        assert_eq!(s.org("org_zz").await.unwrap(), None);
        let mut deleted = org("org_a");
        deleted.deleted = true;
        deleted.mcp = None;
        s.update_org(&deleted).await.unwrap();
        assert_eq!(s.org("org_a").await.unwrap().unwrap(), deleted);
        s.update_org(&org("org_a")).await.unwrap();
        let mut second = org("org_b");
        second.created_at_ms = 2;
        s.insert_org(&second).await.unwrap();
        let ids: Vec<String> = s.orgs().await.unwrap().into_iter().map(|o| o.id).collect();
        assert_eq!(ids, ["org_a", "org_b"]);
        assert!(matches!(
            s.update_org(&org("org_c")).await,
            Err(StoreError::NotFound { .. })
        ));
    }
    let raw = b.raw().await;
    assert!(contains(&raw, b"org_a"), "the raw view sees the records");
    assert!(!contains(&raw, b"hunter2"));
    assert!(!contains(&raw, hex(b"hunter2").as_bytes()));
}

async fn ledger_and_daily_totals_agree(b: &dyn Backend) {
    let s = b.open().await;
    s.record(&event("org_a", BEFORE_MIDNIGHT, UsageKind::Tokens, 10))
        .await
        .unwrap();
    s.record(&event("org_a", BEFORE_MIDNIGHT + 1, UsageKind::Tokens, 5))
        .await
        .unwrap();
    s.record(&event("org_a", BEFORE_MIDNIGHT + 2, UsageKind::Tokens, 7))
        .await
        .unwrap();
    s.record(&event(
        "org_a",
        BEFORE_MIDNIGHT + 2,
        UsageKind::AudioMs,
        1500,
    ))
    .await
    .unwrap();
    s.record(&event(
        "org_ab",
        BEFORE_MIDNIGHT + 2,
        UsageKind::Tokens,
        1000,
    ))
    .await
    .unwrap();

    let days = s
        .usage_by_day("org_a", "2026-11-01", "2026-11-30")
        .await
        .unwrap();
    let view: Vec<(&str, UsageKind, u64)> = days
        .iter()
        .map(|d| (d.day.as_str(), d.kind, d.amount))
        .collect();
    assert_eq!(
        view,
        [
            ("2026-11-25", UsageKind::Tokens, 10),
            ("2026-11-26", UsageKind::AudioMs, 1500),
            ("2026-11-26", UsageKind::Tokens, 12),
        ]
    );
    assert_eq!(
        s.usage_by_day("org_a", "2026-11-26", "2026-11-26")
            .await
            .unwrap()
            .len(),
        2
    );
    let events = s.usage_events("org_a", 0, i64::MAX).await.unwrap();
    assert_eq!(events.len(), 4);
    assert_eq!(
        events[0],
        event("org_a", BEFORE_MIDNIGHT, UsageKind::Tokens, 10)
    );
    assert_eq!(
        s.usage_events("org_a", BEFORE_MIDNIGHT + 1, BEFORE_MIDNIGHT + 2)
            .await
            .unwrap()
            .len(),
        1
    );
}

async fn concurrent_charges_are_all_recorded(b: &dyn Backend) {
    let s = b.open().await;
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let s = s.clone();
            tokio::spawn(async move {
                for i in 0..25 {
                    s.record(&event(
                        "org_a",
                        1_795_651_199_000 + t * 100 + i,
                        UsageKind::Tokens,
                        1,
                    ))
                    .await
                    .unwrap();
                }
            })
        })
        .collect();
    // Running totals of two calls, each from its own task (one writer per call, as the
    // billing actor of the instance that runs it), growing the same day at the same time.
    let writers: Vec<_> = ["c1", "c2"]
        .into_iter()
        .map(|call| {
            let s = s.clone();
            tokio::spawn(async move {
                for amount in 1..=20 {
                    s.checkpoint(&[running(call, 1_795_651_000_000, amount * 100)])
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for t in threads.into_iter().chain(writers) {
        t.await.unwrap();
    }
    let days = s
        .usage_by_day("org_a", "2026-11-01", "2026-11-30")
        .await
        .unwrap();
    let sum = |kind| {
        days.iter()
            .filter(|d| d.kind == kind)
            .map(|d| d.amount)
            .sum::<u64>()
    };
    assert_eq!(sum(UsageKind::Tokens), 200);
    assert_eq!(sum(UsageKind::AudioMs), 4000);
    assert_eq!(
        s.usage_events("org_a", 0, i64::MAX).await.unwrap().len(),
        202
    );
}

async fn api_keys_resolve_by_hash_and_revoke(b: &dyn Backend) {
    let s = b.open().await;
    let k = key("key_1", "org_a", 0xab);
    s.insert_api_key(&k, usize::MAX).await.unwrap();
    assert!(matches!(
        s.insert_api_key(&k, usize::MAX).await,
        Err(StoreError::Exists { .. })
    ));
    // The same secret under another id is refused too.
    assert!(matches!(
        s.insert_api_key(&key("key_9", "org_a", 0xab), usize::MAX)
            .await,
        Err(StoreError::Exists { .. })
    ));
    assert_eq!(s.api_key_by_hash(&[0xab; 32]).await.unwrap().unwrap(), k);
    assert_eq!(s.api_key("key_1").await.unwrap().unwrap(), k);
    assert_eq!(s.api_key_by_hash(&[0xac; 32]).await.unwrap(), None);
    let revoked = s.revoke_api_key("key_1", 9).await.unwrap();
    assert_eq!(revoked.revoked_at_ms, Some(9));
    assert_eq!(
        s.revoke_api_key("key_1", 10).await.unwrap().revoked_at_ms,
        Some(9)
    );
    assert!(matches!(
        s.revoke_api_key("key_2", 1).await,
        Err(StoreError::NotFound { .. })
    ));
    let mut later = key("key_2", "org_a", 0xcd);
    later.created_at_ms = 6;
    s.insert_api_key(&later, usize::MAX).await.unwrap();
    let ids: Vec<String> = s
        .api_keys("org_a")
        .await
        .unwrap()
        .into_iter()
        .map(|k| k.id)
        .collect();
    assert_eq!(ids, ["key_1", "key_2"]);
    assert!(s.api_keys("org_b").await.unwrap().is_empty());
}

async fn connector_secret_is_sealed_and_rotates(b: &dyn Backend) {
    {
        let s = b.open().await;
        let c = connector("cc_1", "org_a");
        s.insert_connector(&c, b"first-secret", usize::MAX)
            .await
            .unwrap();
        assert!(matches!(
            s.insert_connector(&c, b"x", usize::MAX).await,
            Err(StoreError::Exists { .. })
        ));
        assert_eq!(
            s.connector("cc_1").await.unwrap().unwrap(),
            (c.clone(), b"first-secret".to_vec())
        );
        let rotated = s
            .rotate_connector("cc_1", b"second-secret", 7)
            .await
            .unwrap();
        assert_eq!(rotated.rotated_at_ms, Some(7));
        assert_eq!(
            s.connector("cc_1").await.unwrap().unwrap().1,
            b"second-secret"
        );
        assert_eq!(
            s.revoke_connector("cc_1", 8).await.unwrap().revoked_at_ms,
            Some(8)
        );
        assert_eq!(
            s.revoke_connector("cc_1", 9).await.unwrap().revoked_at_ms,
            Some(8)
        );
        assert!(matches!(
            s.rotate_connector("cc_9", b"x", 1).await,
            Err(StoreError::NotFound { .. })
        ));
        assert!(matches!(
            s.revoke_connector("cc_9", 1).await,
            Err(StoreError::NotFound { .. })
        ));
        assert_eq!(s.connectors("org_a").await.unwrap().len(), 1);
        assert!(s.connectors("org_b").await.unwrap().is_empty());
        assert_eq!(s.connector("cc_9").await.unwrap(), None);
    }
    let raw = b.raw().await;
    assert!(!contains(&raw, b"second-secret"));
    assert!(!contains(&raw, hex(b"second-secret").as_bytes()));
    let wrong_key = b.open_with(4).await;
    assert!(matches!(
        wrong_key.connector("cc_1").await,
        Err(StoreError::Decrypt)
    ));
}

async fn dashboard_users_are_unique_by_email(b: &dyn Backend) {
    let s = b.open().await;
    let user = |email: &str, at| DashboardUser {
        email: email.into(),
        org_id: "org_a".into(),
        password_hash: "$argon2id$v=19$m=19456,t=2,p=1$c2FsdA$aGFzaA".into(),
        created_at_ms: at,
    };
    s.insert_user(&user("b@example.com", 2)).await.unwrap();
    s.insert_user(&user("a@example.com", 1)).await.unwrap();
    assert!(matches!(
        s.insert_user(&user("a@example.com", 3)).await,
        Err(StoreError::Exists { .. })
    ));
    assert_eq!(
        s.user("a@example.com").await.unwrap().unwrap(),
        user("a@example.com", 1)
    );
    assert_eq!(s.user("c@example.com").await.unwrap(), None);
    let emails: Vec<String> = s
        .users()
        .await
        .unwrap()
        .into_iter()
        .map(|u| u.email)
        .collect();
    assert_eq!(emails, ["a@example.com", "b@example.com"]);
}

/// Fills a store with one of everything.
async fn populate(s: &dyn Store) {
    s.insert_org(&org("org_a")).await.unwrap();
    let mut gone = org("org_b");
    gone.deleted = true;
    gone.mcp = None;
    gone.created_at_ms = 2;
    s.insert_org(&gone).await.unwrap();
    s.insert_api_key(&key("key_1", "org_a", 1), usize::MAX)
        .await
        .unwrap();
    s.insert_api_key(&key("key_2", "org_b", 2), usize::MAX)
        .await
        .unwrap();
    s.revoke_api_key("key_2", 3).await.unwrap();
    s.insert_connector(&connector("cc_1", "org_a"), b"s3cret", usize::MAX)
        .await
        .unwrap();
    s.insert_user(&DashboardUser {
        email: "a@example.com".into(),
        org_id: "org_a".into(),
        password_hash: "hash".into(),
        created_at_ms: 1,
    })
    .await
    .unwrap();
    s.record(&event("org_a", BEFORE_MIDNIGHT, UsageKind::Tokens, 10))
        .await
        .unwrap();
    s.record(&event("org_b", BEFORE_MIDNIGHT + 5, UsageKind::Tokens, 4))
        .await
        .unwrap();
    s.checkpoint(&[running("c1", BEFORE_MIDNIGHT + 1, 1500)])
        .await
        .unwrap();
    // A call with its lines and intents, and a file transcription.
    let call = crate::history::call_record_id("org_a", "sess-copy");
    s.begin_record(&call_head("org_a", &call, BEFORE_MIDNIGHT, "cc_1"))
        .await
        .unwrap();
    s.add_lines(
        "org_a",
        &call,
        &[
            line(0, 0.5, "my parcel is late"),
            line(1, 2.0, "let me check"),
        ],
    )
    .await
    .unwrap();
    s.add_intent(
        "org_a",
        &call,
        &intent_entry(BEFORE_MIDNIGHT + 10, "order_status"),
    )
    .await
    .unwrap();
    s.end_record("org_a", &call, BEFORE_MIDNIGHT + 60_000, "closed", 60_000)
        .await
        .unwrap();
    let mut file = call_head(
        "org_a",
        &crate::history::file_record_id(),
        BEFORE_MIDNIGHT,
        "key_1",
    );
    file.kind = RecordKind::File;
    file.file_name = Some("a.wav".into());
    s.put_record(&Record {
        head: file,
        transcript: vec![line(0, 0.0, "hello there")],
        intents: Vec::new(),
    })
    .await
    .unwrap();
}

/// Everything a store says, to compare two stores.
async fn dump(s: &dyn Store) -> String {
    let mut out = format!(
        "{:?}\n{:?}\n",
        s.orgs().await.unwrap(),
        s.users().await.unwrap()
    );
    for org in s.orgs().await.unwrap() {
        out += &format!("{:?}\n", s.api_keys(&org.id).await.unwrap());
        for c in s.connectors(&org.id).await.unwrap() {
            out += &format!("{:?}\n", s.connector(&c.client_id).await.unwrap());
        }
        let mut events = s.usage_events(&org.id, 0, i64::MAX).await.unwrap();
        events.sort_by_key(|e| (e.at_ms, e.amount));
        out += &format!("{events:?}\n");
        out += &format!(
            "{:?}\n",
            s.usage_by_day(&org.id, "2026-01-01", "2026-12-31")
                .await
                .unwrap()
        );
        for kind in [RecordKind::Call, RecordKind::File] {
            let query = Query {
                limit: 100,
                ..Query::default()
            };
            for id in all_pages(s, &org.id, kind, query).await {
                out += &format!("{:?}\n", s.load_record(&org.id, &id).await.unwrap());
            }
        }
    }
    out
}

/// A copy into the backend under test says what the source says, keeps running totals as
/// running totals, refuses a target that is not empty, and copies out again to either kind.
async fn copy_moves_everything(b: &dyn Backend) {
    let source = Sled::new().open_with(5).await;
    populate(&*source).await;
    let target = b.open().await;
    let report = super::copy::copy(&*source, &*target).await.unwrap();
    assert_eq!(
        (
            report.orgs,
            report.api_keys,
            report.connectors,
            report.users
        ),
        (2, 2, 1, 1)
    );
    assert_eq!(report.usage_events, 3);
    assert_eq!(report.history_records, 2);
    assert_eq!(dump(&*source).await, dump(&*target).await);
    // The running total is still one: a later checkpoint writes over it.
    target
        .checkpoint(&[running("c1", BEFORE_MIDNIGHT + 1, 2000)])
        .await
        .unwrap();
    let days = target
        .usage_by_day("org_a", "2026-11-26", "2026-11-26")
        .await
        .unwrap();
    assert_eq!(days[0].amount, 2000);
    assert!(matches!(
        super::copy::copy(&*source, &*target).await,
        Err(super::copy::CopyError::TargetNotEmpty(_))
    ));
    for out in [
        Sled::new().open_with(6).await,
        Postgres::new().open_with(6).await,
    ] {
        super::copy::copy(&*target, &*out).await.unwrap();
        assert_eq!(dump(&*target).await, dump(&*out).await);
    }
}

/// An entry stored by one instance is seen, and refused again, by the other; `take` hands it
/// to one caller; expired entries count as absent.
async fn shared_entries_are_seen_by_every_instance(b: &dyn Backend) {
    let (a, other) = b.shared_pair().await;
    let later = clock::now_ms() + 60_000;
    assert!(a.insert_new(Space::Nonce, "n1", "", later).await.unwrap());
    assert!(!other
        .insert_new(Space::Nonce, "n1", "", later)
        .await
        .unwrap());
    // Spaces are apart.
    assert!(other
        .insert_new(Space::SignInForm, "n1", "", later)
        .await
        .unwrap());
    assert!(other
        .insert_new(Space::Session, "s1", "{\"v\":1}", later)
        .await
        .unwrap());
    assert_eq!(
        a.get(Space::Session, "s1").await.unwrap().as_deref(),
        Some("{\"v\":1}")
    );
    assert_eq!(
        a.take(Space::SignInForm, "n1").await.unwrap().as_deref(),
        Some("")
    );
    assert_eq!(other.take(Space::SignInForm, "n1").await.unwrap(), None);
    assert_eq!(other.get(Space::Session, "nope").await.unwrap(), None);
    // An expired entry is absent, and may be stored again.
    let past = clock::now_ms() - 1;
    assert!(a.insert_new(Space::Nonce, "old", "", past).await.unwrap());
    assert_eq!(other.get(Space::Nonce, "old").await.unwrap(), None);
    assert!(other
        .insert_new(Space::Nonce, "old", "", later)
        .await
        .unwrap());
    assert!(!a.insert_new(Space::Nonce, "old", "", later).await.unwrap());
}

/// A burst split across two instances gets the key's budget once, not once per instance.
async fn a_rate_budget_is_one_across_instances(b: &dyn Backend) {
    let (a, other) = b.shared_pair().await;
    let now = std::time::Instant::now();
    let mut allowed = 0;
    let mut waits = Vec::new();
    for i in 0..40 {
        let instance = if i % 2 == 0 { &a } else { &other };
        match instance.rate("key:k1", 30, now).await.unwrap() {
            Ok(()) => allowed += 1,
            Err(wait) => waits.push(wait),
        }
    }
    assert_eq!(allowed, 30);
    assert_eq!(waits.len(), 10);
    assert!(waits
        .iter()
        .all(|w| *w > std::time::Duration::ZERO && *w <= std::time::Duration::from_secs(2)));
    // Another key has its own budget.
    assert_eq!(other.rate("key:k2", 30, now).await.unwrap(), Ok(()));
}

/// A cap holds across instances: places taken on one count on the other, and many taken at
/// once never pass it.
async fn places_are_capped_over_every_instance(b: &dyn Backend) {
    let (a, other) = b.shared_pair().await;
    assert!(a.take_place("calls:org:o", "h1", 2).await.unwrap());
    // Taking again is idempotent for the same holder.
    assert!(a.take_place("calls:org:o", "h1", 2).await.unwrap());
    assert!(other.take_place("calls:org:o", "h2", 2).await.unwrap());
    assert!(!a.take_place("calls:org:o", "h3", 2).await.unwrap());
    assert!(!other.take_place("calls:org:o", "h3", 2).await.unwrap());
    // Another name has its own places.
    assert!(other.take_place("calls:org:p", "h3", 2).await.unwrap());
    // A place given back on one instance frees it for the other.
    a.leave_place("calls:org:o", "h1");
    let mut freed = false;
    for _ in 0..200 {
        if other.take_place("calls:org:o", "h4", 2).await.unwrap() {
            freed = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(freed, "the place given back was never free");
    // Twenty takers at once on two instances: exactly the cap gets a place.
    let takers = (0..20).map(|i| {
        let shared = if i % 2 == 0 { a.clone() } else { other.clone() };
        async move {
            shared
                .take_place("files:org:o", &format!("t{i}"), 3)
                .await
                .unwrap()
        }
    });
    let taken = futures_util::future::join_all(takers).await;
    assert_eq!(taken.iter().filter(|t| **t).count(), 3);
}

/// Keys and connectors are counted and added in one step: a cap holds however many are added
/// at once, and revoked ones do not count.
async fn keys_and_connectors_are_capped_per_organisation(b: &dyn Backend) {
    let s = b.open().await;
    let adds = (0..8u8).map(|i| {
        let s = s.clone();
        async move {
            s.insert_api_key(&key(&format!("key_{i}"), "org_a", i + 1), 3)
                .await
        }
    });
    let added = futures_util::future::join_all(adds).await;
    assert_eq!(added.iter().filter(|r| r.is_ok()).count(), 3);
    assert!(added
        .iter()
        .filter_map(|r| r.as_ref().err())
        .all(|e| matches!(
            e,
            StoreError::Cap {
                kind: "API key",
                most: 3
            }
        )));
    // Another organisation is not held back; a revoked key frees a place.
    s.insert_api_key(&key("key_b", "org_b", 0x70), 3)
        .await
        .unwrap();
    let first = s.api_keys("org_a").await.unwrap()[0].id.clone();
    s.revoke_api_key(&first, 9).await.unwrap();
    s.insert_api_key(&key("key_again", "org_a", 0x71), 3)
        .await
        .unwrap();
    for i in 0..2 {
        s.insert_connector(&connector(&format!("cc_{i}"), "org_a"), b"s", 2)
            .await
            .unwrap();
    }
    assert!(matches!(
        s.insert_connector(&connector("cc_9", "org_a"), b"s", 2)
            .await,
        Err(StoreError::Cap {
            kind: "connector",
            most: 2
        })
    ));
}

/// `org_a`'s `kind` pool in November 2026, of `quota`.
fn november(kind: UsageKind, quota: u64) -> super::shared::PoolRef<'static> {
    super::shared::PoolRef {
        org_id: "org_a",
        kind,
        quota: Some(quota),
        first_day: "2026-11-01",
        last_day: "2026-11-30",
    }
}

/// What `store`'s ledger holds of `org_a`'s `kind` in November 2026.
async fn used_in_november(store: &dyn Store, kind: UsageKind) -> Result<u64, StoreError> {
    Ok(store
        .usage_by_day("org_a", "2026-11-01", "2026-11-30")
        .await?
        .iter()
        .filter(|d| d.kind == kind)
        .map(|d| d.amount)
        .sum())
}

/// [`used_in_november`] as a reservation reads it.
fn used_of<'a>(
    store: &'a dyn Store,
    kind: UsageKind,
) -> impl Fn() -> BoxFuture<'a, Result<u64, StoreError>> + Send + Sync + 'a {
    move || Box::pin(used_in_november(store, kind))
}

/// Nothing in the ledger.
fn none_used<'a>() -> impl Fn() -> BoxFuture<'a, Result<u64, StoreError>> + Send + Sync {
    || Box::pin(async { Ok(0) })
}

/// Reservations from many tasks on two instances never take more than is left, and each
/// instance gives back what it took.
async fn reservations_never_share_a_remainder(b: &dyn Backend) {
    let store = b.open().await;
    store
        .record(&event(
            "org_a",
            BEFORE_MIDNIGHT + 10,
            UsageKind::Tokens,
            400,
        ))
        .await
        .unwrap();
    let (a, other) = b.shared_pair().await;
    let used = used_of(store.as_ref(), UsageKind::Tokens);
    let reserve = |instance: &Arc<dyn SharedState>| {
        let (instance, used) = (instance.clone(), &used);
        async move {
            let pool = november(UsageKind::Tokens, 5_000);
            instance.reserve(pool, 100, 100, used).await.unwrap()
        }
    };
    let workers = (0..8).map(|t| {
        let (a, other, reserve) = (&a, &other, &reserve);
        async move {
            let mut mine = Vec::new();
            for _ in 0..10 {
                let which = t % 2;
                if let Some(n) = reserve(if which == 0 { a } else { other }).await {
                    mine.push((which, n));
                }
            }
            mine
        }
    });
    let granted: Vec<(usize, u64)> = futures_util::future::join_all(workers)
        .await
        .into_iter()
        .flatten()
        .collect();
    let total: u64 = granted.iter().map(|g| g.1).sum();
    assert_eq!(total, 4_600, "5,000 quota, 400 used");
    assert!(granted.iter().all(|g| g.1 == 100));
    assert_eq!(a.reserved("org_a", UsageKind::Tokens).await.unwrap(), 4_600);
    assert_eq!(
        other.reserved("org_a", UsageKind::Tokens).await.unwrap(),
        4_600
    );
    assert_eq!(reserve(&a).await, None);
    for (which, n) in granted {
        let instance = if which == 0 { &a } else { &other };
        instance.release("org_a", UsageKind::Tokens, n);
    }
    // Given back from a task of each instance's own: an instance sees its own at once, the
    // other's once that instance has applied it (`reserved` waits for its own queue).
    other.reserved("org_a", UsageKind::Tokens).await.unwrap();
    assert_eq!(a.reserved("org_a", UsageKind::Tokens).await.unwrap(), 0);
    assert_eq!(other.reserved("org_a", UsageKind::Tokens).await.unwrap(), 0);
    assert_eq!(reserve(&other).await, Some(100));
}

/// A ledger whose writes take a while, as an fsync does.
struct SlowLedger(Arc<dyn Store>);

#[async_trait::async_trait]
impl UsageSink for SlowLedger {
    async fn record(&self, event: &UsageEvent) -> Result<(), UsageError> {
        self.0.record(event).await?;
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        Ok(())
    }

    async fn checkpoint(&self, totals: &[UsageEvent]) -> Result<(), UsageError> {
        self.0.checkpoint(totals).await?;
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        Ok(())
    }
}

/// Usage written and its reservation given back are one step to anyone reserving: while work
/// only settles what it reserved, what the pool has given out (the ledger plus reservations),
/// as a reservation sees it, never goes down. Seen twice for a moment, work that fits would
/// be refused; seen not at all, the pool could be passed.
async fn settling_is_one_step_to_a_reservation(b: &dyn Backend) {
    const QUOTA: u64 = 1_000_000_000;
    const UNIT: u64 = 1_000;
    const ROUNDS: u64 = 50;
    let store = b.open().await;
    let ledger = SlowLedger(store.clone());
    let (a, other) = b.shared_pair().await;
    let pool = november(UsageKind::AudioMs, QUOTA);
    let used = used_of(store.as_ref(), UsageKind::AudioMs);
    let working = std::sync::atomic::AtomicUsize::new(4);
    let workers = (0..4u64).map(|t| {
        let (instance, ledger, used, working) = (
            if t % 2 == 0 { &a } else { &other },
            &ledger,
            &used,
            &working,
        );
        async move {
            let mut settled = 0;
            while settled < ROUNDS {
                // Refused only while the watcher holds the rest of the pool for a moment.
                let Some(n) = instance.reserve(pool, UNIT, UNIT, used).await.unwrap() else {
                    tokio::task::yield_now().await;
                    continue;
                };
                assert_eq!(n, UNIT);
                let at = BEFORE_MIDNIGHT - 1_000 * (t * ROUNDS + settled) as i64;
                let usage = event("org_a", at, UsageKind::AudioMs, UNIT);
                instance
                    .settle(
                        ledger,
                        super::shared::Write::Event(&usage),
                        &[("org_a", UsageKind::AudioMs, UNIT)],
                    )
                    .await
                    .unwrap();
                settled += 1;
            }
            working.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    // Everything that is left, reserved and given back at once: what is given out is the
    // quota minus that.
    let watcher = async {
        let mut given_out = 0;
        let mut looks = 0;
        while working.load(std::sync::atomic::Ordering::SeqCst) > 0 {
            let left = a.reserve(pool, QUOTA, 1, &used).await.unwrap().unwrap();
            a.release("org_a", UsageKind::AudioMs, left);
            let now = QUOTA - left;
            assert!(now >= given_out, "given out went from {given_out} to {now}");
            given_out = now;
            looks += 1;
        }
        looks
    };
    let (_, looks) = tokio::join!(futures_util::future::join_all(workers), watcher);
    assert!(looks > 0);
    assert_eq!(used().await.unwrap(), 4 * ROUNDS * UNIT);
    assert_eq!(a.reserved("org_a", UsageKind::AudioMs).await.unwrap(), 0);
    assert_eq!(
        other.reserved("org_a", UsageKind::AudioMs).await.unwrap(),
        0
    );
}

/// A ledger that says when a write is in, then takes a while to return, as a flush does.
struct FlushingLedger {
    store: Arc<dyn Store>,
    written: tokio::sync::mpsc::Sender<()>,
}

#[async_trait::async_trait]
impl UsageSink for FlushingLedger {
    async fn record(&self, event: &UsageEvent) -> Result<(), UsageError> {
        self.store.record(event).await?;
        let _ = self.written.send(()).await;
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        Ok(())
    }

    async fn checkpoint(&self, totals: &[UsageEvent]) -> Result<(), UsageError> {
        self.store.checkpoint(totals).await
    }
}

/// A quota check reads the ledger, then what is held reserved (`Quotas::allowance_for`). On the
/// embedded store a settlement's usage is readable in the ledger before its write returns and
/// its reservation is given back; the check waits for that settlement, so it never sees the
/// work twice, which would refuse work that fits (three 20 s files against a minute got two
/// answers and four 402s). A database settles in one transaction: both or neither are seen.
#[tokio::test]
async fn a_quota_check_never_sees_settling_work_twice() {
    let b = Sled::new();
    let store = b.open().await;
    let (tx, mut rx) = tokio::sync::mpsc::channel(1);
    let ledger = FlushingLedger {
        store: store.clone(),
        written: tx,
    };
    let (shared, _) = b.shared_pair().await;
    let pool = november(UsageKind::AudioMs, 60_000);
    let used = used_of(store.as_ref(), UsageKind::AudioMs);
    assert_eq!(
        shared.reserve(pool, 20_000, 20_000, &used).await.unwrap(),
        Some(20_000)
    );
    let usage = event("org_a", BEFORE_MIDNIGHT, UsageKind::AudioMs, 20_000);
    let settling = async {
        shared
            .settle(
                &ledger,
                super::shared::Write::Event(&usage),
                &[("org_a", UsageKind::AudioMs, 20_000)],
            )
            .await
            .unwrap();
    };
    let checking = async {
        // The usage is in the ledger; the settlement has not returned.
        rx.recv().await.unwrap();
        let in_ledger = used().await.unwrap();
        assert_eq!(in_ledger, 20_000);
        let held = shared.reserved("org_a", UsageKind::AudioMs).await.unwrap();
        assert_eq!(in_ledger + held, 20_000, "the settling work was seen twice");
    };
    tokio::join!(settling, checking);
}

/// A write that fails gives nothing back: the reservation stays held until its owner drops it.
async fn a_failed_settlement_gives_nothing_back(b: &dyn Backend) {
    let store = b.open().await;
    let (a, _) = b.shared_pair().await;
    let pool = november(UsageKind::Tokens, 1_000);
    assert_eq!(
        a.reserve(pool, 600, 600, &none_used()).await.unwrap(),
        Some(600)
    );
    // A ledger that refuses it, or, where the database writes its ledger itself, a text it
    // cannot hold.
    let usage = event("org\0a", BEFORE_MIDNIGHT, UsageKind::Tokens, 100);
    let settled = a
        .settle(
            &Refusing,
            super::shared::Write::Event(&usage),
            &[("org_a", UsageKind::Tokens, 600)],
        )
        .await;
    assert!(settled.is_err());
    assert_eq!(a.reserved("org_a", UsageKind::Tokens).await.unwrap(), 600);
    assert!(store
        .usage_by_day("org_a", "2026-11-01", "2026-11-30")
        .await
        .unwrap()
        .is_empty());
}

/// A ledger that refuses every write.
struct Refusing;

#[async_trait::async_trait]
impl UsageSink for Refusing {
    async fn record(&self, _: &UsageEvent) -> Result<(), UsageError> {
        Err(UsageError::Store("refused".into()))
    }

    async fn checkpoint(&self, _: &[UsageEvent]) -> Result<(), UsageError> {
        Err(UsageError::Store("refused".into()))
    }
}

fn call_head(org: &str, id: &str, started_ms: i64, connector: &str) -> RecordHead {
    RecordHead {
        id: id.into(),
        org_id: org.into(),
        kind: RecordKind::Call,
        started_ms,
        ended_ms: None,
        connector: connector.into(),
        conversation_id: Some("conv-1".into()),
        ani: Some("tel:+15551230000".into()),
        dnis: Some("tel:+15559870000".into()),
        close_reason: None,
        language: Some("en-US".into()),
        channels: vec!["Customer".into(), "Agent".into()],
        billed_ms: 0,
        file_name: None,
        duration: None,
        intent: None,
        analyses: None,
    }
}

fn line(channel: usize, offset: f64, text: &str) -> Line {
    Line {
        channel,
        offset,
        duration: 1.5,
        confidence: 0.9,
        text: text.into(),
    }
}

fn intent_entry(at_ms: i64, intent: &str) -> IntentEntry {
    IntentEntry {
        at_ms,
        result: serde_json::json!({"intents": [{"intent": intent, "confidence": 0.8}], "reasoning": "said so"}),
    }
}

/// Every id of an organisation's records of `kind` that `query` finds, page after page.
async fn all_pages(s: &dyn Store, org: &str, kind: RecordKind, mut query: Query) -> Vec<String> {
    let mut ids = Vec::new();
    for _ in 0..1000 {
        let page = s.records(org, kind, &query).await.unwrap();
        assert!(page.heads.len() <= query.limit);
        ids.extend(page.heads.into_iter().map(|h| h.id));
        match page.next {
            Some(next) => query.after = Some(next),
            None => return ids,
        }
    }
    panic!("a listing that never ends");
}

async fn a_call_is_recorded_as_it_goes_and_resumes_as_one_record(b: &dyn Backend) {
    let s = b.open().await;
    let id = crate::history::call_record_id("org_a", "sess-1");
    s.begin_record(&call_head("org_a", &id, 1_000, "conn_1"))
        .await
        .unwrap();
    // Lines arrive out of order between channels; one is sent twice.
    s.add_lines(
        "org_a",
        &id,
        &[line(1, 2.0, "Thanks for calling."), line(0, 1.0, "Hello?")],
    )
    .await
    .unwrap();
    s.add_lines("org_a", &id, &[line(1, 2.0, "Thanks for calling.")])
        .await
        .unwrap();
    s.add_intent("org_a", &id, &intent_entry(1_500, "billing_question"))
        .await
        .unwrap();
    s.add_intent("org_a", &id, &intent_entry(1_700, "cancel_service"))
        .await
        .unwrap();
    s.end_record("org_a", &id, 5_000, "end", 4_000)
        .await
        .unwrap();
    // Another organisation sees nothing of it, and cannot write to or erase it.
    assert_eq!(s.load_record("org_b", &id).await.unwrap(), None);
    s.add_lines("org_b", &id, &[line(0, 9.0, "intruder")])
        .await
        .unwrap();
    assert!(!s.delete_record("org_b", &id).await.unwrap());

    let r = s.load_record("org_a", &id).await.unwrap().unwrap();
    assert_eq!(r.head.started_ms, 1_000);
    assert_eq!(r.head.ended_ms, Some(5_000));
    assert_eq!(r.head.close_reason.as_deref(), Some("end"));
    assert_eq!(r.head.billed_ms, 4_000);
    assert_eq!(r.head.intent.as_deref(), Some("cancel_service"));
    assert_eq!(r.head.ani.as_deref(), Some("tel:+15551230000"));
    assert_eq!(
        r.transcript,
        [line(0, 1.0, "Hello?"), line(1, 2.0, "Thanks for calling.")]
    );
    assert_eq!(
        r.intents,
        [
            intent_entry(1_500, "billing_question"),
            intent_entry(1_700, "cancel_service")
        ]
    );

    // The call moves to another instance: a new session of the same call.
    let mut resumed = call_head("org_a", &id, 9_000, "conn_1");
    resumed.conversation_id = Some("conv-1".into());
    s.begin_record(&resumed).await.unwrap();
    let r = s.load_record("org_a", &id).await.unwrap().unwrap();
    assert_eq!(r.head.started_ms, 1_000, "the call keeps its start");
    assert_eq!(r.head.ended_ms, None, "it is in progress again");
    assert_eq!(r.head.billed_ms, 4_000);
    assert_eq!(r.transcript.len(), 2);
    s.add_lines("org_a", &id, &[line(0, 70.0, "Still there?")])
        .await
        .unwrap();
    s.end_record("org_a", &id, 12_000, "disconnect", 3_000)
        .await
        .unwrap();
    let r = s.load_record("org_a", &id).await.unwrap().unwrap();
    assert_eq!(r.head.billed_ms, 7_000, "both sessions' audio");
    assert_eq!(r.transcript.len(), 3);
    assert_eq!(r.head.ended_ms, Some(12_000));
    let listed = all_pages(
        s.as_ref(),
        "org_a",
        RecordKind::Call,
        Query {
            limit: 10,
            ..Query::default()
        },
    )
    .await;
    assert_eq!(
        listed,
        std::slice::from_ref(&id),
        "one record, not one per session"
    );

    // Lines for a record that is not there are not kept.
    s.add_lines(
        "org_a",
        "call_000000000000000000000000",
        &[line(0, 1.0, "ghost")],
    )
    .await
    .unwrap();
    assert_eq!(
        s.load_record("org_a", "call_000000000000000000000000")
            .await
            .unwrap(),
        None
    );
}

async fn history_lists_newest_first_with_filters_search_and_pages(b: &dyn Backend) {
    let s = b.open().await;
    let mut ids = Vec::new();
    for i in 0..25i64 {
        let id = crate::history::call_record_id("org_a", &format!("s{i}"));
        let connector = if i % 2 == 0 { "conn_even" } else { "conn_odd" };
        // Two records in each millisecond: ties are broken by id.
        s.begin_record(&call_head("org_a", &id, 10_000 + i / 2, connector))
            .await
            .unwrap();
        let said = if i % 3 == 0 {
            format!("I want a Refund for order {i}, please.")
        } else {
            format!("Just checking my balance, call {i}.")
        };
        s.add_lines(
            "org_a",
            &id,
            &[line(0, 0.5, &said), line(1, 3.0, "Sure, one moment.")],
        )
        .await
        .unwrap();
        let intent = if i % 3 == 0 {
            "refund_request"
        } else {
            "balance_inquiry"
        };
        s.add_intent("org_a", &id, &intent_entry(20_000, intent))
            .await
            .unwrap();
        ids.push((10_000 + i / 2, id));
    }
    // Another organisation says the same words.
    let theirs = crate::history::call_record_id("org_b", "s0");
    s.begin_record(&call_head("org_b", &theirs, 10_005, "conn_even"))
        .await
        .unwrap();
    s.add_lines("org_b", &theirs, &[line(0, 0.5, "refund refund")])
        .await
        .unwrap();
    // A file of org_a, which a listing of calls does not show.
    let file = Record {
        head: RecordHead {
            id: crate::history::file_record_id(),
            kind: RecordKind::File,
            file_name: Some("call.wav".into()),
            duration: Some(12.5),
            ended_ms: Some(30_001),
            billed_ms: 12_500,
            ..call_head("org_a", "", 30_000, "key_1")
        },
        transcript: vec![line(0, 0.0, "A refund for the file.")],
        intents: Vec::new(),
    };
    s.put_record(&file).await.unwrap();

    let mut newest_first = ids.clone();
    newest_first.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let expected: Vec<String> = newest_first.iter().map(|(_, id)| id.clone()).collect();
    let q = |limit| Query {
        limit,
        ..Query::default()
    };
    for limit in [1, 7, 25, 100] {
        assert_eq!(
            all_pages(s.as_ref(), "org_a", RecordKind::Call, q(limit)).await,
            expected,
            "pages of {limit}"
        );
    }
    let first = s.records("org_a", RecordKind::Call, &q(5)).await.unwrap();
    assert_eq!(first.heads.len(), 5);
    assert!(first.heads.iter().all(|h| h.org_id == "org_a"));
    assert!(first.next.is_some());

    let refunds: Vec<String> = expected
        .iter()
        .enumerate()
        .filter(|_| true)
        .map(|(_, id)| id.clone())
        .filter(|id| ids.iter().position(|(_, x)| x == id).unwrap() % 3 == 0)
        .collect();
    let search = |words: &str, limit| Query {
        words: crate::history::query_words(words),
        limit,
        ..Query::default()
    };
    // Whole words, any case, every word.
    for limit in [2, 100] {
        assert_eq!(
            all_pages(
                s.as_ref(),
                "org_a",
                RecordKind::Call,
                search("REFUND", limit)
            )
            .await,
            refunds
        );
    }
    assert_eq!(
        all_pages(
            s.as_ref(),
            "org_a",
            RecordKind::Call,
            search("refund order 9", 100)
        )
        .await,
        [ids[9].1.clone()]
    );
    assert!(
        all_pages(
            s.as_ref(),
            "org_a",
            RecordKind::Call,
            search("refund balance", 100)
        )
        .await
        .is_empty(),
        "every word must appear"
    );
    assert!(
        all_pages(s.as_ref(), "org_a", RecordKind::Call, search("refu", 100))
            .await
            .is_empty()
    );
    // Words said by either channel.
    assert_eq!(
        all_pages(
            s.as_ref(),
            "org_a",
            RecordKind::Call,
            search("moment refund", 100)
        )
        .await,
        refunds
    );
    assert_eq!(
        all_pages(s.as_ref(), "org_b", RecordKind::Call, search("refund", 100)).await,
        std::slice::from_ref(&theirs)
    );
    assert_eq!(
        all_pages(s.as_ref(), "org_a", RecordKind::File, search("refund", 100)).await,
        std::slice::from_ref(&file.head.id)
    );

    // Filters, alone and together.
    let by_connector = Query {
        connector: Some("conn_odd".into()),
        limit: 4,
        ..Query::default()
    };
    let odd: Vec<String> = expected
        .iter()
        .filter(|id| ids.iter().position(|(_, x)| x == *id).unwrap() % 2 == 1)
        .cloned()
        .collect();
    assert_eq!(
        all_pages(s.as_ref(), "org_a", RecordKind::Call, by_connector).await,
        odd
    );
    let by_intent = Query {
        intent: Some("refund_request".into()),
        limit: 3,
        ..Query::default()
    };
    assert_eq!(
        all_pages(s.as_ref(), "org_a", RecordKind::Call, by_intent).await,
        refunds
    );
    let window = Query {
        from_ms: Some(10_002),
        to_ms: Some(10_004),
        limit: 100,
        ..Query::default()
    };
    let in_window: Vec<String> = newest_first
        .iter()
        .filter(|(ms, _)| (10_002..10_004).contains(ms))
        .map(|(_, id)| id.clone())
        .collect();
    assert_eq!(in_window.len(), 4);
    assert_eq!(
        all_pages(s.as_ref(), "org_a", RecordKind::Call, window).await,
        in_window
    );
    let together = Query {
        words: crate::history::query_words("refund"),
        connector: Some("conn_even".into()),
        from_ms: Some(10_003),
        limit: 1,
        ..Query::default()
    };
    let both: Vec<String> = newest_first
        .iter()
        .filter(|(ms, id)| {
            let i = ids.iter().position(|(_, x)| x == id).unwrap();
            *ms >= 10_003 && i % 6 == 0
        })
        .map(|(_, id)| id.clone())
        .collect();
    assert!(!both.is_empty());
    assert_eq!(
        all_pages(s.as_ref(), "org_a", RecordKind::Call, together).await,
        both
    );
    // A file's record holds what was put.
    assert_eq!(
        s.load_record("org_a", &file.head.id).await.unwrap(),
        Some(file.clone())
    );
}

async fn erasure_and_retention_leave_nothing_behind(b: &dyn Backend) {
    let plans: BTreeMap<String, crate::config::Plan> = BTreeMap::from([
        (
            "free".to_owned(),
            crate::config::Plan {
                retention_days: Some(30),
                ..crate::config::Plan::unlimited()
            },
        ),
        ("enterprise".to_owned(), crate::config::Plan::unlimited()),
    ]);
    const DAY: i64 = 86_400_000;
    let now = 100 * DAY;
    let mut shorter = org("org_short");
    shorter.history.retention_days = Some(7);
    let mut forever = org("org_forever");
    forever.plan = "enterprise".into();
    let ids = {
        let s = b.open().await;
        let mut ids = BTreeMap::new();
        // Each organisation's words are its own (`zanzibar{age}x{n}`), so the raw view can tell
        // an erased record's words from a kept one's.
        for (n, o) in [org("org_a"), shorter, forever].into_iter().enumerate() {
            s.insert_org(&o).await.unwrap();
            for age_days in [1, 10, 40, 400] {
                let id = crate::history::call_record_id(&o.id, &format!("age{age_days}"));
                s.begin_record(&call_head(&o.id, &id, now - age_days * DAY, "conn_1"))
                    .await
                    .unwrap();
                s.add_lines(
                    &o.id,
                    &id,
                    &[line(
                        0,
                        1.0,
                        &format!("zanzibar{age_days}x{n} secret words"),
                    )],
                )
                .await
                .unwrap();
                s.add_intent(&o.id, &id, &intent_entry(now, "other"))
                    .await
                    .unwrap();
                ids.insert((o.id.clone(), age_days), id);
            }
        }
        // Erasure on request.
        let gone = &ids[&("org_a".to_owned(), 1)];
        assert!(s.delete_record("org_a", gone).await.unwrap());
        assert!(!s.delete_record("org_a", gone).await.unwrap());
        assert_eq!(s.load_record("org_a", gone).await.unwrap(), None);
        let search = |w: &str| Query {
            words: crate::history::query_words(w),
            limit: 100,
            ..Query::default()
        };
        assert!(s
            .records("org_a", RecordKind::Call, &search("zanzibar1x0"))
            .await
            .unwrap()
            .heads
            .is_empty());
        // The purge, at a chosen time, twice at once (two instances), then again.
        let (a, b2) = tokio::join!(
            crate::store::archive::purge_expired(s.as_ref(), &plans, now),
            crate::store::archive::purge_expired(s.as_ref(), &plans, now),
        );
        let erased = a.unwrap() + b2.unwrap();
        // org_a (30 days): 40 and 400; org_short (7 days): 10, 40, 400; org_forever: none.
        assert_eq!(erased, 5, "each record erased once");
        assert_eq!(
            crate::store::archive::purge_expired(s.as_ref(), &plans, now)
                .await
                .unwrap(),
            0
        );
        for ((org_id, age), id) in &ids {
            let (n, kept) = match org_id.as_str() {
                "org_a" => (0, *age == 10),
                "org_short" => (1, *age == 1),
                _ => (2, true),
            };
            assert_eq!(
                s.load_record(org_id, id).await.unwrap().is_some(),
                kept,
                "{org_id} {age} days"
            );
            let found = s
                .records(
                    org_id,
                    RecordKind::Call,
                    &search(&format!("zanzibar{age}x{n}")),
                )
                .await
                .unwrap()
                .heads;
            assert_eq!(
                found.len(),
                usize::from(kept),
                "{org_id} {age} days, search"
            );
        }
        // At most `most` per pass.
        assert_eq!(s.purge_records("org_forever", now, 2).await.unwrap(), 2);
        assert_eq!(s.purge_records("org_forever", now, 10).await.unwrap(), 2);
        ids
    };
    // Nothing of an erased record is left in the store.
    let raw = b.raw().await;
    assert!(
        contains(&raw, b"zanzibar10x0"),
        "the raw view sees what is kept"
    );
    for word in [
        "zanzibar1x0",
        "zanzibar40x0",
        "zanzibar400x0",
        "zanzibar10x1",
        "zanzibar40x1",
        "zanzibar400x1",
    ] {
        assert!(
            !contains(&raw, word.as_bytes()),
            "{word} is still in the store"
        );
    }
    assert!(!contains(&raw, ids[&("org_a".to_owned(), 1)].as_bytes()));
}

async fn a_last_page_has_no_cursor(b: &dyn Backend) {
    let s = b.open().await;
    // One organisation alone in the store: its listing runs to the store's end.
    s.insert_org(&org("org_z")).await.unwrap();
    for i in 0..3 {
        let id = crate::history::call_record_id("org_z", &format!("s{i}"));
        s.begin_record(&call_head("org_z", &id, 1_000 + i, "conn_1"))
            .await
            .unwrap();
    }
    let page = |limit| Query {
        limit,
        ..Query::default()
    };
    let all = s
        .records("org_z", RecordKind::Call, &page(10))
        .await
        .unwrap();
    assert_eq!(all.heads.len(), 3);
    assert_eq!(all.next, None, "the last page says so");
    let first = s
        .records("org_z", RecordKind::Call, &page(2))
        .await
        .unwrap();
    assert_eq!(first.heads.len(), 2);
    let rest = Query {
        after: first.next.clone(),
        ..page(2)
    };
    let second = s.records("org_z", RecordKind::Call, &rest).await.unwrap();
    assert_eq!(second.heads.len(), 1);
    assert_eq!(second.next, None);
    assert!(s
        .records("org_z", RecordKind::File, &page(10))
        .await
        .unwrap()
        .next
        .is_none());
}

macro_rules! on_every_backend {
    ($($name:ident),* $(,)?) => {
        mod sled_backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(&super::Sled::new()).await;
                }
            )*
        }
        mod postgres_backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(&super::Postgres::new()).await;
                }
            )*
        }
    };
}

on_every_backend!(
    running_totals_are_written_over_and_days_grow_by_the_difference,
    orgs_round_trip_with_sealed_mcp_headers,
    ledger_and_daily_totals_agree,
    concurrent_charges_are_all_recorded,
    api_keys_resolve_by_hash_and_revoke,
    connector_secret_is_sealed_and_rotates,
    dashboard_users_are_unique_by_email,
    copy_moves_everything,
    shared_entries_are_seen_by_every_instance,
    a_rate_budget_is_one_across_instances,
    places_are_capped_over_every_instance,
    keys_and_connectors_are_capped_per_organisation,
    reservations_never_share_a_remainder,
    settling_is_one_step_to_a_reservation,
    a_failed_settlement_gives_nothing_back,
    a_call_is_recorded_as_it_goes_and_resumes_as_one_record,
    history_lists_newest_first_with_filters_search_and_pages,
    erasure_and_retention_leave_nothing_behind,
    a_last_page_has_no_cursor,
);

/// An instance that stops beating (it crashed) no longer holds its reservations; one that
/// exits gracefully gives them back at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservations_of_a_gone_instance_are_freed() {
    let url = Cluster::shared().fresh_database();
    let open = || async {
        let s = PgStore::open(&url, 2, SecretBox::new(&[3; KEY_LEN]))
            .await
            .unwrap();
        s.start_instance().await;
        s
    };
    let (graceful, observer) = (open().await, open().await);
    // What a crashed instance leaves behind: its row, beating until a moment ago, and its
    // reservation.
    let client = client(&url).await;
    client
        .batch_execute(
            "INSERT INTO instances (id, started_ms, heartbeat_ms)
                 VALUES ('inst_crashed', 0, (extract(epoch from clock_timestamp()) * 1000)::bigint);
             INSERT INTO reservations VALUES ('inst_crashed', 'org_a', 97, 20000);",
        )
        .await
        .unwrap();
    let pool = november(UsageKind::AudioMs, 60_000);
    assert_eq!(UsageKind::AudioMs.tag(), b'a'); // 97 above
    assert_eq!(
        graceful
            .reserve(pool, 30_000, 1, &none_used())
            .await
            .unwrap(),
        Some(30_000)
    );
    assert_eq!(
        observer
            .reserved("org_a", UsageKind::AudioMs)
            .await
            .unwrap(),
        50_000
    );
    assert_eq!(
        observer
            .reserve(pool, 60_000, 1, &none_used())
            .await
            .unwrap(),
        Some(10_000)
    );
    observer.release("org_a", UsageKind::AudioMs, 10_000);
    graceful.stop_instance().await;
    assert_eq!(
        observer
            .reserved("org_a", UsageKind::AudioMs)
            .await
            .unwrap(),
        20_000
    );
    // The crashed instance's heartbeat grows old: its reservation no longer counts, and the
    // next sweep deletes its rows.
    client
        .execute(
            "UPDATE instances SET heartbeat_ms = heartbeat_ms - 60000 WHERE id = 'inst_crashed'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        observer
            .reserved("org_a", UsageKind::AudioMs)
            .await
            .unwrap(),
        0
    );
    tokio::time::sleep(std::time::Duration::from_millis(2_500)).await;
    let left: i64 = client
        .query_one(
            "SELECT count(*) FROM reservations WHERE instance_id = 'inst_crashed'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0);
    assert_eq!(
        observer
            .reserve(pool, 60_000, 1, &none_used())
            .await
            .unwrap(),
        Some(60_000)
    );
}

/// Migrations are recorded by the migrator and applied once; a database that records a
/// version this build does not know is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_apply_once_and_a_newer_schema_is_refused() {
    let url = Cluster::shared().fresh_database();
    let open = || PgStore::open(&url, 1, SecretBox::new(&[1; KEY_LEN]));
    drop(open().await.unwrap());
    // Opening again applies nothing and keeps the data.
    let s = open().await.unwrap();
    s.insert_org(&org("org_a")).await.unwrap();
    drop(s);
    let config: tokio_postgres::Config = url.parse().unwrap();
    assert_eq!(
        super::postgres::migrate::migrate(&config).await.unwrap(),
        Vec::<i32>::new()
    );
    let client = client(&url).await;
    let versions: Vec<i32> = client
        .query(
            "SELECT version FROM refinery_schema_history ORDER BY version",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let known: Vec<i32> = super::postgres::MIGRATIONS.iter().map(|m| m.0).collect();
    assert_eq!(versions, known);
    assert!(open().await.unwrap().org("org_a").await.unwrap().is_some());
    client
        .execute(
            "INSERT INTO refinery_schema_history (version, name, applied_on, checksum)
             VALUES (9999, 'from_the_future', '2030-01-01T00:00:00Z', '1')",
            &[],
        )
        .await
        .unwrap();
    let refused = open().await;
    assert!(
        matches!(&refused, Err(StoreError::Backend(m)) if m.contains("newer")),
        "{:?}",
        refused.err()
    );
}

/// A database migrated before the migrator kept its versions in `schema_migrations`: it is
/// taken as it is (nothing applied again), and what is newer is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_migrated_by_hand_rolled_versions_is_taken_over() {
    let url = Cluster::shared().fresh_database();
    let client = client(&url).await;
    // The schema as the earlier builds left it at version 2, with a record in it.
    client
        .batch_execute(include_str!("migrations/V1__initial.sql"))
        .await
        .unwrap();
    client
        .batch_execute(include_str!("migrations/V2__shared_state.sql"))
        .await
        .unwrap();
    client
        .batch_execute(
            "CREATE TABLE schema_migrations (
                 version integer PRIMARY KEY, description text NOT NULL,
                 applied_at timestamptz NOT NULL DEFAULT now());
             INSERT INTO schema_migrations (version, description) VALUES (1, 'a'), (2, 'b');",
        )
        .await
        .unwrap();
    let before = PgStore::open(&url, 1, SecretBox::new(&[1; KEY_LEN]))
        .await
        .unwrap();
    before.insert_org(&org("org_a")).await.unwrap();
    // Version 3 was applied: its function is there.
    let reserved = before
        .reserve(november(UsageKind::Tokens, 10), 5, 1, &none_used())
        .await
        .unwrap();
    assert_eq!(reserved, Some(5));
    let versions: Vec<i32> = client
        .query(
            "SELECT version FROM refinery_schema_history ORDER BY version",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    // The takeover and every version after it.
    assert_eq!(versions, [1, 2, 3, 4, 5, 6]);
}

#[tokio::test]
async fn an_unreachable_database_is_an_error_not_a_hang() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let opened = PgStore::open(
        &format!("postgres://nobody@127.0.0.1:{port}/none?connect_timeout=2"),
        1,
        SecretBox::new(&[1; KEY_LEN]),
    )
    .await;
    assert!(matches!(opened, Err(StoreError::Backend(_))));
}
