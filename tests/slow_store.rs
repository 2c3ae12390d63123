//! A store that answers slowly (a database far away) holds no runtime worker: on a runtime
//! with one worker, while a request waits a second on the store, other requests are served.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use callstream::history::{IntentEntry, Line, Page, Query, Record, RecordHead, RecordKind};
use callstream::store::archive::Archive;
use callstream::store::{
    ApiKey, Connector, DashboardUser, DayUsage, Org, SecretBox, SharedState, SledStore, Store,
    StoreError,
};
use callstream_actors::usage::{UsageError, UsageEvent, UsageSink};
use warp::Filter;

/// How long every call of [`Slow`] takes.
const SLOW: Duration = Duration::from_secs(1);

/// A real store whose every call first waits [`SLOW`]; says when a call starts and ends.
struct Slow {
    inner: SledStore,
    started: tokio::sync::mpsc::UnboundedSender<()>,
    in_call: AtomicBool,
}

impl Slow {
    async fn wait(&self) {
        self.in_call.store(true, Ordering::SeqCst);
        let _ = self.started.send(());
        tokio::time::sleep(SLOW).await;
        self.in_call.store(false, Ordering::SeqCst);
    }
}

#[async_trait::async_trait]
impl Store for Slow {
    async fn insert_user(&self, user: &DashboardUser) -> Result<(), StoreError> {
        self.wait().await;
        self.inner.insert_user(user).await
    }
    async fn user(&self, email: &str) -> Result<Option<DashboardUser>, StoreError> {
        self.wait().await;
        self.inner.user(email).await
    }
    async fn users(&self) -> Result<Vec<DashboardUser>, StoreError> {
        self.wait().await;
        self.inner.users().await
    }
    async fn insert_org(&self, org: &Org) -> Result<(), StoreError> {
        self.wait().await;
        self.inner.insert_org(org).await
    }
    async fn update_org(&self, org: &Org) -> Result<(), StoreError> {
        self.wait().await;
        self.inner.update_org(org).await
    }
    async fn org(&self, id: &str) -> Result<Option<Org>, StoreError> {
        self.wait().await;
        self.inner.org(id).await
    }
    async fn orgs(&self) -> Result<Vec<Org>, StoreError> {
        self.wait().await;
        self.inner.orgs().await
    }
    async fn insert_api_key(&self, key: &ApiKey, most: usize) -> Result<(), StoreError> {
        self.wait().await;
        self.inner.insert_api_key(key, most).await
    }
    async fn revoke_api_key(&self, id: &str, at_ms: i64) -> Result<ApiKey, StoreError> {
        self.wait().await;
        self.inner.revoke_api_key(id, at_ms).await
    }
    async fn api_key(&self, id: &str) -> Result<Option<ApiKey>, StoreError> {
        self.wait().await;
        self.inner.api_key(id).await
    }
    async fn api_key_by_hash(&self, hash: &[u8; 32]) -> Result<Option<ApiKey>, StoreError> {
        self.wait().await;
        self.inner.api_key_by_hash(hash).await
    }
    async fn api_keys(&self, org_id: &str) -> Result<Vec<ApiKey>, StoreError> {
        self.wait().await;
        self.inner.api_keys(org_id).await
    }
    async fn insert_connector(
        &self,
        c: &Connector,
        secret: &[u8],
        most: usize,
    ) -> Result<(), StoreError> {
        self.wait().await;
        self.inner.insert_connector(c, secret, most).await
    }
    async fn rotate_connector(
        &self,
        client_id: &str,
        secret: &[u8],
        at_ms: i64,
    ) -> Result<Connector, StoreError> {
        self.wait().await;
        self.inner.rotate_connector(client_id, secret, at_ms).await
    }
    async fn revoke_connector(&self, client_id: &str, at_ms: i64) -> Result<Connector, StoreError> {
        self.wait().await;
        self.inner.revoke_connector(client_id, at_ms).await
    }
    async fn connector(&self, client_id: &str) -> Result<Option<(Connector, Vec<u8>)>, StoreError> {
        self.wait().await;
        self.inner.connector(client_id).await
    }
    async fn connectors(&self, org_id: &str) -> Result<Vec<Connector>, StoreError> {
        self.wait().await;
        self.inner.connectors(org_id).await
    }
    async fn usage_by_day(
        &self,
        org_id: &str,
        from: &str,
        to: &str,
    ) -> Result<Vec<DayUsage>, StoreError> {
        self.wait().await;
        self.inner.usage_by_day(org_id, from, to).await
    }
    async fn usage_events(
        &self,
        org_id: &str,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<Vec<UsageEvent>, StoreError> {
        self.wait().await;
        self.inner.usage_events(org_id, from_ms, to_ms).await
    }
}

#[async_trait::async_trait]
impl Archive for Slow {
    async fn begin_record(&self, head: &RecordHead) -> Result<(), StoreError> {
        self.wait().await;
        self.inner.begin_record(head).await
    }
    async fn add_lines(&self, org_id: &str, id: &str, lines: &[Line]) -> Result<(), StoreError> {
        self.wait().await;
        self.inner.add_lines(org_id, id, lines).await
    }
    async fn add_intent(
        &self,
        org_id: &str,
        id: &str,
        entry: &IntentEntry,
    ) -> Result<(), StoreError> {
        self.wait().await;
        self.inner.add_intent(org_id, id, entry).await
    }
    async fn end_record(
        &self,
        org_id: &str,
        id: &str,
        ended_ms: i64,
        close_reason: &str,
        billed_ms: u64,
    ) -> Result<(), StoreError> {
        self.wait().await;
        self.inner
            .end_record(org_id, id, ended_ms, close_reason, billed_ms)
            .await
    }
    async fn put_record(&self, record: &Record) -> Result<(), StoreError> {
        self.wait().await;
        self.inner.put_record(record).await
    }
    async fn load_record(&self, org_id: &str, id: &str) -> Result<Option<Record>, StoreError> {
        self.wait().await;
        self.inner.load_record(org_id, id).await
    }
    async fn records(
        &self,
        org_id: &str,
        kind: RecordKind,
        query: &Query,
    ) -> Result<Page, StoreError> {
        self.wait().await;
        self.inner.records(org_id, kind, query).await
    }
    async fn delete_record(&self, org_id: &str, id: &str) -> Result<bool, StoreError> {
        self.wait().await;
        self.inner.delete_record(org_id, id).await
    }
    async fn purge_records(
        &self,
        org_id: &str,
        before_ms: i64,
        most: usize,
    ) -> Result<usize, StoreError> {
        self.wait().await;
        self.inner.purge_records(org_id, before_ms, most).await
    }
}

#[async_trait::async_trait]
impl UsageSink for Slow {
    async fn record(&self, event: &UsageEvent) -> Result<(), UsageError> {
        self.wait().await;
        self.inner.record(event).await
    }
    async fn checkpoint(&self, totals: &[UsageEvent]) -> Result<(), UsageError> {
        self.wait().await;
        self.inner.checkpoint(totals).await
    }
}

#[test]
fn a_request_waiting_on_a_slow_store_holds_no_worker() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let secrets = SecretBox::new(&[3; callstream::store::crypto::KEY_LEN]);
        let inner = SledStore::open(dir.path(), secrets).unwrap();
        let config =
            Arc::new(callstream::config::Config::load_with_env(None, std::iter::empty()).unwrap());
        // An organisation and a key, written before the store turns slow.
        let admin = callstream::admin::Admin::new(
            config.clone(),
            Arc::new(inner.clone()),
            Arc::new(callstream::store::shared::Local::default()),
        );
        let callstream::admin::AdminResponse::Org(org) = admin
            .execute(callstream::admin::AdminRequest::OrgCreate {
                name: "Acme".into(),
                plan: None,
            })
            .await
            .unwrap()
        else {
            panic!("an organisation")
        };
        let callstream::admin::AdminResponse::KeyCreated { secret, .. } = admin
            .execute(callstream::admin::AdminRequest::KeyCreate {
                org: org.id,
                name: None,
            })
            .await
            .unwrap()
        else {
            panic!("a key")
        };

