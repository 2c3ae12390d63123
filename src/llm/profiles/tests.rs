//! The analyses on scripted models: what each step makes of answers the test writes.

use super::record::Record;
use super::*;
use crate::llm::{Generation, Message, PointOdds, Role};

/// `kind`'s record given in part as JSON: the fields it leaves out are `not_found`, without
/// summary or evidence.
fn full_record(kind: ProfileKind, part: &Value) -> Record {
    let mut full = no_speech_record(kind).to_value();
    for (name, field) in full.as_object_mut().unwrap() {
        *field = serde_json::json!({"status": "not_found", "summary": "", "evidence": []});
        if let Some(given) = part.get(name) {
            *field = given.clone();
        }
    }
    Record::parse(kind, &full.to_string()).unwrap()
}

/// The fields of `part` set to what they are in `record`.
fn write_back(record: &Record, part: &mut Value) {
    let all = record.to_value();
    for (name, field) in part.as_object_mut().unwrap() {
        *field = all[name.as_str()].clone();
    }
}

/// [`verify_evidence`] on a BANT record given in part (see [`full_record`]).
fn verify_part(part: &mut Value, transcript: &str, seller: Option<&str>) -> Quotes {
    let mut record = full_record(ProfileKind::Bant, part);
    let quotes = verify_evidence(&mut record, transcript, seller);
    write_back(&record, part);
    quotes
}

/// Odds taken where the statuses of `fields` were written, in turn.
fn status_odds(fields: &[&str], points: &[Vec<f32>]) -> Vec<PointOdds> {
    fields
        .iter()
        .zip(points)
        .map(|(name, p)| PointOdds {
            at: status_point(name),
            p: p.clone(),
        })
        .collect()
}

/// Odds taken where the intents were written, in turn.
fn intent_odds(points: &[Vec<f32>]) -> Vec<PointOdds> {
    points
        .iter()
        .enumerate()
        .map(|(i, p)| PointOdds {
            at: intent_point(i),
            p: p.clone(),
        })
        .collect()
}

/// A model that must not be asked.
struct Untouchable;

#[async_trait::async_trait]
impl Provider for Untouchable {
    async fn generate(
        &self,
        _: Generation,
        _: crate::llm::Deltas,
    ) -> Result<crate::llm::Completion, LlmError> {
        Err(LlmError::Engine("the model was asked".into()))
    }

    fn name(&self) -> &str {
        "untouchable"
    }
}

