//! The analysis profiles on the embedded model (Qwen2.5 0.5B): grammar-constrained output that
//! always parses, labels from the documented set, and evidence quotes that occur verbatim in
//! the transcript.

mod common;

use callstream::llm::embedded::{EmbeddedConfig, EmbeddedLlm};
use callstream::llm::profiles::{analyse, intent_labels, ProfileKind};

const TRANSCRIPT: &str = "Agent: Thanks for calling Acme Software, how can I help?
Customer: Hi, I'm the operations director at Northwind. We're looking to replace our call center software.
Customer: Our current contract ends in March, so we need something in place before then.
Agent: Understood. Do you have a budget in mind?
Customer: We have about fifty thousand dollars set aside for this year.
Customer: Our agents lose around ten hours a week to manual call notes, that costs us a lot.
Agent: Who else is involved in the decision?
Customer: I sign off on purchases under one hundred thousand, so it's my call.
Customer: Honestly this is our top priority for the first quarter.";

fn model() -> EmbeddedLlm {
    EmbeddedLlm::load(
        &common::llm_path(),
        EmbeddedConfig {
            threads: 2,
            context_tokens: 4096,
            queue: 4,
        },
    )
    .unwrap()
}

fn check_quotes(record: &serde_json::Value, criteria: &[&str]) {
    for name in criteria {
        let c = &record[name];
        assert!(
            ["identified", "partial", "not_found"].contains(&c["status"].as_str().unwrap()),
            "{name}: {c}"
        );
        assert!(c["summary"].is_string());
        let conf = c["confidence"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&conf));
        for quote in c["evidence"].as_array().unwrap() {
            let quote = quote.as_str().unwrap();
            assert!(
                TRANSCRIPT.contains(quote),
                "{name}: {quote:?} is not in the transcript"
            );
        }
    }
}

#[tokio::test]
async fn intent_bant_and_neat_p_parse_and_quote_verbatim() {
    let llm = model();
    let (intent, usage) = analyse(&llm, ProfileKind::Intent, TRANSCRIPT)
        .await
        .unwrap();
    println!("intent {intent}");
    assert!(usage.total_tokens > 0);
    let labels = intent_labels();
    let intents = intent["intents"].as_array().unwrap();
    assert!((1..=3).contains(&intents.len()));
    for i in intents {
        assert!(
            labels.contains(&i["intent"].as_str().unwrap().to_owned()),
            "{i}"
        );
        assert!(
            ["high", "medium", "low"].contains(&i["confidence"].as_str().unwrap()),
            "{i}"
        );
    }
    assert!(intent["reasoning"].is_string());

    let (bant, _) = analyse(&llm, ProfileKind::Bant, TRANSCRIPT).await.unwrap();
    println!("bant {bant}");
    check_quotes(&bant, &["budget", "authority", "need", "timeline"]);
    assert_eq!(
        bant.as_object().unwrap().keys().collect::<Vec<_>>(),
        ["budget", "authority", "need", "timeline"]
    );
    let quotes: usize = bant
        .as_object()
        .unwrap()
        .values()
        .map(|c| c["evidence"].as_array().unwrap().len())
        .sum();
    assert!(quotes >= 1, "some evidence survives verification");

    let (neat, _) = analyse(&llm, ProfileKind::NeatP, TRANSCRIPT).await.unwrap();
    println!("neat_p {neat}");
    check_quotes(
        &neat,
        &[
            "need",
            "economic_impact",
            "access_to_authority",
            "timeline",
            "priority",
        ],
    );
}
