//! The analysis profiles on the embedded model (Qwen2.5 0.5B): grammar-constrained output that
//! always parses, labels from the documented set, and evidence quotes that occur verbatim in
//! the transcript.

mod common;

use callstream::llm::embedded::{EmbeddedConfig, EmbeddedLlm};
use std::sync::Arc;

use callstream::llm::fair::Class;
use callstream::llm::profiles::{
    analyse, analyse_checked, intent_labels, messages, Confidence, Layout, LlmIntent, ProfileKind,
    FILE_LAYOUT, LIVE_LAYOUT,
};
use callstream::llm::Provider;
use callstream_actors::call::IntentClassifier;

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
            context_tokens: 8192,
            sequences: 2,
            kv_cache_bytes: 256 << 20,
            queue: 4,
            prefix_cache_entries: 4,
            prefix_cache_bytes: 256 << 20,
            flash_attention: false,
            micro_batch: 128,
            // Drafting on whatever the CPU: the analyses below check its answers too.
            draft_tokens: Some(8),
            // The keys as the service keeps them by default (q8_0).
            key_cache: None,
            repack_weights: true,
            force_schema_text: true,
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

/// Each of `fields` of `record` that is identified names in its quotes the amounts and months
/// its summary claims.
fn figures_borne(record: &serde_json::Value, fields: &[&str]) {
    for name in fields {
        let c = &record[name];
        if c["status"] != "identified" {
            continue;
        }
        let quotes: Vec<String> = c["evidence"]
            .as_array()
            .unwrap()
            .iter()
            .map(|q| q.as_str().unwrap().to_owned())
            .collect();
        assert!(
            callstream::llm::profiles::claims::bears_out(c["summary"].as_str().unwrap(), &quotes),
            "{name}: {c}"
        );
    }
}

