//! `bench fairness`: how long one organisation waits for the language model while another
//! keeps it busy. Two scenarios, on the configured provider behind its fair queue:
//! - organisation A asks for a long answer; a few seconds later organisation B asks for one
//!   word: B's latency, and A's;
//! - organisation F's file analyses (intent, BANT, NEAT-P of a long call, the batch class) run;
//!   meanwhile organisation L's live call asks for its intent (the live class) on a 5-minute
//!   transcript, kept warm as the service keeps it: each ask's latency, and the analyses' time.

use super::*;

use std::path::Path;
use std::time::Duration;

use callstream::llm::fair::Class;
use callstream::llm::profiles::{
    analyse, messages, Confidence, ProfileKind, FILE_LAYOUT, LIVE_LAYOUT,
};
use callstream::llm::{for_tenant, Generation, Message, Role, Sampling};

/// A chat turn of `org` asking for `max_tokens`.
fn chat(org: &str, question: &str, max_tokens: u32) -> Generation {
    Generation {
        messages: vec![
            Message::new(
                Role::System,
                "You are a helpful assistant for a contact center.",
            ),
            Message::new(Role::User, question),
        ],
        tools: Vec::new(),
        sampling: Sampling {
            max_tokens,
            temperature: 0.0,
            ..Sampling::default()
        },
        json_schema: None,
        response_format: None,
        odds: None,
        tenant: Some(org.to_owned()),
        class: Class::Interactive,
    }
}

/// The written dialogues of the labelled set, one after another, until `chars` characters.
fn dialogue_of(set: &Path, chars: usize, opening: &str) -> anyhow::Result<String> {
    let calls = super::super::labelled::read_calls(&set.join("calls.txt"))?;
    let mut out = opening.to_owned();
    'fill: loop {
        for call in &calls {
            for (customer, text) in &call.turns {
                let who = if *customer { "Customer" } else { "Agent" };
                out.push_str(&format!("{who}: {text}\n"));
                if out.len() >= chars {
                    break 'fill;
                }
            }
        }
        anyhow::ensure!(!calls.is_empty(), "no calls in {}", set.display());
    }
    Ok(out)
}

/// `bench fairness`.
pub(super) fn fairness(config: &Config, set: &Path, delay_s: f64) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new()?;
    let provider = callstream::llm::build_provider(config)?;
    println!(
        "{}: llm.parallel = {}, llm.queue_per_org = {}",
        provider.name(),
        config.llm.parallel,
        config.llm.queue_per_org
    );
    runtime.block_on(async {
        super::llm::settle(config, provider.as_ref()).await?;
        // A long answer for A; B's one word after `delay_s`.
        let long = "Write a detailed, step by step guide for a new contact center agent on \
                    handling an angry customer whose order is late: at least ten steps, each \
                    explained in a paragraph.";
        let a = {
            let provider = provider.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let c = provider.generate(chat("org_a", long, 300), None).await?;
                Ok::<_, anyhow::Error>((started.elapsed().as_secs_f64(), c.usage))
            })
        };
        tokio::time::sleep(Duration::from_secs_f64(delay_s)).await;
        let started = Instant::now();
        let b = provider
            .generate(
                chat(
                    "org_b",
                    "In one word: is the sky usually blue or green?",
                    8,
                ),
                None,
            )
            .await?;
        let b_secs = started.elapsed().as_secs_f64();
        let (a_secs, a_usage) = a.await??;
        println!("a short chat beside a long generation:");
        println!(
            "  organisation A: {} tokens written in {a_secs:.1} s",
            a_usage.completion_tokens
        );
        println!(
            "  organisation B, sent {delay_s:.1} s later: {} tokens ({:?}), answered in {b_secs:.2} s",
            b.usage.completion_tokens,
            b.text.trim()
        );

        // File analyses of F while L's live call asks for its intent.
        let file = dialogue_of(set, 9_000, "")?;
        let live = dialogue_of(
            set,
            4_000,
            "Agent: Thank you for calling, you are speaking with Sam.\n",
        )?;
        let batch = for_tenant(provider.clone(), "org_f", Class::Batch);
        let calls = for_tenant(provider.clone(), "org_l", Class::Live);
        // The live call's lines so far were made ready as they came (the service hands each
        // final line to the model after the call's first analyze): all but its last few are
        // evaluated before the file's analyses start.
        let cut = live[..live.len() - 400]
            .rfind('\n')
            .map_or(live.len(), |i| i + 1);
        crate::cli::bench_analysis::evaluate(
            calls.as_ref(),
            messages(
                ProfileKind::Intent,
                LIVE_LAYOUT,
                Confidence::of(calls.as_ref()),
                &live[..cut],
            ),
        )
        .await?;
        let analyses = {
            let batch = batch.clone();
            let file = file.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let mut each = Vec::new();
                for kind in ProfileKind::ALL {
                    let t = Instant::now();
                    analyse(batch.as_ref(), kind, FILE_LAYOUT, &file, None).await?;
                    each.push((kind, t.elapsed().as_secs_f64()));
                }
                Ok::<_, anyhow::Error>((started.elapsed().as_secs_f64(), each))
            })
        };
        let mut asks = Vec::new();
        while !analyses.is_finished() && asks.len() < 5 {
            tokio::time::sleep(Duration::from_secs_f64(delay_s)).await;
            let started = Instant::now();
            analyse(calls.as_ref(), ProfileKind::Intent, LIVE_LAYOUT, &live, None).await?;
            asks.push(started.elapsed().as_secs_f64());
        }
        let (total, each) = analyses.await??;
        println!("a live call's intent while a file's analyses run:");
        println!(
            "  the file's three analyses ({} characters of transcript): {total:.1} s ({})",
            file.len(),
            each.iter()
                .map(|(k, s)| format!("{k:?} {s:.1} s"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        println!(
            "  the live call's intent ({} characters of transcript), asked every {delay_s:.1} s while they ran: {}",
            live.len(),
            asks.iter()
                .map(|s| format!("{s:.2} s"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        Ok::<_, anyhow::Error>(())
    })?;
    provider.stop(Duration::from_secs(10));
    Ok(())
}
