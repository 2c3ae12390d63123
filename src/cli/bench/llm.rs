//! `bench llm`: the embedded model's prompt and generation speed.

use super::*;

/// `bench llm`: time to first delta and tokens per second of the configured provider.
pub(super) fn llm(config: &Config, runs: usize, context: usize) -> anyhow::Result<Table> {
    use callstream::llm::{Generation, Message, Role, Sampling};
    let runtime = tokio::runtime::Runtime::new()?;
    let provider = callstream::llm::build_provider(config)?;
    let mut table = Table::new(
        format!(
            "{}: {runs} runs, 128 new tokens each, about {context} tokens of context",
            provider.name()
        ),
        &["run", "prompt tok", "TTFD ms", "prompt tok/s", "gen tok/s"],
    );
    runtime.block_on(async {
        for run in 0..runs {
            let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(256);
            let generation = Generation {
                messages: vec![
                    Message::new(
                        Role::System,
                        "You are a helpful assistant for a contact center.",
                    ),
                    Message::new(
                        Role::User,
                        // Each run's own opening, so that nothing is reused from the last run;
                        // a line of call transcript is about 16 tokens.
                        format!(
                            "Run {run}. Earlier in the call:\n{}Explain in detail how a customer \
                             can track an order, step by step.",
                            "Customer: I ordered a desk last week and it has not arrived yet.\n"
                                .repeat(context / 16)
                        ),
                    ),
                ],
                tools: Vec::new(),
                sampling: Sampling {
                    max_tokens: 128,
                    temperature: 0.0,
                    ..Sampling::default()
                },
                json_schema: None,
                response_format: None,
                odds: None,
                tenant: None,
            };
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
            let ttfd = first.duration_since(started).as_secs_f64();
            let gen_secs = done.duration_since(first).as_secs_f64().max(1e-9);
            table.row(vec![
                run.to_string(),
                completion.usage.prompt_tokens.to_string(),
                format!("{:.0}", ttfd * 1000.0),
                format!("{:.1}", completion.usage.prompt_tokens as f64 / ttfd),
                format!(
                    "{:.1}",
                    completion.usage.completion_tokens.saturating_sub(1) as f64 / gen_secs
                ),
            ]);
        }
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(table)
}