/// One model per process (llama.cpp's backend is initialised once), so the checks run in one
/// test, one after the other.
#[tokio::test]
async fn analyses_on_the_embedded_model() {
    let llm = Arc::new(model());
    the_cpu_backend_is_built_for_what_this_cpu_has();
    // The warm-ups evaluate the live intent prompt, the files prompt and the evidence check's
    // prompt before any request.
    let warm_ups = callstream::llm::profiles::warm_ups(Confidence::of(llm.as_ref()));
    let count = warm_ups.len() as u64;
    for messages in warm_ups {
        llm.warm(messages, None, callstream::llm::fair::Class::Batch);
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    while llm.prompt_stats().warmed < count {
        assert!(
            std::time::Instant::now() < deadline,
            "the warm-up never ran"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    intent_bant_and_neat_p_parse_and_quote_verbatim(&llm).await;
    the_model_tells_how_sure_it_is_of_each_status(&llm).await;
    evaluated_prompts_are_reused_across_requests_analyses_and_a_growing_transcript(&llm).await;
    a_warm_up_yields_to_a_request(&llm).await;
    a_short_request_is_answered_while_a_long_one_is_written(&llm).await;
    one_organisations_prompt_is_never_reused_for_another(&llm).await;
    a_transcript_longer_than_the_window_is_analysed_without_its_middle(&llm).await;
    // Last: the model is stopped for good.
    a_stopped_model_gives_up_its_work_and_ends(&llm).await;
}

/// llama.cpp's CPU code is built for several x86 levels; the one loaded uses the widest vector
/// and matrix instructions this CPU has (`/proc/cpuinfo`), not the portable baseline: AMX
/// included, whose tile configuration the build keeps (scripts/cmake/llama-cpp.cmake); the
/// analyses after this check run on it.
fn the_cpu_backend_is_built_for_what_this_cpu_has() {
    let features = callstream::llm::embedded::cpu_backend().unwrap();
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap();
    let flags: Vec<&str> = cpuinfo
        .lines()
        .find(|l| l.starts_with("flags"))
        .map(|l| l.split_whitespace().collect())
        .unwrap_or_default();
    assert!(!features.is_empty());
    for (flag, feature) in [
        ("avx2", "AVX2"),
        ("avx512f", "AVX512"),
        ("avx512_vnni", "AVX512_VNNI"),
        ("amx_int8", "AMX_INT8"),
    ] {
        if flags.contains(&flag) {
            assert!(
                features.split(", ").any(|f| f == format!("{feature} = 1")),
                "the CPU has {flag}, the backend loaded has {features}"
            );
        }
    }
}

/// Stopping the model (as the service does before it exits) gives up a warm-up under way at
/// its next chunk and ends the model's thread; later requests fail at once.
async fn a_stopped_model_gives_up_its_work_and_ends(llm: &EmbeddedLlm) {
    use callstream::llm::LlmError;
    let before = start_a_long_warm_up(llm, "Name four seasons. ").await;
    assert!(
        llm.stop(std::time::Duration::from_secs(120)),
        "the model thread did not end"
    );
    let after = llm.prompt_stats();
    assert_eq!(after.warmed, before.warmed, "the warm-up ran to its end");
    assert!(
        after.evaluated - before.evaluated < 2_000,
        "{} prompt tokens evaluated: the warm-up was not given up",
        after.evaluated - before.evaluated
    );
    // Stopped already: at once, and for good.
    assert!(llm.stop(std::time::Duration::ZERO));
    let refused = say_yes(llm).await;
    assert!(matches!(refused, Err(LlmError::Engine(_))), "{refused:?}");
}

/// Starts a warm-up of about 3,000 tokens (`phrase` repeated: several prompt chunks) and
/// returns once it has begun (its prompt is counted before its first chunk is evaluated),
/// with the model's counts from before it.
async fn start_a_long_warm_up(
    llm: &EmbeddedLlm,
    phrase: &str,
) -> callstream::llm::embedded::PromptStats {
    use callstream::llm::{Message, Role};
    let before = llm.prompt_stats();
    llm.warm(
        vec![
            Message::new(Role::System, "You are a warm-up."),
            Message::new(Role::User, phrase.repeat(600)),
        ],
        None,
        callstream::llm::fair::Class::Batch,
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while llm.prompt_stats().evaluated == before.evaluated {
        assert!(
            std::time::Instant::now() < deadline,
            "the warm-up never ran"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    before
}

/// The same long prompt for organisation A twice, then for B: A's second request reuses its
/// first, B's evaluates every token again (the time to its first token cannot tell B what A's
/// prompt held); A's context, set aside for B, is still A's to reuse after.
async fn one_organisations_prompt_is_never_reused_for_another(llm: &EmbeddedLlm) {
    use callstream::llm::{Generation, Message, Role, Sampling};
    let secret_prompt =
        "Our retention offer this quarter is code MAPLE-42 for 30% off. ".repeat(40);
    let ask = |tenant: &str| Generation {
        messages: vec![
            Message::new(Role::System, secret_prompt.clone()),
            Message::new(Role::User, "Say yes."),
        ],
        tools: Vec::new(),
        sampling: Sampling {
            max_tokens: 1,
            temperature: 0.0,
            ..Default::default()
        },
        json_schema: None,
        response_format: None,
        tenant: Some(tenant.to_owned()),
        class: callstream::llm::fair::Class::default(),
        odds: None,
    };
    let mut reused = Vec::new();
    for tenant in ["org_a", "org_a", "org_b", "org_a"] {
        let before = llm.prompt_stats();
        let done = llm.generate(ask(tenant), None).await.unwrap();
        let after = llm.prompt_stats();
        let prompt = done.usage.prompt_tokens;
        assert!(prompt > 400, "{prompt} prompt tokens");
        reused.push((after.reused - before.reused, prompt));
    }
    println!("reused of each request's prompt (A, A, B, A): {reused:?}");
    // A's second request finds all but the last token or so.
    assert!(reused[1].0 + 8 >= reused[1].1, "{reused:?}");
    // B's finds nothing of A's.
    assert_eq!(reused[2].0, 0, "{reused:?}");
    // A's is still there for A.
    assert!(reused[3].0 + 8 >= reused[3].1, "{reused:?}");
}

/// A short request: at most four tokens in answer to "Say yes.".
async fn say_yes(
    llm: &EmbeddedLlm,
) -> Result<callstream::llm::Completion, callstream::llm::LlmError> {
    use callstream::llm::{Generation, Message, Role, Sampling};
    llm.generate(
        Generation {
            messages: vec![
                Message::new(Role::System, "You are terse."),
                Message::new(Role::User, "Say yes."),
            ],
            tools: Vec::new(),
            sampling: Sampling {
                max_tokens: 4,
                temperature: 0.0,
                ..Default::default()
            },
            json_schema: None,
            response_format: None,
            tenant: None,
            class: callstream::llm::fair::Class::default(),
            odds: None,
        },
        None,
    )
    .await
}

/// A structured answer needs room for all of its tokens; a transcript too long for the window
/// is analysed without lines from its middle, and its quotes still come from it.
async fn a_transcript_longer_than_the_window_is_analysed_without_its_middle(llm: &EmbeddedLlm) {
    use callstream::llm::{Generation, LlmError, Message, Role, Sampling};
    let cut_short = llm
        .generate(
            Generation {
                messages: vec![Message::new(Role::User, "Answer with an empty object.")],
                tools: Vec::new(),
                sampling: Sampling {
                    max_tokens: 8_190,
                    temperature: 0.0,
                    ..Default::default()
                },
                json_schema: Some(serde_json::json!({"type": "object"})),
                response_format: None,
                tenant: None,
                class: callstream::llm::fair::Class::default(),
                odds: None,
            },
            None,
        )
        .await;
    assert!(
        matches!(cut_short, Err(LlmError::ContextOverflow { .. })),
        "{cut_short:?}"
    );
    // About 12,000 tokens: the sales call, then small talk, then the call's end.
    let filler = "Agent: While the system loads, how has the weather been over there?\n\
                  Customer: Mostly grey, some rain in the mornings, nothing unusual.\n"
        .repeat(350);
    let long = format!(
        "{TRANSCRIPT}\n{filler}Agent: So I will send the proposal on Friday.\n\
         Customer: Good, we need it before our contract ends in March.\n"
    );
    let analysis = analyse_checked(llm, ProfileKind::Bant, LIVE_LAYOUT, &long, Some("Agent"))
        .await
        .unwrap();
    let bant = analysis.record.to_value();
    // The analysis's own prompt, without the checks of its evidence, fitted the window.
    let prompt = analysis.usage.prompt_tokens - analysis.checked.usage.prompt_tokens;
    println!("bant of a long call ({prompt} prompt tokens) {bant}");
    assert!(prompt < 8192 - 1024, "{:?}", analysis.usage);
    for c in bant.as_object().unwrap().values() {
        for quote in c["evidence"].as_array().unwrap() {
            assert!(long.contains(quote.as_str().unwrap()), "{quote}");
        }
    }
}

/// A warm-up under way gives way to a request that arrives: it reads nothing while the request
/// is served, so the request is answered while the warm-up is still far from its end.
async fn a_warm_up_yields_to_a_request(llm: &EmbeddedLlm) {
    let before = start_a_long_warm_up(llm, "Name three colours. ").await;
    say_yes(llm).await.unwrap();
    let after = llm.prompt_stats();
    assert_eq!(
        after.warmed, before.warmed,
        "the warm-up ran to its end before the request was answered"
    );
}

/// A short request sent while a long answer is being written is answered beside it, not after
/// it: the long answer is still being written when the short one is done.
async fn a_short_request_is_answered_while_a_long_one_is_written(llm: &Arc<EmbeddedLlm>) {
    use callstream::llm::{Generation, Message, Role, Sampling};
    let long = Generation {
        messages: vec![Message::new(
            Role::User,
            "Count from 1 to 300, one number per line, and nothing else.",
        )],
        tools: Vec::new(),
        sampling: Sampling {
            max_tokens: 400,
            temperature: 0.0,
            ..Default::default()
        },
        json_schema: None,
        response_format: None,
        tenant: Some("org_long".into()),
        class: callstream::llm::fair::Class::Interactive,
        odds: None,
    };
    let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(1024);
    let writer = {
        let llm = llm.clone();
        tokio::spawn(async move { llm.generate(long, Some(tx)).await })
    };
    // The long answer has started.
    assert!(rx.recv().await.is_some(), "the long answer wrote nothing");
    let short = say_yes(llm).await.unwrap();
    assert!(short.usage.completion_tokens >= 1);
    assert!(
        !writer.is_finished(),
        "the short request was answered only after the long one"
    );
    let long = writer.await.unwrap().unwrap();
    println!(
        "long answer: {} tokens; short: {:?}",
        long.usage.completion_tokens, short.text
    );
    assert!(long.usage.completion_tokens > 100, "{long:?}");
}

async fn intent_bant_and_neat_p_parse_and_quote_verbatim(llm: &EmbeddedLlm) {
    let before = llm.prompt_stats();
    let (intent, usage) = analyse(llm, ProfileKind::Intent, FILE_LAYOUT, TRANSCRIPT, None)
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

    let (bant, _) = analyse(
        llm,
        ProfileKind::Bant,
        FILE_LAYOUT,
        TRANSCRIPT,
        Some("Agent"),
    )
    .await
    .unwrap();
    println!("bant {bant}");
    check_quotes(&bant, &["budget", "authority", "need", "timeline"]);
    assert_eq!(
        bant.as_object().unwrap().keys().collect::<Vec<_>>(),
        ["budget", "authority", "need", "timeline"]
    );
    // Held to the transcript's sentences, the model quotes them as said: with every speaker
    // counted, every quote it gives is kept word for word, none aligned.
    let checked = analyse_checked(llm, ProfileKind::Bant, FILE_LAYOUT, TRANSCRIPT, None)
        .await
        .unwrap();
    println!(
        "bant, every speaker counted: {} {:?} {:?}",
        checked.record.to_json(),
        checked.quotes,
        checked.checked
    );
    assert!(checked.quotes.given >= 1, "{:?}", checked.quotes);
    // The fields reported were checked: their quotes were sorted by topic.
    assert!(checked.checked.sorted >= 1, "{:?}", checked.checked);
    assert_eq!(checked.quotes.verbatim, checked.quotes.given);
    assert_eq!(checked.quotes.aligned, 0);
    let sentences: Vec<&str> = TRANSCRIPT
        .lines()
        .flat_map(|l| l.split_once(": ").unwrap().1.split_inclusive(". "))
        .map(str::trim)
        .collect();
    for field in checked.record.to_value().as_object().unwrap().values() {
        for quote in field["evidence"].as_array().unwrap() {
            let quote = quote.as_str().unwrap();
            assert!(sentences.contains(&quote), "{quote:?} is a whole sentence");
        }
    }

    let quotes: usize = bant
        .as_object()
        .unwrap()
        .values()
        .map(|c| c["evidence"].as_array().unwrap().len())
        .sum();
    assert!(quotes >= 1, "some evidence survives verification");

    let (neat, _) = analyse(
        llm,
        ProfileKind::NeatP,
        FILE_LAYOUT,
        TRANSCRIPT,
        Some("Agent"),
    )
    .await
    .unwrap();
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
    // A stated budget, cost or date is borne out by its quotes, whatever the model wrote: the
    // buyer's sign-off limit (one hundred thousand) never stands alone as the evidence of a
    // budget of fifty thousand.
    figures_borne(&bant, &["budget", "timeline"]);
    figures_borne(&neat, &["economic_impact", "timeline"]);
    // The answers quote the transcript and copy the worked examples' layout: tokens drafted
    // from the prompt were checked, and the model confirmed some (an answer built from drafts
    // that were not its own picks would have failed the checks above).
    let after = llm.prompt_stats();
    let (drafted, confirmed) = (
        after.drafted - before.drafted,
        after.confirmed - before.confirmed,
    );
    println!("drafted {drafted}, confirmed {confirmed}");
    assert!(
        confirmed > 0 && confirmed <= drafted,
        "{drafted} / {confirmed}"
    );
}

/// Asked for odds, the model gives, at every point the answer writes a status, a probability
/// for each status, summing to one over what the schema allows. A status given a floor above
/// any probability is never written there.
async fn the_model_tells_how_sure_it_is_of_each_status(llm: &EmbeddedLlm) {
    use callstream::llm::{Generation, Message, Odds, Role, Sampling};
    let statuses = ["identified", "partial", "not_found"];
    let field = serde_json::json!({
        "type": "object",
        "properties": {"status": {"type": "string", "enum": statuses}},
        "required": ["status"],
        "additionalProperties": false
    });
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"budget": field, "timeline": field},
        "required": ["budget", "timeline"],
        "additionalProperties": false
    });
    let ask = |floor: Option<(usize, f32)>| Generation {
        messages: vec![Message::new(
            Role::User,
            "Customer: We have ten thousand dollars for this.\n\
             For budget and timeline, is each identified, partial or not_found? JSON.",
        )],
        tools: Vec::new(),
        sampling: Sampling {
            max_tokens: 64,
            temperature: 0.0,
            ..Default::default()
        },
        json_schema: Some(schema.clone()),
        response_format: None,
        tenant: None,
        class: callstream::llm::fair::Class::default(),
        odds: Some(Odds {
            after: "\"status\":\"".into(),
            words: statuses.iter().map(|s| s.to_string()).collect(),
            floor,
            only: false,
        }),
    };
    for floor in [None, Some((2, 1.01)), Some((0, 1.01))] {
        let answer = llm.generate(ask(floor), None).await.unwrap();
        println!("{floor:?}: {} {:?}", answer.text, answer.odds);
        let record: serde_json::Value = serde_json::from_str(&answer.text).unwrap();
        assert_eq!(answer.odds.len(), 2, "one point per field");
        for (name, point) in ["budget", "timeline"].iter().zip(&answer.odds) {
            // Each point is named by the value written there.
            assert_eq!(point.at, format!("/{name}/status"));
            let p = &point.p;
            assert_eq!(p.len(), 3);
            let sum: f32 = p.iter().sum();
            assert!((0.99..=1.01).contains(&sum), "{name}: {p:?}");
            let chosen = record[name]["status"].as_str().unwrap();
            let i = statuses.iter().position(|s| *s == chosen).unwrap();
            assert!(p[i] > 0.0, "{name}: {chosen} has no weight in {p:?}");
            if let Some((refused, _)) = floor {
                assert_ne!(i, refused, "{name}: {chosen} is below its floor in {p:?}");
                // The likelier of the other two.
                let other = 3 - refused - i;
                assert!(p[i] >= p[other], "{name}: {chosen} in {p:?}");
            }
        }
    }
    // The start every answer has is read with the prompt: the first point is weighed at
    // once, and a caller that wants only its odds gets them with nothing written.
    let mut first = ask(None);
    first.odds.as_mut().unwrap().only = true;
    let whole = llm.generate(ask(None), None).await.unwrap();
    let only = llm.generate(first, None).await.unwrap();
    assert_eq!(only.text, r#"{"budget":{"status":""#);
    assert_eq!(only.usage.completion_tokens, 0);
    assert_eq!(only.odds.len(), 1);
    assert!(whole.text.starts_with(&only.text), "{}", whole.text);
    assert_eq!(only.odds[0].at, "/budget/status");
    for (a, b) in only.odds[0].p.iter().zip(&whole.odds[0].p) {
        assert!(
            (a - b).abs() < 1e-3,
            "{:?} against {:?}",
            only.odds,
            whole.odds
        );
    }
    // A stop string within that start ends the answer there, as one written would.
    let mut stopping = ask(None);
    stopping.sampling.stop = vec!["status".into()];
    let stopped = llm.generate(stopping, None).await.unwrap();
    assert_eq!(stopped.text, r#"{"budget":{""#);
    assert_eq!(stopped.finish, callstream::llm::FinishReason::Stop);
    assert_eq!(stopped.usage.completion_tokens, 0);
}

/// Prompt tokens the model evaluated for one analysis (the rest it reused), and the prompt's.
async fn evaluated_for(
    llm: &EmbeddedLlm,
    kind: ProfileKind,
    layout: Layout,
    transcript: &str,
) -> (u64, u64, usize) {
    let before = llm.prompt_stats();
    let analysis = analyse_checked(llm, kind, layout, transcript, Some("Agent"))
        .await
        .unwrap();
    let after = llm.prompt_stats();
    assert_eq!(
        after.evaluated - before.evaluated + after.reused - before.reused,
        analysis.usage.prompt_tokens
    );
    (
        after.evaluated - before.evaluated,
        analysis.usage.prompt_tokens,
        analysis.checked.sorted,
    )
}

async fn evaluated_prompts_are_reused_across_requests_analyses_and_a_growing_transcript(
    llm: &Arc<EmbeddedLlm>,
) {
    let live = LIVE_LAYOUT;
    // The live intent prompt is evaluated already: a live intent analysis evaluates at most
    // the transcript.
    let (first, prompt, _) = evaluated_for(llm, ProfileKind::Intent, live, TRANSCRIPT).await;
    assert!(
        first <= TRANSCRIPT.len() as u64 + 16,
        "{first} of {prompt} evaluated"
    );
    // A file's three analyses read the transcript once: the instructions and examples of
    // all three were evaluated at the warm-up, the first analysis evaluates the transcript,
    // and the other two only the name of their task.
    let file = FILE_LAYOUT;
    let (first, prompt, _) = evaluated_for(llm, ProfileKind::Intent, file, TRANSCRIPT).await;
    assert!(
        first <= TRANSCRIPT.len() as u64 + 16,
        "{first} of {prompt} evaluated"
    );
    // The check of their evidence sorts each quote with the check's own prompt, kept since
    // the warm-up: only the quote is evaluated.
    for kind in [ProfileKind::Bant, ProfileKind::NeatP] {
        let (evaluated, prompt, sorted) = evaluated_for(llm, kind, file, TRANSCRIPT).await;
        assert!(
            evaluated <= 16 + 64 * sorted as u64,
            "{kind:?}: {evaluated} of {prompt} evaluated, {sorted} quotes sorted"
        );
    }
    // Other prompts took the context; the live intent analysis of the same transcript
    // afterwards is found kept and evaluates next to nothing.
    let (again, prompt, _) = evaluated_for(llm, ProfileKind::Intent, live, TRANSCRIPT).await;
    assert!(again <= 16, "{again} of {prompt} evaluated");
    // A live call whose transcript grows, while another conversation uses the model between
    // its analyses: only the new lines are evaluated.
    let lines: Vec<&str> = TRANSCRIPT.lines().collect();
    let early = lines[..4].join("\n") + "\n";
    let later = lines.join("\n") + "\n";
    evaluated_for(llm, ProfileKind::Intent, live, &early).await;
    let chat = callstream::llm::Generation {
        messages: vec![
            callstream::llm::Message::new(callstream::llm::Role::System, "You are terse."),
            callstream::llm::Message::new(
                callstream::llm::Role::User,
                "Name three colours. ".repeat(20),
            ),
        ],
        tools: Vec::new(),
        sampling: callstream::llm::Sampling {
            max_tokens: 8,
            temperature: 0.0,
            ..Default::default()
        },
        json_schema: None,
        response_format: None,
        tenant: None,
        class: callstream::llm::fair::Class::default(),
        odds: None,
    };
    llm.generate(chat, None).await.unwrap();
    let new_bytes = (later.len() - early.len()) as u64;
    let (evaluated, prompt, _) = evaluated_for(llm, ProfileKind::Intent, live, &later).await;
    assert!(
        evaluated <= new_bytes + 16,
        "{evaluated} of {prompt} evaluated, {new_bytes} bytes new"
    );
    // Lines handed over to prepare (as a live call's intent actor does after its first
    // analyze) are read while the model is idle: the next analysis evaluates next to nothing.
    let latest = format!("{later}Agent: Great, I will send a proposal on Friday.\n");
    let before = llm.prompt_stats();
    LlmIntent::new(llm.clone()).prefill(latest.clone(), true);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while llm.prompt_stats() == before {
        assert!(
            std::time::Instant::now() < deadline,
            "the prefill never ran"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let (evaluated, prompt, _) = evaluated_for(llm, ProfileKind::Intent, live, &latest).await;
    assert!(evaluated <= 16, "{evaluated} of {prompt} evaluated");

    // A call read ahead before it has asked (an organisation's warm-up of the batch class, as
    // the service does for the calls holding a place for it) is read to its end too, as that
    // organisation's: the call's first analysis evaluates next to nothing.
    let asks = format!("{latest}Customer: And is the price per seat or per site?\n");
    let model: Arc<dyn Provider> = llm.clone();
    let ahead = callstream::llm::for_tenant(model.clone(), "org_a", Class::Batch);
    let before = llm.prompt_stats();
    ahead.prefill(
        messages(
            ProfileKind::Intent,
            live,
            Confidence::of(llm.as_ref()),
            &asks,
        ),
        None,
        Class::Batch,
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while llm.prompt_stats().warmed == before.warmed {
        assert!(
            std::time::Instant::now() < deadline,
            "the call was never read ahead"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let before = llm.prompt_stats();
    let call = callstream::llm::for_tenant(model, "org_a", Class::Live);
    let (_, usage) = analyse(call.as_ref(), ProfileKind::Intent, live, &asks, None)
        .await
        .unwrap();
    let evaluated = llm.prompt_stats().evaluated - before.evaluated;
    assert!(
        evaluated <= 16,
        "{evaluated} of {} evaluated",
        usage.prompt_tokens
    );
}