/// An answer's text and the odds taken in it.
type Answer = (&'static str, Vec<PointOdds>);

/// A model that gives the answers it was handed, in turn, and keeps what it was asked.
struct Scripted {
    answers: parking_lot::Mutex<Vec<Answer>>,
    asked: parking_lot::Mutex<Vec<Generation>>,
}

impl Scripted {
    fn new(mut answers: Vec<Answer>) -> Self {
        answers.reverse();
        Self {
            answers: answers.into(),
            asked: Vec::new().into(),
        }
    }
}

#[async_trait::async_trait]
impl Provider for Scripted {
    async fn generate(
        &self,
        generation: Generation,
        _: crate::llm::Deltas,
    ) -> Result<crate::llm::Completion, LlmError> {
        self.asked.lock().push(generation);
        let (text, odds) = self.answers.lock().pop().expect("asked once too often");
        Ok(crate::llm::Completion {
            text: text.to_owned(),
            tool_calls: Vec::new(),
            usage: Usage {
                prompt_tokens: 100,
                completion_tokens: 10,
                total_tokens: 110,
            },
            finish: crate::llm::FinishReason::Stop,
            odds,
        })
    }

    fn name(&self) -> &str {
        "scripted"
    }
}

/// Odds at the first intent: `given` label by label, none for the rest.
fn first_intent(given: &[(&str, f32)]) -> Vec<PointOdds> {
    let labels = intent_labels();
    let mut first = vec![0.0; labels.len()];
    for (label, p) in given {
        first[labels.iter().position(|l| l == label).unwrap()] = *p;
    }
    intent_odds(&[first])
}

const OTHER: &str = r#"{"intents":[{"intent":"other","confidence":"low"}],"reasoning":"unclear"}"#;
const BILLING: &str =
    r#"{"intents":[{"intent":"billing_inquiry","confidence":"high"}],"reasoning":"a fee"}"#;

/// The intent record `model` gives for `transcript`, as a file's analysis asks for it.
async fn intent_of(model: &Scripted, transcript: &str) -> (Value, Usage) {
    analyse(model, ProfileKind::Intent, Layout::Shared, transcript, None)
        .await
        .unwrap()
}

#[tokio::test]
async fn other_is_written_only_when_the_model_is_sure_of_it() {
    let transcript = "Customer: There is a fee on my statement.\n";
    let no_fit = intent_labels().iter().position(|l| l == NO_FIT).unwrap();
    // The model is asked once, with a floor on `other` at each intent it writes.
    let model = Scripted::new(vec![(
        BILLING,
        first_intent(&[
            (NO_FIT, 0.38),
            ("billing_inquiry", 0.36),
            ("complaint", 0.26),
        ]),
    )]);
    let (record, usage) = intent_of(&model, transcript).await;
    let asked = std::mem::take(&mut *model.asked.lock());
    assert_eq!(asked.len(), 1);
    assert_eq!(usage.total_tokens, 110);
    let odds = asked[0].odds.as_ref().unwrap();
    assert_eq!(odds.after, INTENT_AT);
    assert_eq!(odds.words, intent_labels());
    assert_eq!(odds.floor, Some((no_fit, NO_FIT_SURE)));
    assert!(!odds.only);
    // `other` was the likeliest but held back: the label written in its place is weighed
    // among the rest (0.36 of 0.62, medium), not against `other` too (0.36, low).
    assert_eq!(record["intents"][0]["intent"], "billing_inquiry");
    assert_eq!(record["intents"][0]["confidence"], "medium");
    assert_eq!(record["reasoning"], "a fee");

    // The same label, the model's own pick with `other` behind it: weighed as given.
    let model = Scripted::new(vec![(
        BILLING,
        first_intent(&[
            ("billing_inquiry", 0.45),
            (NO_FIT, 0.3),
            ("complaint", 0.25),
        ]),
    )]);
    let (record, _) = intent_of(&model, transcript).await;
    assert_eq!(record["intents"][0]["confidence"], "low");

    // `other` the model was sure of stands, weighed as given; so does the answer of a
    // model that tells no odds (an upstream one), with its own confidence.
    let model = Scripted::new(vec![(
        OTHER,
        first_intent(&[(NO_FIT, NO_FIT_SURE + 0.15), ("billing_inquiry", 0.45)]),
    )]);
    let (record, _) = intent_of(&model, transcript).await;
    assert_eq!(record["intents"][0]["intent"], NO_FIT);
    assert_eq!(record["intents"][0]["confidence"], "medium");
    let model = Scripted::new(vec![(OTHER, Vec::new())]);
    let (record, _) = intent_of(&model, transcript).await;
    assert_eq!(record["intents"][0]["intent"], NO_FIT);
    assert_eq!(record["intents"][0]["confidence"], "low");
    assert_eq!(record["reasoning"], "unclear");
}

#[test]
fn an_intent_is_as_sure_as_the_model_was() {
    let labels = intent_labels();
    let at = |label: &str| labels.iter().position(|l| l == label).unwrap();
    let point = |label: &str, p: f32| {
        let mut v = vec![0.0; labels.len()];
        v[at(label)] = p;
        v
    };
    let record = serde_json::json!({"intents": [
        {"intent": "billing_inquiry", "confidence": "high"},
        {"intent": "complaint", "confidence": "high"},
        {"intent": "refund_request", "confidence": "low"}
    ], "reasoning": "a fee"});
    let odds = [
        point("billing_inquiry", 0.45),
        point("complaint", 0.6),
        point("refund_request", 0.85),
    ];
    let typed = |v: &Value| match Record::parse(ProfileKind::Intent, &v.to_string()).unwrap() {
        Record::Intent(r) => r,
        _ => unreachable!(),
    };
    let mut weighed = typed(&record);
    weigh_intents(&mut weighed, &intent_odds(&odds));
    let weighed = Record::Intent(weighed).to_value();
    let levels: Vec<&Value> = (0..3)
        .map(|i| &weighed["intents"][i]["confidence"])
        .collect();
    assert_eq!(levels, ["low", "medium", "high"]);
    assert_eq!(weighed["reasoning"], "a fee");
    // An intent without odds, or with odds of other words, keeps its level; the others
    // are weighed.
    let mut part = typed(&record);
    weigh_intents(&mut part, &intent_odds(&odds[..2]));
    let part = Record::Intent(part).to_value();
    assert_eq!(part["intents"][1]["confidence"], "medium");
    assert_eq!(part["intents"][2]["confidence"], "low");
    for unfit in [
        intent_odds(&[vec![0.5; 3], vec![0.5; 3], vec![0.5; 3]]),
        Vec::new(),
        // Odds taken elsewhere are not the intents'.
        status_odds(&["intents"], &odds),
    ] {
        let mut same = typed(&record);
        weigh_intents(&mut same, &unfit);
        assert_eq!(Record::Intent(same).to_value(), record);
    }
}

#[tokio::test]
async fn a_transcript_without_speech_gets_the_fixed_record_without_the_model() {
    for transcript in ["", "\n", "Customer: \nAgent:  \n"] {
        for kind in [ProfileKind::Intent, ProfileKind::Bant, ProfileKind::NeatP] {
            let (record, usage) = analyse(&Untouchable, kind, Layout::Shared, transcript, None)
                .await
                .unwrap();
            assert_eq!(record, no_speech_record(kind).to_value());
            assert_eq!(usage, Usage::default());
        }
    }
    let intent = no_speech_record(ProfileKind::Intent).to_value();
    assert_eq!(intent["intents"][0]["intent"], "other");
    assert_eq!(intent["intents"][0]["confidence"], "low");
    let bant = no_speech_record(ProfileKind::Bant).to_value();
    let fields: Vec<&String> = bant.as_object().unwrap().keys().collect();
    assert_eq!(fields, ["budget", "authority", "need", "timeline"]);
    assert!(bant
        .as_object()
        .unwrap()
        .values()
        .all(|f| f["status"] == "not_found" && f["evidence"] == serde_json::json!([])));
    assert_eq!(
        no_speech_record(ProfileKind::NeatP)
            .to_value()
            .as_object()
            .unwrap()
            .len(),
        5
    );
    // Speech goes to the model.
    assert!(analyse(
        &Untouchable,
        ProfileKind::Intent,
        Layout::InstructionsFirst,
        "Customer: hello\n",
        None,
    )
    .await
    .is_err());
}

#[test]
fn profiles_load_and_keep_key_order() {
    for kind in [ProfileKind::Intent, ProfileKind::Bant, ProfileKind::NeatP] {
        let p = profile(kind);
        assert!(p.schema.is_object() && !p.prompt.is_empty());
    }
    let keys: Vec<&String> = profile(ProfileKind::NeatP).schema["properties"]
        .as_object()
        .unwrap()
        .keys()
        .collect();
    assert_eq!(
        keys,
        [
            "need",
            "economic_impact",
            "access_to_authority",
            "timeline",
            "priority"
        ]
    );
    assert_eq!(intent_labels().len(), 14);
    assert!(intent_labels().contains(&"order_status".to_owned()));
}

/// Where `value` breaks `schema` (the parts of JSON schema the profiles use: objects with
/// their keys in the schema's order, arrays with item counts, strings with enums and
/// lengths, numbers).
fn schema_errors(schema: &Value, value: &Value, at: &str) -> Vec<String> {
    let mut errors = Vec::new();
    match schema["type"].as_str() {
        Some("object") => {
            let props = schema["properties"].as_object().unwrap();
            let Some(obj) = value.as_object() else {
                return vec![format!("{at}: not an object")];
            };
            let want: Vec<&String> = props.keys().collect();
            let got: Vec<&String> = obj.keys().collect();
            if want != got {
                errors.push(format!("{at}: keys {got:?}, schema order {want:?}"));
            }
            for (key, sub) in props {
                if let Some(v) = obj.get(key) {
                    errors.extend(schema_errors(sub, v, &format!("{at}.{key}")));
                }
            }
        }
        Some("array") => {
            let Some(items) = value.as_array() else {
                return vec![format!("{at}: not an array")];
            };
            let min = schema["minItems"].as_u64().unwrap_or(0) as usize;
            let max = schema["maxItems"]
                .as_u64()
                .map_or(usize::MAX, |m| m as usize);
            if items.len() < min || items.len() > max {
                errors.push(format!("{at}: {} items", items.len()));
            }
            for (i, item) in items.iter().enumerate() {
                errors.extend(schema_errors(&schema["items"], item, &format!("{at}[{i}]")));
            }
        }
        Some("string") => match value.as_str() {
            None => errors.push(format!("{at}: not a string")),
            Some(text) => {
                if let Some(allowed) = schema["enum"].as_array() {
                    if !allowed.contains(value) {
                        errors.push(format!("{at}: {text:?} is not one of the enum"));
                    }
                }
                if let Some(max) = schema["maxLength"].as_u64() {
                    if text.chars().count() as u64 > max {
                        errors.push(format!("{at}: longer than {max}"));
                    }
                }
            }
        },
        Some("number") => {
            if !value.is_number() {
                errors.push(format!("{at}: not a number"));
            }
        }
        other => errors.push(format!("{at}: schema type {other:?} not checked")),
    }
    errors
}

#[test]
fn worked_examples_follow_their_schema_and_quote_their_transcripts() {
    for kind in [ProfileKind::Intent, ProfileKind::Bant, ProfileKind::NeatP] {
        let p = profile(kind);
        for (i, example) in p.examples.iter().enumerate() {
            let answer = example.answer.to_value();
            let errors = schema_errors(&p.schema, &answer, &format!("{kind:?}[{i}]"));
            assert!(errors.is_empty(), "{errors:#?}");
            if kind != ProfileKind::Intent {
                let mut checked = example.answer.clone();
                let quotes = verify_evidence(&mut checked, &example.transcript, Some("Agent"));
                assert_eq!(quotes.given, quotes.verbatim, "{kind:?}[{i}] quotes");
                assert_eq!(checked, example.answer, "{kind:?}[{i}]");
            }
        }
    }
    // Every label is shown at least once.
    let shown: std::collections::HashSet<String> = profile(ProfileKind::Intent)
        .examples
        .iter()
        .filter_map(|e| e.answer.intent())
        .flat_map(|r| r.intents.iter().map(|i| i.intent.name()))
        .collect();
    assert_eq!(shown.len(), intent_labels().len());
}

#[test]
fn examples_sit_between_the_instructions_and_the_transcript() {
    let m = messages(
        ProfileKind::Intent,
        Layout::InstructionsFirst,
        Confidence::Written,
        "Customer: hi",
    );
    let examples = profile(ProfileKind::Intent).examples.len();
    assert_eq!(m.len(), 2 + 2 * examples);
    assert_eq!(m[0].role, Role::System);
    assert_eq!(m[2].role, Role::Assistant);
    let last = m.last().unwrap();
    assert_eq!(
        (last.role, last.content.as_str()),
        (Role::User, "Transcript:\nCustomer: hi")
    );
    // The prefix every request of the profile shares ends where the transcript begins.
    let other = messages(
        ProfileKind::Intent,
        Layout::InstructionsFirst,
        Confidence::Written,
        "Agent: hello",
    );
    assert_eq!(m[..m.len() - 1], other[..other.len() - 1]);
    // The intent profile is shown the same whoever weighs its confidence.
    let weighed = messages(
        ProfileKind::Intent,
        Layout::InstructionsFirst,
        Confidence::Weighed,
        "Customer: hi",
    );
    assert_eq!(weighed, m);
}

#[test]
fn the_shared_layout_differs_only_in_its_last_words() {
    for confidence in [Confidence::Written, Confidence::Weighed] {
        the_shared_layout_differs_only_in_its_last_words_for(confidence);
    }
}

fn the_shared_layout_differs_only_in_its_last_words_for(confidence: Confidence) {
    let transcript = "Customer: I want to cancel.\nAgent: Sorry to hear that.\n";
    let prompts: Vec<Vec<Message>> = ProfileKind::ALL
        .iter()
        .map(|&kind| messages(kind, Layout::Shared, confidence, transcript))
        .collect();
    let examples: usize = ProfileKind::ALL
        .iter()
        .map(|&k| profile_for(k, confidence).examples.len())
        .sum();
    for (kind, m) in ProfileKind::ALL.iter().zip(&prompts) {
        assert_eq!(m.len(), 2 + 2 * examples);
        // Every profile's instructions, each under its task's name.
        for shown in ProfileKind::ALL {
            assert!(m[0]
                .content
                .contains(profile_for(shown, confidence).prompt.trim_end()));
            assert!(m[0]
                .content
                .contains(&format!("# Task: {}\n", shown.task())));
        }
        let last = &m.last().unwrap().content;
        assert_eq!(
            last,
            &format!(
                "Transcript:\nCustomer: I want to cancel.\nAgent: Sorry to hear that.\n\n\
                 Task: {}",
                kind.task()
            )
        );
    }
    // All but the last message are the same for the three tasks and for any transcript;
    // the last ones differ only after "Task: ".
    let other = messages(
        ProfileKind::Bant,
        Layout::Shared,
        confidence,
        "Agent: hello",
    );
    for m in &prompts {
        assert_eq!(m[..m.len() - 1], prompts[0][..m.len() - 1]);
        assert_eq!(m[..m.len() - 1], other[..other.len() - 1]);
        let (a, b) = (
            &m.last().unwrap().content,
            &prompts[0].last().unwrap().content,
        );
        let shared = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
        assert!(shared >= a.rfind("Task: ").unwrap() + "Task: ".len());
    }
    // Each example is asked with its own task and answered in that task's shape.
    let bant = &prompts[0][2 * profile_for(ProfileKind::Intent, confidence).examples.len() + 1..];
    assert!(bant[0].content.ends_with("Task: bant"));
    assert!(bant[1].content.starts_with("{\"budget\""));
}

#[test]
fn a_model_that_gives_odds_is_not_asked_for_the_confidence_they_give() {
    for kind in [ProfileKind::Bant, ProfileKind::NeatP] {
        let (written, weighed) = (profile(kind), profile_for(kind, Confidence::Weighed));
        assert!(written.prompt.contains(CONFIDENCE_LINE));
        assert!(!weighed.prompt.contains("confidence"), "{}", weighed.prompt);
        // Only that line is gone.
        let kept: Vec<&str> = written
            .prompt
            .lines()
            .filter(|l| !l.starts_with(CONFIDENCE_LINE))
            .collect();
        assert_eq!(weighed.prompt.lines().collect::<Vec<_>>(), kept);
        assert!(!weighed.schema.to_string().contains("confidence"));
        assert_eq!(
            weighed.schema["properties"]
                .as_object()
                .unwrap()
                .keys()
                .collect::<Vec<_>>(),
            written.schema["properties"]
                .as_object()
                .unwrap()
                .keys()
                .collect::<Vec<_>>()
        );
        let fields = |schema: &Value| -> Vec<Vec<String>> {
            schema["properties"]
                .as_object()
                .unwrap()
                .values()
                .map(|f| {
                    f["properties"]
                        .as_object()
                        .unwrap()
                        .keys()
                        .cloned()
                        .collect()
                })
                .collect()
        };
        for (w, g) in fields(&written.schema).iter().zip(fields(&weighed.schema)) {
            let without: Vec<&String> = w.iter().filter(|n| *n != "confidence").collect();
            assert_eq!(g.iter().collect::<Vec<_>>(), without);
        }
        assert!(llama_cpp_2::json_schema_to_grammar(&weighed.schema.to_string()).is_ok());
        // The examples: the same calls, answered the same but for the confidence.
        assert_eq!(weighed.examples.len(), written.examples.len());
        for (w, g) in written.examples.iter().zip(&weighed.examples) {
            assert_eq!(w.transcript, g.transcript);
            assert!(!g.answer.to_json().contains("confidence"));
            let mut stripped = w.answer.to_value();
            for field in stripped.as_object_mut().unwrap().values_mut() {
                field.as_object_mut().unwrap().remove("confidence");
            }
            assert_eq!(g.answer.to_value(), stripped);
            let errors = schema_errors(&weighed.schema, &g.answer.to_value(), &format!("{kind:?}"));
            assert!(errors.is_empty(), "{errors:#?}");
        }
        // The intent profile, and every profile for a model that tells no odds, as written.
        assert!(std::ptr::eq(
            profile_for(kind, Confidence::Written),
            written
        ));
    }
    assert!(std::ptr::eq(
        profile_for(ProfileKind::Intent, Confidence::Weighed),
        profile(ProfileKind::Intent)
    ));
}

#[test]
fn long_transcripts_lose_their_middle_lines() {
    let lines: Vec<String> = (0..100)
        .map(|i| {
            format!(
                "{}: line number {i:03}",
                if i % 2 == 0 { "Customer" } else { "Agent" }
            )
        })
        .collect();
    let transcript = lines.join("\n") + "\n";
    // About a quarter of it goes, from the middle, and a line says how much.
    let shorter = leave_out_middle(&transcript, transcript.len() / 4).unwrap();
    assert!(
        shorter.len() <= transcript.len() * 3 / 4 + 64,
        "{}",
        shorter.len()
    );
    let kept: Vec<&str> = shorter.lines().collect();
    assert_eq!(kept[0], lines[0]);
    assert_eq!(*kept.last().unwrap(), lines[99]);
    let marker = kept.iter().position(|l| l.starts_with('[')).unwrap();
    let left_out = 100 - (kept.len() - 1);
    assert_eq!(
        kept[marker],
        format!("[{left_out} lines of the conversation left out]")
    );
    assert!(left_out >= 25);
    // The opening and the end stay about as long.
    assert!((marker as isize - (kept.len() - 1 - marker) as isize).abs() <= 2);
    // Every kept line is whole and in order.
    let mut from = 0;
    for line in kept.iter().filter(|l| !l.starts_with('[')) {
        let at = lines[from..].iter().position(|l| l == line).unwrap();
        from += at + 1;
    }
    // Cutting again widens the same gap and counts the lines left out in all.
    let again = leave_out_middle(&shorter, shorter.len() / 2).unwrap();
    let kept_again: Vec<&str> = again.lines().collect();
    assert_eq!(kept_again.iter().filter(|l| l.starts_with('[')).count(), 1);
    let marker = kept_again.iter().find(|l| l.starts_with('[')).unwrap();
    assert_eq!(
        *marker,
        format!(
            "[{} lines of the conversation left out]",
            100 - (kept_again.len() - 1)
        )
    );
    assert_eq!(kept_again[0], lines[0]);
    // Nothing would be left: no transcript.
    assert_eq!(leave_out_middle("Customer: hello\n", 1_000), None);
}

#[test]
fn evidence_must_occur_in_the_transcript() {
    let transcript = "Customer: We have about fifty thousand dollars set aside.\nAgent: Great.\n\
                      Customer: Maybe next quarter, we'll see.";
    let mut record = serde_json::json!({
        "budget": {"status": "identified", "summary": "50k", "confidence": 1.4,
                   "evidence": ["\"We have about fifty  thousand dollars\"", "we have about FIFTY thousand",
                                "a million dollars", "Customer: set aside", "We have about fifty thousand dollars.",
                                "Customer: We have about fifty thousand dollars set aside. Agent: Great."]},
        "timeline": {"status": "identified", "summary": "soon", "confidence": 0.5,
                     "evidence": ["next week"]},
        "authority": {"status": "partial", "summary": "the boss", "confidence": 0.5,
                      "evidence": ["my boss signs"]},
        "need": {"status": "partial", "summary": "a quarter", "confidence": 0.5,
                 "evidence": ["maybe next quarter we'll see"]}
    });
    let quotes = verify_part(&mut record, transcript, None);
    assert_eq!(
        quotes,
        Quotes {
            given: 9,
            verbatim: 4,
            aligned: 0
        }
    );
    // Case, punctuation and white space aside, the words must be said in that order within
    // one speaker's line; each is written as the transcript has it, once. A speaker label
    // is not part of what was said, and a quote that runs across two lines is not said.
    assert_eq!(
        record["budget"]["evidence"],
        serde_json::json!([
            "We have about fifty thousand dollars",
            "We have about fifty thousand",
            "set aside."
        ])
    );
    assert_eq!(record["budget"]["confidence"], 1.0);
    assert_eq!(record["budget"]["status"], "identified");
    assert_eq!(
        record["need"]["evidence"],
        serde_json::json!(["Maybe next quarter, we'll see."])
    );
    assert_eq!(record["need"]["status"], "partial");
    // Claims without anything said behind them step down: identified to partial, partial
    // to not_found (which has no summary).
    assert_eq!(record["timeline"]["evidence"], serde_json::json!([]));
    assert_eq!(record["timeline"]["status"], "partial");
    assert_eq!(record["authority"]["status"], "not_found");
    assert_eq!(record["authority"]["summary"], "");
    for quote in record["budget"]["evidence"].as_array().unwrap() {
        assert!(transcript.contains(quote.as_str().unwrap()));
    }
}

#[test]
fn what_the_seller_says_is_not_evidence() {
    let transcript = "Agent: Our plan costs five hundred a month and we can install next week.\n\
                      Customer: That works, we install next week.\n\
                      Customer: I run the office.\n";
    let record = serde_json::json!({
        "budget": {"status": "identified", "summary": "500 a month", "confidence": 0.9,
                   "evidence": ["Our plan costs five hundred a month"]},
        "timeline": {"status": "identified", "summary": "next week", "confidence": 0.9,
                     "evidence": ["we can install next week", "we install next week"]},
        "authority": {"status": "partial", "summary": "runs the office", "confidence": 0.5,
                      "evidence": ["I run the office."]}
    });
    let mut checked = record.clone();
    let quotes = verify_part(&mut checked, transcript, Some("agent"));
    // The agent's "we can install next week" is nearly what the customer said, so it is
    // kept as the customer said it, once.
    assert_eq!(
        quotes,
        Quotes {
            given: 4,
            verbatim: 1,
            aligned: 1
        }
    );
    // The agent's price is not the buyer's budget: without other evidence it steps down.
    assert_eq!(checked["budget"]["status"], "partial");
    assert_eq!(checked["budget"]["evidence"], serde_json::json!([]));
    // The customer's words stand, wherever the agent said the same.
    assert_eq!(checked["timeline"]["status"], "identified");
    assert_eq!(
        checked["timeline"]["evidence"],
        serde_json::json!(["we install next week."])
    );
    assert_eq!(checked["authority"], record["authority"]);
    // Without a seller every speaker's words count.
    let mut all = record.clone();
    assert_eq!(
        verify_part(&mut all, transcript, None),
        Quotes {
            given: 4,
            verbatim: 4,
            aligned: 0
        }
    );
}

#[test]
fn a_near_quote_is_replaced_by_the_words_said() {
    let transcript = "Agent: Who decides on purchases?\n\
                      Customer: I'm the operations director, and I sign off purchases up to \
                      fifty thousand dollars myself.\n\
                      Customer: we need it running before april because the contract ends\n";
    let mut record = serde_json::json!({
        "authority": {"status": "identified", "summary": "signs off", "confidence": 0.9,
                      // One word changed.
                      "evidence": ["We sign off purchases up to fifty thousand dollars myself.",
                                   // Three words of ten changed: too far.
                                   "We sign off orders up to fifty thousand pounds myself."]},
        "timeline": {"status": "identified", "summary": "April", "confidence": 0.9,
                     // One word left out, one added.
                     "evidence": ["We need it running before April, because the old contract ends.",
                                  // Runs on past the end of the line.
                                  "running before april because the contract ends next month"]},
        "budget": {"status": "identified", "summary": "50k", "confidence": 0.9,
                   // Short quotes must be exact.
                   "evidence": ["fifty thousand pounds", "five hundred thousand"]},
        "need": {"status": "partial", "summary": "", "confidence": 0.5,
                 // Half from one line, half from the next: not said.
                 "evidence": ["fifty thousand dollars myself we need it running"]}
    });
    let quotes = verify_part(&mut record, transcript, Some("Agent"));
    assert_eq!(
        quotes,
        Quotes {
            given: 7,
            verbatim: 0,
            aligned: 2
        }
    );
    assert_eq!(
        record["authority"]["evidence"],
        serde_json::json!(["I sign off purchases up to fifty thousand dollars myself."])
    );
    assert_eq!(record["authority"]["status"], "identified");
    assert_eq!(
        record["timeline"]["evidence"],
        serde_json::json!(["we need it running before april because the contract ends"])
    );
    assert_eq!(record["budget"]["status"], "partial");
    assert_eq!(record["need"]["status"], "not_found");
    for field in ["authority", "timeline"] {
        for quote in record[field]["evidence"].as_array().unwrap() {
            assert!(transcript.contains(quote.as_str().unwrap()));
        }
    }
    // A near quote of the agent's line is not evidence either.
    let mut record = serde_json::json!({
        "need": {"status": "identified", "summary": "", "confidence": 0.9,
                 "evidence": ["Who decides on all purchases?"]}
    });
    verify_part(&mut record, transcript, Some("Agent"));
    assert_eq!(record["need"]["status"], "partial");
}

/// A sentence that takes back a figure of the one before it is quoted with it; sentences
/// that only name figures, or correct something else, stay apart.
#[test]
fn a_correction_is_quoted_with_the_sentence_it_corrects() {
    let said = "Hi. Our budgets are a payroll system in 8,000. No, sorry, 6,000 pounds per year.";
    assert_eq!(
        with_corrections(said),
        [
            "Hi.",
            "Our budgets are a payroll system in 8,000. No, sorry, 6,000 pounds per year."
        ]
    );
    let apart = "We have 8,000 pounds. We print 6,000 pages. No, sorry, I mean in a week.";
    assert_eq!(with_corrections(apart), sentences(apart));
    let buyer = buyer_sentences(&format!("Customer: {said}"), None);
    assert_eq!(buyer.len(), 2);
}

#[test]
fn quotes_are_the_sentences_said() {
    assert_eq!(
        sentences("Hi. We need 15.5 units... by June! \"Really?\" Yes"),
        [
            "Hi.",
            "We need 15.5 units...",
            "by June!",
            "\"Really?\"",
            "Yes"
        ]
    );
    assert_eq!(sentences("  "), Vec::<&str>::new());
    let long = "one two three four five six seven eight nine ten";
    for max in [5, 10, 20] {
        let pieces = cut_to(long, max);
        assert!(pieces.iter().all(|p| p.len() <= max), "{pieces:?}");
        assert_eq!(pieces.join(" "), long);
    }
    assert_eq!(
        cut_to("first part of it, second part of it", 20),
        ["first part of it,", "second part of it"]
    );
    assert_eq!(cut_to("short", 160), ["short"]);

    let transcript = "Agent: We have a deal. It ends soon.\n\
                      Customer: Our budget is ten thousand. We have a deal.\n\
                      [3 lines of the conversation left out]\n\
                      Customer: Our budget is ten thousand.\n";
    let (buyer, said) = quotable(transcript, Some("agent"));
    assert_eq!(buyer, ["Our budget is ten thousand.", "We have a deal."]);
    assert_eq!(
        said,
        [
            "We have a deal.",
            "It ends soon.",
            "Our budget is ten thousand."
        ]
    );
    assert_eq!(quotable(transcript, None).0, said);
}

#[test]
fn each_status_quotes_what_it_may() {
    let buyer = vec!["We have ten thousand.".to_owned()];
    let said = vec![
        "We have ten thousand.".to_owned(),
        "It is cheap.".to_owned(),
    ];
    let schema = quoting(&profile(ProfileKind::Bant).schema, &buyer, &said);
    assert_eq!(schema["$defs"]["buyer"]["enum"], serde_json::json!(buyer));
    assert_eq!(schema["$defs"]["said"]["enum"], serde_json::json!(said));
    for (name, field) in schema["properties"].as_object().unwrap() {
        let branches = field["anyOf"].as_array().unwrap();
        let by_status: Vec<(&str, &Value)> = branches
            .iter()
            .map(|b| {
                (
                    b["properties"]["status"]["enum"][0].as_str().unwrap(),
                    &b["properties"]["evidence"],
                )
            })
            .collect();
        assert_eq!(
            by_status.iter().map(|b| b.0).collect::<Vec<_>>(),
            STATUSES,
            "{name}"
        );
        assert_eq!(
            profile(ProfileKind::Bant).schema["properties"][name]["properties"]["evidence"]
                ["items"]["maxLength"],
            QUOTE_CHARS,
            "quotes are cut to the schema's longest"
        );
        assert_eq!(by_status[0].1["items"]["$ref"], "#/$defs/buyer");
        assert_eq!(by_status[1].1["items"]["$ref"], "#/$defs/said");
        assert_eq!(by_status[2].1["maxItems"], 0);
        assert_eq!(
            branches[0]["required"],
            profile(ProfileKind::Bant).schema["properties"][name]["required"]
        );
    }
    // The schema makes a grammar; with nothing said, every field quotes nothing.
    llama_cpp_2::json_schema_to_grammar(&schema.to_string()).unwrap();
    let none = quoting(&profile(ProfileKind::NeatP).schema, &[], &[]);
    assert_eq!(
        none["properties"]["need"]["anyOf"][0]["properties"]["evidence"]["maxItems"],
        0
    );
    llama_cpp_2::json_schema_to_grammar(&none.to_string()).unwrap();
}

#[test]
fn a_summary_copied_from_a_worked_example_is_found_in_any_profile() {
    let shown = profile(ProfileKind::NeatP).examples[0].answer.to_value()["timeline"]["summary"]
        .as_str()
        .expect("the first NEAT-P example has a timeline summary")
        .to_owned();
    let words: Vec<&str> = shown.split_whitespace().collect();
    assert!(words.len() >= 6, "{shown:?}");
    // The example's frame with two words of a call put in its middle.
    let framed = [
        &words[..2],
        &["fourth", "clinic"],
        &words[words.len() - 2..],
    ]
    .concat()
    .join(" ");
    // The example's first words, then the model's own.
    let own = format!(
        "{} the new system will be rolled out to every branch in turn",
        words[..3].join(" ")
    );
    let field = |status: &str, summary: &str| serde_json::json!({"status": status, "summary": summary, "evidence": []});
    let record = full_record(
        ProfileKind::Bant,
        &serde_json::json!({
            // A BANT record carrying NEAT-P's words, in other case and punctuation.
            "budget": field("partial", &shown.to_uppercase().replace(',', ";")),
            "authority": field("partial", &framed),
            "need": field("identified", &own),
            "timeline": field("identified", "Before April."),
        }),
    );
    assert_eq!(summarised_as_an_example(&record), ["budget", "authority"]);
    assert!(summarised_as_an_example(&no_speech_record(ProfileKind::Intent)).is_empty());
}

#[test]
fn a_field_is_pushed_past_not_found_when_that_was_likeliest_but_not_sure() {
    let odds = [
        vec![0.1, 0.1, 0.8],
        vec![0.02, 0.01, 0.97],
        vec![0.6, 0.1, 0.3],
        vec![0.3, 0.3, 0.4],
        vec![0.5, 0.5],
    ];
    let fields = [
        "need",
        "economic_impact",
        "access_to_authority",
        "timeline",
        "priority",
    ];
    let record = no_speech_record(ProfileKind::NeatP);
    assert_eq!(
        pushed_past_not_found(&record, &status_odds(&fields, &odds)),
        ["need", "timeline"]
    );
    assert!(pushed_past_not_found(&record, &[]).is_empty());
    // Odds are the field's they were taken at, whatever their order.
    let mut reversed = fields;
    reversed.reverse();
    assert_eq!(
        pushed_past_not_found(&record, &status_odds(&reversed, &odds)),
        ["economic_impact", "priority"]
    );
}

#[test]
fn a_status_is_as_sure_as_the_model_was() {
    let transcript = "Customer: We have ten thousand dollars for this.\n";
    let mut record = serde_json::json!({
        "budget": {"status": "identified", "summary": "10k", "confidence": 0.9,
                   "evidence": ["We have ten thousand dollars for this."]},
        "timeline": {"status": "identified", "summary": "soon", "confidence": 0.9,
                     "evidence": ["next week"]},
        "need": {"status": "not_found", "summary": "", "confidence": 0.8, "evidence": []}
    });
    verify_part(&mut record, transcript, None);
    let fields = ["budget", "timeline", "need"];
    let odds = status_odds(
        &fields,
        &[
            vec![0.7, 0.2, 0.1],
            vec![0.5, 0.3, 0.2],
            vec![0.004, 0.001, 0.995],
        ],
    );
    let weigh = |part: &Value, odds: &[PointOdds]| {
        let mut typed = full_record(ProfileKind::Bant, part);
        weigh_statuses(&mut typed, odds, &[]);
        let mut part = part.clone();
        write_back(&typed, &mut part);
        part
    };
    let weighed = weigh(&record, &odds);
    assert_eq!(weighed["budget"]["confidence"], 0.7);
    // Stepped down for want of evidence: as sure as the model was of partial.
    assert_eq!(weighed["timeline"]["status"], "partial");
    assert_eq!(weighed["timeline"]["confidence"], 0.3);
    assert_eq!(weighed["need"]["confidence"], 1.0);
    // Odds are found by the field they were taken at, not by their order.
    let mut shuffled = odds.clone();
    shuffled.reverse();
    assert_eq!(weigh(&record, &shuffled), weighed);
    // A field without odds of its statuses keeps its confidence.
    let unfit = [
        odds[..2].to_vec(),
        status_odds(&fields, &[vec![0.5, 0.5], vec![1.0], vec![1.0]]),
    ];
    for unfit in unfit {
        let same = weigh(&record, &unfit);
        assert_eq!(same["need"], record["need"]);
    }
    // A record written without confidence (the model was not asked for it) gets the
    // odds', and 0 where there are none to weigh.
    let mut unasked = record.clone();
    for field in unasked.as_object_mut().unwrap().values_mut() {
        field.as_object_mut().unwrap().remove("confidence");
    }
    let weighed = weigh(&unasked, &odds);
    assert_eq!(weighed["budget"]["confidence"], 0.7);
    assert_eq!(weighed["timeline"]["confidence"], 0.3);
    let none = weigh(&unasked, &[]);
    for field in none.as_object().unwrap().values() {
        assert_eq!(field["confidence"], 0.0);
    }
}

/// The schemas generated from the record types are the ones the analyses were measured with
/// (`fixtures/schemas/`): the same JSON and the same grammar. A change of the types that
/// changes a schema must be deliberate (and measured again): run this test with
/// `CALLSTREAM_BLESS_SCHEMAS=1` to write the new ones.
#[test]
fn the_generated_schemas_are_the_measured_ones() {
    let dir = callstream_actors::package_dir(env!("CARGO_MANIFEST_DIR")).join("fixtures/schemas");
    let bless = std::env::var_os("CALLSTREAM_BLESS_SCHEMAS").is_some();
    for kind in ProfileKind::ALL {
        let path = dir.join(format!("{}.json", kind.task()));
        let generated = record::schema_of(kind);
        if bless {
            let text = serde_json::to_string_pretty(&generated).unwrap() + "\n";
            std::fs::write(&path, text).unwrap();
        }
        let measured: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(generated, measured, "{kind:?}: {}", path.display());
        // Equal maps may list their keys in other orders; the grammar has the model write
        // them in the schema's order, so it must be the same too.
        assert_eq!(
            llama_cpp_2::json_schema_to_grammar(&generated.to_string()).unwrap(),
            llama_cpp_2::json_schema_to_grammar(&measured.to_string()).unwrap(),
            "{kind:?}"
        );
        assert_eq!(profile(kind).schema, generated);
    }
}

/// A record that strays from its type is refused, and the error names the field.
#[test]
fn a_record_that_strays_from_its_type_is_refused_by_field() {
    let err = Record::parse(
        ProfileKind::Intent,
        r#"{"intents":[{"intent":"billing_inquiry","confidence":"sure"}],"reasoning":""}"#,
    )
    .unwrap_err();
    assert!(err.starts_with("intents[0].confidence:"), "{err}");
    let err = Record::parse(ProfileKind::Bant, r#"{"budget":{}}"#).unwrap_err();
    assert!(err.starts_with("budget"), "{err}");
    let err = Record::parse(
        ProfileKind::Intent,
        r#"{"intents":[],"reasoning":"","extra":1}"#,
    )
    .unwrap_err();
    assert!(err.contains("extra"), "{err}");
    // Trailing text is not part of a record.
    assert!(Record::parse(ProfileKind::Intent, r#"{"intents":[],"reasoning":""} x"#).is_err());
}
