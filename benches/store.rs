//! The costs on every request and every charge: resolving an API key (hash + two lookups),
//! the GCRA rate check, and a durable ledger append (transaction + flush to disk). The store is
//! async, so each call runs to its end on a tokio runtime, as a request's would (sled's calls
//! on the runtime's blocking threads).

use std::sync::Arc;
use std::time::Instant;

use callstream::admin::{Admin, AdminRequest, AdminResponse};
use callstream::auth::Authenticator;
use callstream::config::Config;
use callstream::ratelimit::RateLimiter;
use callstream::store::open as open_store;
use callstream_actors::usage::{UsageEvent, UsageKind, UsageSource};
use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

/// The store and the edge's checks, without the engines.
struct Parts {
    admin: Admin,
    auth: Authenticator,
    store: Arc<dyn callstream::store::Store>,
}

fn parts(runtime: &tokio::runtime::Runtime, dir: &std::path::Path) -> Parts {
    let env = [(
        "CALLSTREAM_STORAGE__DATA_DIR".to_owned(),
        dir.display().to_string(),
    )];
    let config = Arc::new(Config::load_with_env(None, env).expect("config"));
    let opened = runtime
        .block_on(open_store(&config.storage))
        .expect("store");
    let store = opened.store;
    Parts {
        admin: Admin::new(config.clone(), store.clone(), opened.shared.clone()),
        auth: Authenticator::new(
            config.clone(),
            store.clone(),
            callstream::usage::Quotas::new(config, store.clone(), opened.shared.clone()),
            opened.shared,
        ),
        store,
    }
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let app = parts(&runtime, dir.path());
    let AdminResponse::Org(org) = runtime
        .block_on(app.admin.execute(AdminRequest::OrgCreate {
            name: "Bench".into(),
            plan: Some("enterprise".into()),
        }))
        .unwrap()
    else {
        unreachable!("org create answers with the org")
    };
    let AdminResponse::KeyCreated { secret, .. } = runtime
        .block_on(app.admin.execute(AdminRequest::KeyCreate {
            org: org.id.clone(),
            name: None,
        }))
        .unwrap()
    else {
        unreachable!("key create answers with the key")
    };

    let mut group = c.benchmark_group("edge");
    group.throughput(Throughput::Elements(1));
    group.bench_function("authenticate", |b| {
        b.iter(|| {
            runtime
                .block_on(app.auth.authenticate(black_box(Some(secret.as_str()))))
                .unwrap()
        })
    });
    for keys in [1usize, 1000] {
        let limiter = RateLimiter::default();
        let names: Vec<String> = (0..keys).map(|i| format!("key_{i}")).collect();
        let mut i = 0;
        group.bench_with_input(BenchmarkId::new("rate_check", keys), &keys, |b, _| {
            b.iter(|| {
                i = (i + 1) % names.len();
                let _ = limiter.check(black_box(&names[i]), u32::MAX, Instant::now());
            })
        });
    }
    group.finish();

    let store = Arc::clone(&app.store);
    let mut group = c.benchmark_group("ledger");
    group.throughput(Throughput::Elements(1));
    group.sample_size(20);
    group.bench_function("record_durable", |b| {
        b.iter(|| {
            runtime
                .block_on(store.record(black_box(&UsageEvent {
                    org_id: org.id.clone(),
                    key_id: "key_bench".into(),
                    end_user: None,
                    kind: UsageKind::Tokens,
                    amount: 42,
                    source: UsageSource::Chat,
                    at_ms: callstream::clock::now_ms(),
                    call_id: None,
                })))
                .unwrap()
        })
    });
    // The billing actor's write each second: the running totals of 1,000 calls in progress,
    // one transaction and one flush to disk.
    let started = callstream::clock::now_ms();
    let mut second = 0u64;
    group.throughput(Throughput::Elements(1000));
    group.bench_function("checkpoint_1000_calls", |b| {
        b.iter(|| {
            second += 1;
            let totals: Vec<UsageEvent> = (0..1000)
                .map(|i| UsageEvent {
                    org_id: org.id.clone(),
                    key_id: "cc_bench".into(),
                    end_user: None,
                    kind: UsageKind::AudioMs,
                    amount: second * 1000,
                    source: UsageSource::Callstream,
                    at_ms: started,
                    call_id: Some(format!("call_{i}")),
                })
                .collect();
            runtime
                .block_on(store.checkpoint(black_box(&totals)))
                .unwrap()
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