        let (started, mut calls) = tokio::sync::mpsc::unbounded_channel();
        let slow = Arc::new(Slow {
            inner,
            started,
            in_call: AtomicBool::new(false),
        });
        let shared: Arc<dyn SharedState> = Arc::new(callstream::store::shared::Local::default());
        let quotas = callstream::usage::Quotas::new(config.clone(), slow.clone(), shared.clone());
        let auth = Arc::new(callstream::auth::Authenticator::new(
            config,
            slow.clone(),
            quotas,
            shared,
        ));
        // `/slow` authenticates its caller (a store round trip); `/fast` needs nothing.
        let authenticated =
            warp::path("slow")
                .and(warp::header("x-api-key"))
                .then(move |key: String| {
                    let auth = auth.clone();
                    async move {
                        let known = auth.authenticate(Some(&key)).await.is_ok();
                        format!("{known}")
                    }
                });
        let fast = warp::path("fast").map(|| "served".to_owned());
        let (addr, serving) =
            warp::serve(authenticated.or(fast).unify()).bind_ephemeral(([127, 0, 0, 1], 0));
        tokio::spawn(serving);

        let client = reqwest::Client::new();
        let waiting = tokio::spawn({
            let client = client.clone();
            async move {
                client
                    .get(format!("http://{addr}/slow"))
                    .header("x-api-key", secret)
                    .send()
                    .await
                    .unwrap()
                    .text()
                    .await
                    .unwrap()
            }
        });
        // The slow request is inside the store: the one worker is free to serve another.
        calls.recv().await.unwrap();
        let served = client
            .get(format!("http://{addr}/fast"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert_eq!(served, "served");
        assert!(
            slow.in_call.load(Ordering::SeqCst),
            "the other request was served only once the store had answered"
        );
        assert!(!waiting.is_finished());
        // And the slow one is answered in the end, by the real store behind.
        assert_eq!(waiting.await.unwrap(), "true");
    });
}
