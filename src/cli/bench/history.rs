//! `bench history`: search over the call history at size. Fills the configured store (sled in
//! a temporary directory, or the configured PostgreSQL: use a scratch database) with calls of
//! realistic length whose lines are turns of the labelled set's dialogues, then times
//! `GET /api/calls` over loopback: with one word, with two words said together, with a name
//! (a rare word) alone and beside a common word, and without words (the newest page, and
//! filtered by intent).

use super::*;

/// Requests to time: each a list of query parameters.
type Queries = Vec<Vec<(&'static str, String)>>;

/// A small deterministic generator: the same fill for the same arguments.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const SYLLABLES: [&str; 40] = [
    "bar", "ken", "lo", "mi", "sa", "tor", "vin", "del", "ra", "quin", "fa", "mont", "ger", "ha",
    "lis", "nor", "pe", "stan", "ul", "wes", "zan", "bri", "cor", "dan", "el", "fio", "gal", "hol",
    "ister", "jor", "kal", "lun", "mar", "nev", "ost", "pra", "rus", "sel", "tam", "vor",
];

/// A caller's surname: one of 1,600, so that each is said in few calls (the rare words of a
/// real archive: names, streets, products).
fn surname(rng: &mut Rng) -> String {
    format!(
        "{}{}",
        SYLLABLES[rng.below(SYLLABLES.len())],
        SYLLABLES[rng.below(SYLLABLES.len())]
    )
}

/// The turns of a labelled set's dialogues: (channel, text).
fn turns(set: &std::path::Path) -> anyhow::Result<Vec<(usize, String)>> {
    let path = set.join("calls.txt");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let turns: Vec<(usize, String)> = text
        .lines()
        .filter_map(|l| {
            if let Some(t) = l.strip_prefix("C:") {
                Some((0, t.trim().to_owned()))
            } else {
                l.strip_prefix("A:").map(|t| (1, t.trim().to_owned()))
            }
        })
        .collect();
    anyhow::ensure!(!turns.is_empty(), "{} has no turns", path.display());
    Ok(turns)
}

