//! `bench gateway`: what the chat gateway adds to an upstream model's answer.

use super::*;

pub(super) fn gateway(
    config: &Config,
    requests: usize,
    concurrency: usize,
    token_quota: Option<u64>,
) -> anyhow::Result<()> {
    use warp::Filter;
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let sse: &'static str = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"},\"finish_reason\":null}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" there.\"},\"finish_reason\":\"stop\"}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":20,\"completion_tokens\":2,\"total_tokens\":22}}\n\n",
            "data: [DONE]\n\n"
        );
        let upstream = warp::path!("v1" / "chat" / "completions")
            .and(warp::post())
            .and(warp::body::bytes())
            .map(move |_| warp::http::Response::builder().header("content-type", "text/event-stream").body(sse).expect("static response"));
        let (up_addr, up_server) = warp::serve(upstream).bind_ephemeral(([127, 0, 0, 1], 0));
        tokio::spawn(up_server);

        let dir = tempfile_dir()?;
        let mut config = config.clone();
        config.storage.data_dir = dir.clone();
        let backend = bench_store(&mut config);
        config.llm.provider = callstream::config::LlmProviderKind::Upstream;
        config.llm.upstream.base_url = format!("http://{up_addr}/v1");
        config.llm.upstream.model = "bench".into();
        config.llm.upstream.api_key = "bench".into();
        config.plans.insert(
            "bench".into(),
            callstream::config::Plan { chat_tokens_per_month: token_quota, ..callstream::config::Plan::unlimited() },
        );
        let app = callstream::app::App::open(config).await?;
        let callstream::admin::AdminResponse::Org(org) = app.admin.execute(callstream::admin::AdminRequest::OrgCreate { name: "bench".into(), plan: Some("bench".into()) }).await? else {
            anyhow::bail!("org create answered something else")
        };
        let callstream::admin::AdminResponse::KeyCreated { secret, .. } = app.admin.execute(callstream::admin::AdminRequest::KeyCreate { org: org.id, name: None }).await? else {
            anyhow::bail!("key create answered something else")
        };
        let server = callstream::server::start(app, "127.0.0.1:0".parse()?).await?;
        let client = reqwest::Client::new();
        let body = serde_json::json!({"messages": [{"role": "user", "content": "hi"}], "return_markdown": true});
        let direct_url = format!("http://{up_addr}/v1/chat/completions");
        let gateway_url = format!("http://{}/api/llm/chat/completions", server.addr);
        // Warm both paths.
        load(&client, &direct_url, None, &body, 50, concurrency).await?;
        load(&client, &gateway_url, Some(&secret), &body, 50, concurrency).await?;
        let (direct, direct_wall) = load(&client, &direct_url, None, &body, requests, concurrency).await?;
        let (through, through_wall) = load(&client, &gateway_url, Some(&secret), &body, requests, concurrency).await?;
        let quota = token_quota.map_or("unlimited".to_owned(), |q| format!("{q} tokens a month"));
        println!("{requests} requests, {concurrency} in flight, loopback, store {backend:?}, quota {quota}");
        println!("path       p50 ms  p99 ms  requests/s");
        println!("direct    {:>7.2} {:>7.2} {:>11.0}", percentile(&direct, 0.5), percentile(&direct, 0.99), requests as f64 / direct_wall);
        println!("gateway   {:>7.2} {:>7.2} {:>11.0}", percentile(&through, 0.5), percentile(&through, 0.99), requests as f64 / through_wall);
        println!(
            "added     {:>7.2} {:>7.2}   (key check, rate limit, quota, durable ledger write, SSE parse)",
            percentile(&through, 0.5) - percentile(&direct, 0.5),
            percentile(&through, 0.99) - percentile(&direct, 0.99)
        );
        server.stop().await;
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    })
}
