//! `bench fairness`: how long one organisation waits for the language model while another
//! keeps it busy. Two scenarios, on the configured provider behind its fair queue:
//! - organisation A asks for a long answer; a few seconds later organisation B asks for one
//!   word: B's latency, and A's;
//! - organisation F's file analyses (intent, BANT, NEAT-P of a long call, the batch class) run;
//!   meanwhile organisation L's live call, its transcript read ahead line by line as the
//!   service reads it, asks for its intent for the first time (the live class) on a 5-minute
//!   transcript, then again: each ask's latency, and the analyses' time.

use super::*;

use std::path::Path;
use std::time::Duration;

use callstream::llm::fair::Class;
use callstream::llm::profiles::{
    analyse, messages, Confidence, ProfileKind, FILE_LAYOUT, LIVE_LAYOUT,
};
use callstream::llm::{for_tenant, Generation, Message, Role, Sampling};

/// How far apart the last lines of the live call come while the file's analyses run.
const LINE_EVERY: Duration = Duration::from_millis(1500);

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
pub(super) fn fairness(
    config: &Config,
    set: &Path,
    delay_s: f64,
    cold: bool,
) -> anyhow::Result<()> {
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
        // The service reads a call's transcript ahead line by line (before its first analyze
        // for the calls holding a place for it, after chats and before files' prompts): all but its last
        // few lines were read before the file's analyses start ...
        let cut = live[..live.len() - 400]
            .rfind('\n')
            .map_or(live.len(), |i| i + 1);
        let prompt = |upto: &str| {
            messages(
                ProfileKind::Intent,
                LIVE_LAYOUT,
                Confidence::of(calls.as_ref()),
                upto,
            )
        };
        if !cold {
            crate::cli::bench_analysis::evaluate(calls.as_ref(), prompt(&live[..cut])).await?;
        }
        let analyses = {
            let batch = batch.clone();
            let file = file.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let timed = |kind| {
                    let (batch, file) = (&batch, &file);
                    async move {
                        let t = Instant::now();
                        analyse(batch.as_ref(), kind, FILE_LAYOUT, file, None).await?;
                        Ok::<_, anyhow::Error>((kind, t.elapsed().as_secs_f64()))
                    }
                };
                // As the service analyses a file: intent, then BANT and NEAT-P side by side.
                let intent = timed(ProfileKind::Intent).await?;
                let (bant, neat_p) =
                    tokio::try_join!(timed(ProfileKind::Bant), timed(ProfileKind::NeatP))?;
                let each = vec![intent, bant, neat_p];
                Ok::<_, anyhow::Error>((started.elapsed().as_secs_f64(), each))
            })
        };
        // ... and the rest come while they run, a line every LINE_EVERY, each handed over as
        // the service hands a final transcript over before the call has asked.
        let ahead = for_tenant(provider.clone(), "org_l", Class::Batch);
        let mut end = cut;
        while let Some(n) = live[end..].find('\n') {
            tokio::time::sleep(LINE_EVERY).await;
            end += n + 1;
            if !cold {
                ahead.prefill(prompt(&live[..end]), None, Class::Batch);
            }
        }
        // The call asks for the first time a moment after its last line, then every `delay_s`.
        tokio::time::sleep(LINE_EVERY).await;
        let mut asks = Vec::new();
        while !analyses.is_finished() && asks.len() < 5 {
            if !asks.is_empty() {
                tokio::time::sleep(Duration::from_secs_f64(delay_s)).await;
            }
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
            "  the live call's intent ({} characters of transcript{}; its last {} lines came {:.1} s apart while they ran): first asked {}, then every {delay_s:.1} s: {}",
            live.len(),
            if cold { ", not read ahead" } else { "" },
            live[cut..].lines().count(),
            LINE_EVERY.as_secs_f64(),
            asks.first().map_or("never (the analyses ended first)".to_owned(), |s| format!("{s:.2} s")),
            asks.iter()
                .skip(1)
                .map(|s| format!("{s:.2} s"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        Ok::<_, anyhow::Error>(())
    })?;
    provider.stop(Duration::from_secs(10));
    Ok(())
}