pub(super) fn history(
    config: &Config,
    calls: usize,
    lines: usize,
    searches: usize,
    set: &std::path::Path,
    record: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    use callstream::history::{Line, Record, RecordHead, RecordKind};
    let turns = turns(set)?;
    let intents = [
        "billing_inquiry",
        "order_status",
        "technical_support",
        "cancellation",
        "sales_inquiry",
        "other",
    ];
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let dir = tempfile_dir()?;
        let mut config = config.clone();
        config.storage.data_dir = dir.clone();
        let backend = bench_store(&mut config);
        // No request rate limit: the bench times the search, one request after another.
        config.plans.insert("bench".into(), callstream::config::Plan::unlimited());
        let app = callstream::app::App::open(config).await?;
        let callstream::admin::AdminResponse::Org(org) = app
            .admin
            .execute(callstream::admin::AdminRequest::OrgCreate { name: "bench history".into(), plan: Some("bench".into()) })
            .await?
        else {
            anyhow::bail!("org create answered something else")
        };
        let callstream::admin::AdminResponse::KeyCreated { secret, .. } = app
            .admin
            .execute(callstream::admin::AdminRequest::KeyCreate { org: org.id.clone(), name: None })
            .await?
        else {
            anyhow::bail!("key create answered something else")
        };

        // The fill: a call a minute up to now, `lines` turns each, eight writers at once.
        let now = callstream::clock::now_ms();
        let started = Instant::now();
        let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut writers = Vec::new();
        for w in 0..8u64 {
            let store = app.store.clone();
            let org_id = org.id.clone();
            let turns = turns.clone();
            let next = next.clone();
            writers.push(tokio::spawn(async move {
                let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (w + 1));
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= calls {
                        return Ok::<(), anyhow::Error>(());
                    }
                    let started_ms = now - (calls - i) as i64 * 60_000;
                    let mut offset = 0.0;
                    let name = surname(&mut rng);
                    let transcript: Vec<Line> = (0..lines)
                        .map(|n| {
                            let greeting;
                            let (channel, text) = if n == 0 {
                                greeting = (0, format!("Hello, this is Alex {name}, calling about my account."));
                                &greeting
                            } else {
                                &turns[rng.below(turns.len())]
                            };
                            let duration = 1.0 + text.len() as f64 / 15.0;
                            let line = Line { channel: *channel, offset, duration, confidence: 0.9, text: text.clone() };
                            offset += duration + 0.5;
                            line
                        })
                        .collect();
                    let head = RecordHead {
                        id: callstream::history::call_record_id(&org_id, &format!("bench-{i}")),
                        org_id: org_id.clone(),
                        kind: RecordKind::Call,
                        started_ms,
                        ended_ms: Some(started_ms + (offset * 1000.0) as i64),
                        connector: format!("cc_bench_{}", i % 4),
                        conversation_id: Some(format!("conv-{i}")),
                        ani: Some("+15550100".into()),
                        dnis: Some("+15550199".into()),
                        close_reason: Some("closed by the client".into()),
                        language: Some("en-US".into()),
                        channels: vec!["Customer".into(), "Agent".into()],
                        billed_ms: (offset * 1000.0) as u64,
                        file_name: None,
                        duration: None,
                        intent: Some(intents[i % intents.len()].to_owned()),
                        analyses: None,
                    };
                    store.put_record(&Record { head, transcript, intents: Vec::new() }).await?;
                    if (i + 1).is_multiple_of(10_000) {
                        eprintln!("{} calls stored", i + 1);
                    }
                }
            }));
        }
        for w in writers {
            w.await??;
        }
        let fill_s = started.elapsed().as_secs_f64();
        println!(
            "{calls} calls of {lines} lines stored in {fill_s:.1} s ({:.0} calls/s), store {backend:?}",
            calls as f64 / fill_s
        );

        // The searches: words of the dialogues, each distinct word as likely as another (most
        // are rare, some are in nearly every call), and pairs of words said in one turn.
        let mut vocabulary: Vec<String> = turns
            .iter()
            .flat_map(|(_, t)| callstream::history::words(t))
            .filter(|w| w.len() >= 4)
            .collect();
        vocabulary.sort();
        vocabulary.dedup();
        let mut rng = Rng(0x2545_F491_4F6C_DD1D);
        let singles: Vec<String> = (0..searches).map(|_| vocabulary[rng.below(vocabulary.len())].clone()).collect();
        let pairs: Vec<String> = (0..searches)
            .filter_map(|_| {
                let words: Vec<String> = callstream::history::words(&turns[rng.below(turns.len())].1)
                    .into_iter()
                    .filter(|w| w.len() >= 4)
                    .collect();
                (words.len() >= 2).then(|| format!("{} {}", words[0], words[words.len() - 1]))
            })
            .collect();
        // Rare words (surnames), alone and beside a common word: the walk over the common
        // word's calls is the slow case of an index that intersects.
        let common: Vec<&str> = vec!["account", "thanks", "please", "help", "today", "order"];
        let rare: Vec<String> = (0..searches).map(|_| surname(&mut rng)).collect();
        let rare_common: Vec<String> = rare.iter().enumerate().map(|(i, r)| format!("{} {r}", common[i % common.len()])).collect();
        let server = callstream::server::start(app, "127.0.0.1:0".parse()?).await?;
        let client = reqwest::Client::new();
        let base = format!("http://{}/api/calls", server.addr);
        let time = |queries: Queries| {
            let client = client.clone();
            let base = base.clone();
            let secret = secret.clone();
            async move {
                let mut ms = Vec::new();
                let mut found = 0usize;
                for q in &queries {
                    let t = Instant::now();
                    // Words and intent labels are letters, digits, `_` and spaces.
                    let query: Vec<String> = q.iter().map(|(k, v)| format!("{k}={}", v.replace(' ', "%20"))).collect();
                    let url = format!("{base}?{}", query.join("&"));
                    let r = client.get(&url).header("X-API-Key", &secret).send().await?;
                    anyhow::ensure!(r.status() == 200, "search answered {}", r.status());
                    let page: serde_json::Value = r.json().await?;
                    ms.push(t.elapsed().as_secs_f64() * 1000.0);
                    found += page["calls"].as_array().map_or(0, Vec::len);
                }
                ms.sort_by(f64::total_cmp);
                Ok::<_, anyhow::Error>((ms, found as f64 / queries.len().max(1) as f64))
            }
        };
        // Warm the connection and the store's caches a little, as a server in use is.
        time(singles.iter().take(20).map(|w| vec![("q", w.clone())]).collect()).await?;
        let mut table = Table::new(
            format!("GET /api/calls over {calls} calls of {lines} lines, store {backend:?}, one request at a time, loopback"),
            &["query", "requests", "p50 ms", "p95 ms", "max ms", "calls per page"],
        );
        let rows: Vec<(&str, Queries)> = vec![
            ("one word", singles.iter().map(|w| vec![("q", w.clone())]).collect()),
            ("two words", pairs.iter().map(|w| vec![("q", w.clone())]).collect()),
            ("a name", rare.iter().map(|w| vec![("q", w.clone())]).collect()),
            ("common word + name", rare_common.iter().map(|w| vec![("q", w.clone())]).collect()),
            ("newest page", (0..searches.min(100)).map(|_| Vec::new()).collect()),
            ("intent filter", (0..searches.min(100)).map(|i| vec![("intent", intents[i % intents.len()].to_owned())]).collect()),
        ];
        for (name, queries) in rows {
            let n = queries.len();
            let (ms, per_page) = time(queries).await?;
            table.row(vec![
                name.to_owned(),
                n.to_string(),
                format!("{:.1}", percentile(&ms, 0.5)),
                format!("{:.1}", percentile(&ms, 0.95)),
                format!("{:.1}", ms.last().copied().unwrap_or(f64::NAN)),
                format!("{per_page:.1}"),
            ]);
        }
        server.stop().await;
        let _ = std::fs::remove_dir_all(&dir);
        table.record(record)
    })
}
