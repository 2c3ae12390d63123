//! `bench llm`: the language model's prompt and generation speed, alone and with several
//! requests served at once.

use super::*;

use callstream::llm::fair::Class;
use callstream::llm::{Generation, Message, Role, Sampling};

/// Tokens each generation writes.
const NEW_TOKENS: u32 = 128;

/// A generation of `NEW_TOKENS` after about `context` tokens, opened by `tag` so that nothing
/// of another run's prompt is reused.
fn generation(tag: &str, context: usize, tenant: Option<String>) -> Generation {
    Generation {
        messages: vec![
            Message::new(
                Role::System,
                "You are a helpful assistant for a contact center.",
            ),
            Message::new(
                Role::User,
                // A line of call transcript is about 16 tokens.
                format!(
                    "{tag}. Earlier in the call:\n{}Explain in detail how a customer can track an \
                     order, step by step.",
                    "Customer: I ordered a desk last week and it has not arrived yet.\n"
                        .repeat(context / 16)
                ),
            ),
        ],
        tools: Vec::new(),
        sampling: Sampling {
            max_tokens: NEW_TOKENS,
            temperature: 0.0,
            ..Sampling::default()
        },
        json_schema: None,
        response_format: None,
        odds: None,
        tenant,
        class: Class::Interactive,
    }
}

/// What one timed generation gave.
struct Timed {
    prompt: u64,
    generated: u64,
    /// Time to its first delta, and to its end, from when it was sent.
    first: f64,
    done: f64,
}

/// Sends `generation` and times it.
async fn timed(
    provider: &dyn callstream::llm::Provider,
    generation: Generation,
) -> anyhow::Result<Timed> {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(256);
    let started = Instant::now();
    let first = tokio::spawn(async move {
        let mut first = None;
        while rx.recv().await.is_some() {
            first.get_or_insert_with(Instant::now);
        }
        first
    });
    let completion = provider.generate(generation, Some(tx)).await?;
    let done = Instant::now();
    let first = first.await?.unwrap_or(done);
    Ok(Timed {
        prompt: completion.usage.prompt_tokens,
        generated: completion.usage.completion_tokens,
        first: first.duration_since(started).as_secs_f64(),
        done: done.duration_since(started).as_secs_f64(),
    })
}

/// `bench llm`: time to first delta and tokens per second of the configured provider, one
/// generation at a time; with `concurrency`, rounds of that many generations at once (each
/// from an organisation of its own, as independent clients), their aggregate tokens per
/// second and time to first delta.
pub(super) fn llm(
    config: &Config,
    runs: usize,
    context: usize,
    concurrency: &[usize],
) -> anyhow::Result<Table> {
    let runtime = tokio::runtime::Runtime::new()?;
    let mut config = config.clone();
    let most = concurrency.iter().copied().max().unwrap_or(1);
    // Enough places for the widest round, whatever the configuration says.
    config.llm.parallel = config.llm.parallel.max(most);
    let provider = callstream::llm::build_provider(&config)?;
    runtime.block_on(settle(&config, provider.as_ref()))?;
    if concurrency.is_empty() {
        let mut table = Table::new(
            format!(
                "{}: {runs} runs, {NEW_TOKENS} new tokens each, about {context} tokens of context",
                provider.name()
            ),
            &["run", "prompt tok", "TTFD ms", "prompt tok/s", "gen tok/s"],
        );
        runtime.block_on(async {
            for run in 0..runs {
                let t = timed(
                    provider.as_ref(),
                    generation(&format!("Run {run}"), context, None),
                )
                .await?;
                let gen_secs = (t.done - t.first).max(1e-9);
                table.row(vec![
                    run.to_string(),
                    t.prompt.to_string(),
                    format!("{:.0}", t.first * 1000.0),
                    format!("{:.1}", t.prompt as f64 / t.first.max(1e-9)),
                    format!("{:.1}", t.generated.saturating_sub(1) as f64 / gen_secs),
                ]);
            }
            Ok::<_, anyhow::Error>(())
        })?;
        return Ok(table);
    }
    let mut table = Table::new(
        format!(
            "{}: rounds of N generations at once, {runs} rounds each, {NEW_TOKENS} new tokens \
             each, about {context} tokens of context, llm.parallel = {}",
            provider.name(),
            config.llm.parallel
        ),
        &[
            "N",
            "aggregate gen tok/s",
            "x one",
            "per stream tok/s",
            "TTFD p50 ms",
            "TTFD p95 ms",
        ],
    );
    runtime.block_on(async {
        let mut one = None;
        for &n in concurrency {
            let mut firsts = Vec::new();
            let mut generated = 0u64;
            let mut wall = 0.0;
            let mut per_stream = Vec::new();
            for run in 0..runs {
                let started = Instant::now();
                let round = (0..n).map(|i| {
                    let provider = provider.clone();
                    async move {
                        timed(
                            provider.as_ref(),
                            generation(
                                &format!("Round {run} of {n}, stream {i}"),
                                context,
                                Some(format!("bench-{i}")),
                            ),
                        )
                        .await
                    }
                });
                for t in futures_util::future::join_all(round).await {
                    let t = t?;
                    firsts.push(t.first * 1000.0);
                    generated += t.generated;
                    per_stream.push(t.generated as f64 / (t.done - t.first).max(1e-9));
                }
                wall += started.elapsed().as_secs_f64();
            }
            firsts.sort_by(f64::total_cmp);
            let aggregate = generated as f64 / wall.max(1e-9);
            let base = *one.get_or_insert(aggregate);
            table.row(vec![
                n.to_string(),
                format!("{aggregate:.1}"),
                format!("{:.2}", aggregate / base),
                format!(
                    "{:.1}",
                    per_stream.iter().sum::<f64>() / per_stream.len() as f64
                ),
                format!("{:.0}", percentile(&firsts, 0.5)),
                format!("{:.0}", percentile(&firsts, 0.95)),
            ]);
        }
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(table)
}

/// Readies the prompts the embedded model warms at start before anything is timed, as the
/// service has them a minute or two after it starts; says how long that took.
pub(super) async fn settle(
    config: &Config,
    provider: &dyn callstream::llm::Provider,
) -> anyhow::Result<()> {
    if config.llm.provider == callstream::config::LlmProviderKind::Embedded {
        let started = Instant::now();
        crate::cli::bench_analysis::ready(provider).await?;
        println!(
            "(the model's start-up warm-ups readied first, in {:.1} s)",
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
