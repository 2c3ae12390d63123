//! Analysis profiles: intent, BANT and NEAT-P. Each is a prompt, a JSON schema and worked
//! examples (files in `src/llm/profiles/`): the prompt goes in the system message, the examples
//! are earlier user/assistant turns, and the transcript is the last user message ([`Layout`]: a
//! file's three analyses share one prompt that names the task at its end; a live call's intent
//! has the intent profile's alone). The model's output is constrained by the schema (a grammar
//! on the embedded model, `response_format` upstream), so it always parses. Evidence quotes are
//! then looked up in the transcript: those whose words were not said there are dropped, and a
//! status left without evidence steps down. Each quote left is sorted by topic in a short
//! request of its own (`check`): one about something other than its field is dropped, or
//! replaced by the buyer's sentence the field's summary speaks of. A transcript too long for
//! the model's window loses lines from its middle.
//!
//! The embedded model keeps evaluated prompts for reuse (`embedded::PrefixCache`): the
//! instructions and examples are evaluated once, a file's transcript once for its three
//! analyses, and on a live call each `analyze` evaluates only the part of the transcript that
//! is new since the call's last analysis or prefill.

use std::collections::HashSet;
use std::sync::{Arc, OnceLock};

use callstream_actors::asr::wer;
use callstream_actors::call::{IntentClassifier, IntentFuture};
use callstream_actors::transcript::{CLOSERS, SENTENCE_ENDS};
use serde_json::Value;

use super::{Generation, LlmError, Message, Odds, Provider, Role, Sampling, Usage};

mod check;
pub use check::Checked;

/// The analyses the service runs over transcripts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProfileKind {
    /// Customer intent (spec 2.6 shape).
    Intent,
    /// Budget, authority, need, timeline.
    Bant,
    /// Need, economic impact, access to authority, timeline, priority.
    NeatP,
}

/// A profile: its instructions, output schema and worked examples.
#[derive(Debug)]
pub struct Profile {
    /// System prompt.
    pub prompt: String,
    /// JSON schema of the output, keys in the order the model should write them.
    pub schema: Value,
    /// Worked examples, shown to the model as earlier turns of the conversation: a transcript
    /// and the answer to it, written compactly as the model should write its own.
    pub examples: Vec<Example>,
}

/// A transcript and the record the profile should give for it.
#[derive(Debug, serde::Deserialize)]
pub struct Example {
    /// `Speaker: text` lines.
    pub transcript: String,
    /// The expected record.
    pub answer: Value,
}

fn load(prompt: &'static str, schema: &'static str, examples: &'static str) -> Profile {
    Profile {
        prompt: prompt.to_owned(),
        schema: serde_json::from_str(schema)
            .expect("the profile schemas are valid JSON (checked by a test)"),
        examples: serde_json::from_str(examples)
            .expect("the profile examples are valid JSON (checked by a test)"),
    }
}

/// The profile of `kind`.
pub fn profile(kind: ProfileKind) -> &'static Profile {
    static INTENT: OnceLock<Profile> = OnceLock::new();
    static BANT: OnceLock<Profile> = OnceLock::new();
    static NEAT_P: OnceLock<Profile> = OnceLock::new();
    match kind {
        ProfileKind::Intent => INTENT.get_or_init(|| {
            load(
                include_str!("profiles/intent.md"),
                include_str!("profiles/intent.json"),
                include_str!("profiles/intent.examples.json"),
            )
        }),
        ProfileKind::Bant => BANT.get_or_init(|| {
            load(
                include_str!("profiles/bant.md"),
                include_str!("profiles/bant.json"),
                include_str!("profiles/bant.examples.json"),
            )
        }),
        ProfileKind::NeatP => NEAT_P.get_or_init(|| {
            load(
                include_str!("profiles/neat_p.md"),
                include_str!("profiles/neat_p.json"),
                include_str!("profiles/neat_p.examples.json"),
            )
        }),
    }
}

/// Where the confidence of a record's fields comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confidence {
    /// The model writes it, as its instructions and worked examples show (a model that tells
    /// no odds: an upstream one).
    Written,
    /// A BANT or NEAT-P field's confidence is the probability the model gave its status where
    /// it wrote it ([`weigh_statuses`]), so the model is neither asked for one nor shown one in
    /// the worked examples: about 60 tokens fewer to write per file (the embedded model). An
    /// intent's level is weighed as well ([`weigh_intents`]), but the model still writes one
    /// (a few tokens): the intent profile is shown as it was measured, on live calls too.
    Weighed,
}

impl Confidence {
    /// Where `provider`'s records get their confidence.
    pub fn of(provider: &dyn Provider) -> Self {
        if provider.gives_odds() {
            Confidence::Weighed
        } else {
            Confidence::Written
        }
    }
}

/// The profile of `kind` as the model is shown it when its records' `confidence` comes from
/// `confidence`: for [`Confidence::Weighed`], BANT and NEAT-P without the field's
/// `confidence` in the instructions, the schema and the worked examples.
pub fn profile_for(kind: ProfileKind, confidence: Confidence) -> &'static Profile {
    static BANT: OnceLock<Profile> = OnceLock::new();
    static NEAT_P: OnceLock<Profile> = OnceLock::new();
    match (kind, confidence) {
        (ProfileKind::Intent, _) | (_, Confidence::Written) => profile(kind),
        (ProfileKind::Bant, Confidence::Weighed) => {
            BANT.get_or_init(|| without_confidence(profile(kind)))
        }
        (ProfileKind::NeatP, Confidence::Weighed) => {
            NEAT_P.get_or_init(|| without_confidence(profile(kind)))
        }
    }
}

/// The line of a BANT or NEAT-P prompt that asks for each field's confidence.
const CONFIDENCE_LINE: &str = "- confidence:";

/// `profile` (BANT or NEAT-P) without its fields' `confidence`: not asked for in the prompt
/// (the line starting [`CONFIDENCE_LINE`]), not in the schema, not in the examples' answers.
fn without_confidence(profile: &Profile) -> Profile {
    let prompt = profile
        .prompt
        .lines()
        .filter(|line| !line.starts_with(CONFIDENCE_LINE))
        .collect::<Vec<_>>()
        .join("\n");
    let mut schema = profile.schema.clone();
    if let Some(fields) = schema["properties"].as_object_mut() {
        for field in fields.values_mut() {
            if let Some(properties) = field["properties"].as_object_mut() {
                properties.remove("confidence");
            }
            if let Some(required) = field["required"].as_array_mut() {
                required.retain(|name| name != "confidence");
            }
        }
    }
    let examples = profile
        .examples
        .iter()
        .map(|example| {
            let mut answer = example.answer.clone();
            if let Some(fields) = answer.as_object_mut() {
                for field in fields.values_mut() {
                    if let Some(field) = field.as_object_mut() {
                        field.remove("confidence");
                    }
                }
            }
            Example {
                transcript: example.transcript.clone(),
                answer,
            }
        })
        .collect();
    Profile {
        prompt: prompt + "\n",
        schema,
        examples,
    }
}

/// The intent labels of the intent profile, in its schema's order (read from it once).
pub fn intent_labels() -> &'static [String] {
    static LABELS: OnceLock<Vec<String>> = OnceLock::new();
    LABELS.get_or_init(|| {
        profile(ProfileKind::Intent).schema["properties"]["intents"]["items"]["properties"]
            ["intent"]["enum"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    })
}

/// Why a record was not asked of the model.
const NO_SPEECH: &str = "No speech was detected, so there is nothing to analyse.";

/// The fixed record of `kind` for a transcript without speech: intent `other` with `low`
/// confidence; every BANT / NEAT-P field `not_found`, without evidence.
pub fn no_speech_record(kind: ProfileKind) -> Value {
    if kind == ProfileKind::Intent {
        return serde_json::json!({
            "intents": [{"intent": "other", "confidence": "low"}],
            "reasoning": NO_SPEECH,
        });
    }
    let fields = profile(kind).schema["properties"]
        .as_object()
        .map(|props| {
            props
                .keys()
                .map(|k| {
                    (
                        k.clone(),
                        serde_json::json!({"status": "not_found", "summary": NO_SPEECH,
                            "confidence": 0.0, "evidence": []}),
                    )
                })
                .collect::<serde_json::Map<String, Value>>()
        })
        .unwrap_or_default();
    Value::Object(fields)
}

/// Runs a profile over `transcript` (one line per utterance, `Speaker: text`). A transcript
/// in which nobody said anything gets [`no_speech_record`] without asking the model, which
/// would otherwise invent an answer.
///
/// `seller` is the speaker label of the selling side (the agent), if the transcript has one:
/// what they say is not evidence of the buyer's budget, authority, need, timeline, economic
/// impact or priority (see [`verify_evidence`]).
pub async fn analyse(
    provider: &dyn Provider,
    kind: ProfileKind,
    layout: Layout,
    transcript: &str,
    seller: Option<&str>,
) -> Result<(Value, Usage), LlmError> {
    analyse_checked(provider, kind, layout, transcript, seller)
        .await
        .map(|a| (a.record, a.usage))
}

/// [`analyse`], also telling how many evidence quotes the model gave and kept.
pub async fn analyse_checked(
    provider: &dyn Provider,
    kind: ProfileKind,
    layout: Layout,
    transcript: &str,
    seller: Option<&str>,
) -> Result<Analysis, LlmError> {
    let spoken = transcript.lines().any(|l| {
        l.split_once(": ")
            .map_or(!l.trim().is_empty(), |(_, text)| !text.trim().is_empty())
    });
    if !spoken {
        return Ok(Analysis {
            record: no_speech_record(kind),
            usage: Usage::default(),
            quotes: Quotes::default(),
            checked: Checked::default(),
        });
    }
    let mut completion = generate_fitted(provider, kind, layout, transcript, seller).await?;
    let mut value = parse_answer(kind, &completion)?;
    tracing::debug!(?kind, answer = %completion.text.trim(), odds = ?completion.odds, "analysis answered");
    let (quotes, checked) = if kind == ProfileKind::Intent {
        weigh_intents(&mut value, &completion.odds);
        Default::default()
    } else {
        let quotes = verify_evidence(&mut value, transcript, seller);
        let pushed = pushed_past_not_found(&completion.odds);
        let doubted: Vec<bool> = summarised_as_an_example(&value)
            .into_iter()
            .enumerate()
            .map(|(i, copied)| copied || pushed.get(i).copied().unwrap_or(false))
            .collect();
        let checked =
            check::check_findings(provider, kind, &mut value, transcript, seller, &doubted).await?;
        completion.usage += checked.usage;
        // After the checks, so that a field they left not_found gets that status's probability.
        weigh_statuses(&mut value, &completion.odds);
        (quotes, checked)
    };
    Ok(Analysis {
        record: value,
        usage: completion.usage,
        quotes,
        checked,
    })
}

/// The record in `completion`'s text.
fn parse_answer(kind: ProfileKind, completion: &super::Completion) -> Result<Value, LlmError> {
    serde_json::from_str(completion.text.trim()).map_err(|e| {
        let tail: String = completion
            .text
            .chars()
            .rev()
            .take(200)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        LlmError::Engine(format!(
            "the {kind:?} analysis is not valid JSON ({e}; {:?}, ends {tail:?})",
            completion.finish
        ))
    })
}

/// The intent label for a contact none of the others fits.
const NO_FIT: &str = "other";

/// Least probability at which the model may write [`NO_FIT`] as an intent; below, it writes
/// the likeliest of the other labels there (the floor of the intent point's odds). The model
/// also picks `other` when it cannot tell which label fits (a prospect it is unsure is a
/// customer, a transcript with misheard words), and then with a probability that says so: on
/// the labelled set, the calls that are `other` got 0.50 to 0.82, the ones it put there
/// wrongly 0.20 to 0.39 (docs/benchmarks.md).
const NO_FIT_SURE: f32 = 0.4;

/// Least probability of an intent said to be `high` confidence, and of one said to be
/// `medium` (below, `low`). On the labelled set, transcribed, the main intents the model gave
/// at 0.8 or more were all right, those at 0.5 to 0.8 11 in 12, those below 0.5 8 in 15 (see
/// docs/benchmarks.md).
const INTENT_SURE: [f32; 2] = [0.8, 0.5];

/// Sets each intent's `confidence` from the probability the model gave its label where it
/// wrote it (`odds`, one point per intent, in order): `high`, `medium` or `low` by
/// [`INTENT_SURE`]. The confidence the model writes itself copies its worked examples. Where
/// the model would have written [`NO_FIT`] (the likeliest word there) but was held below
/// [`NO_FIT_SURE`], the label written instead is weighed among the labels other than
/// `other`, as the choice it was. Left as it is when the odds do not fit the record (an
/// upstream model gives none).
fn weigh_intents(record: &mut Value, odds: &[Vec<f32>]) {
    let labels = intent_labels();
    let no_fit = labels.iter().position(|l| l == NO_FIT);
    let Some(intents) = record["intents"].as_array_mut() else {
        return;
    };
    if intents.len() != odds.len() || odds.iter().any(|p| p.len() != labels.len()) {
        return;
    }
    for (intent, p) in intents.iter_mut().zip(odds) {
        let Some(at) = intent["intent"]
            .as_str()
            .and_then(|label| labels.iter().position(|l| l == label))
        else {
            continue;
        };
        let mut p_at = p[at];
        if let Some(no_fit) = no_fit.filter(|&i| i != at) {
            let held_back = p[no_fit] < NO_FIT_SURE && p.iter().all(|other| *other <= p[no_fit]);
            if held_back {
                p_at /= 1.0 - p[no_fit];
            }
        }
        let level = match p_at {
            p if p >= INTENT_SURE[0] => "high",
            p if p >= INTENT_SURE[1] => "medium",
            _ => "low",
        };
        intent["confidence"] = Value::from(level);
    }
}

/// Where the model is about to write an intent in an intent answer.
const INTENT_AT: &str = "\"intent\":\"";

/// Most tokens an analysis may answer with: room for the longest record the schemas allow in
/// ordinary text (an answer cut short would not parse). The same for every profile, so that
/// the three analyses of a long transcript leave out the same lines of it.
const ANSWER_TOKENS: u32 = 1280;

/// The statuses of a BANT or NEAT-P field, in the schemas' order.
const STATUSES: [&str; 3] = ["identified", "partial", "not_found"];
/// Where the model is about to write a field's status in a BANT or NEAT-P answer.
const STATUS_AT: &str = "\"status\":\"";

/// Least probability at which the model may write `not_found` for a BANT or NEAT-P field;
/// below, it writes the likelier of the other two statuses and backs the field with what it
/// finds, and the evidence check holds that field to a stricter standard (see
/// [`check::check_findings`]). Reading a whole call, the model called fields the buyer spoke
/// of `not_found` at 0.52 to 0.90 ("I make all the purchasing decisions myself": 0.80), as
/// sure as it was of fields nobody spoke of (0.46 to 0.97), so its status alone cannot tell
/// them apart; a quote sorted by topic on its own can (docs/benchmarks.md).
const NOT_FOUND_SURE: f32 = 0.95;

/// For each field of a BANT or NEAT-P answer, given the status odds where it was written,
/// whether the model would have written `not_found` there but was held back by
/// [`NOT_FOUND_SURE`]: `not_found` was the likeliest status, yet below that probability.
fn pushed_past_not_found(odds: &[Vec<f32>]) -> Vec<bool> {
    let last = STATUSES.len() - 1;
    odds.iter()
        .map(|p| {
            p.len() == STATUSES.len()
                && p[last] < NOT_FOUND_SURE
                && p[..last].iter().all(|other| *other <= p[last])
        })
        .collect()
}

/// Fewest words a summary must keep, in order, from a worked example's summary to count as
/// a copy of it (all of them when the example's is shorter).
const COPIED_WORDS: usize = 4;

/// Least share of a summary's own words that, kept in order from a worked example's summary,
/// make it a copy of that summary.
const COPIED_SHARE: f32 = 0.6;

/// For each field of a BANT or NEAT-P record, in order, whether its summary copies the
/// summary of a field in one of the worked examples (of any profile: the files layout shows
/// them all): most of its words are that summary's, in the same order, with case,
/// punctuation and the spelling of numbers aside. A small model copies an example's summary
/// instead of reading the call, whole or with a word or two of the call put in: the 0.5B
/// model wrote NEAT-P's "After the summer at the earliest, nothing fixed." as the timeline of
/// calls that named no time at all, and "After the fourth clinic, nothing fixed." (4 of its 6
/// words) on a call that had none; it then backs the copy with whatever sentence is nearest.
/// A summary that only shares the example's frame ("About 40 thousand dollars is set aside
/// for this project.", 5 of 10 words) is the model's own.
fn summarised_as_an_example(record: &Value) -> Vec<bool> {
    static EXAMPLES: OnceLock<Vec<Vec<String>>> = OnceLock::new();
    let examples = EXAMPLES.get_or_init(|| {
        ProfileKind::ALL
            .iter()
            .flat_map(|kind| &profile(*kind).examples)
            .filter_map(|e| e.answer.as_object())
            .flat_map(|answer| answer.values())
            .filter_map(|field| field["summary"].as_str())
            .map(wer::normalise)
            .filter(|words| !words.is_empty())
            .collect()
    });
    let copies = |summary: &str| {
        let own = wer::normalise(summary);
        !own.is_empty()
            && examples.iter().any(|example| {
                let kept = wer::words_in_order(example, &own);
                kept >= COPIED_WORDS.min(example.len())
                    && kept as f32 >= COPIED_SHARE * own.len() as f32
            })
    };
    record
        .as_object()
        .map(|fields| {
            fields
                .values()
                .map(|field| field["summary"].as_str().is_some_and(copies))
                .collect()
        })
        .unwrap_or_default()
}

/// Characters per token of English text, for a first guess at how much of a transcript to
/// leave out (the model then counts again).
const CHARS_PER_TOKEN: usize = 4;

/// Times a transcript is shortened to fit the model's window before the analysis gives up.
const FIT_ATTEMPTS: usize = 4;

/// Asks the model for analysis `kind` of `transcript`. A transcript too long for the model's
/// window, with room for the answer, is shortened from its middle (the opening, where callers
/// say why they call, and the end, where they agree on next steps, are kept) until it fits.
async fn generate_fitted(
    provider: &dyn Provider,
    kind: ProfileKind,
    layout: Layout,
    transcript: &str,
    seller: Option<&str>,
) -> Result<super::Completion, LlmError> {
    let confidence = Confidence::of(provider);
    let shown = profile_for(kind, confidence);
    let mut fitted = std::borrow::Cow::Borrowed(transcript);
    let mut attempts = 0;
    loop {
        let generation = Generation {
            messages: messages(kind, layout, confidence, &fitted),
            tools: Vec::new(),
            sampling: Sampling {
                max_tokens: ANSWER_TOKENS,
                temperature: 0.0,
                ..Sampling::default()
            },
            json_schema: Some(match kind {
                ProfileKind::Intent => shown.schema.clone(),
                _ if provider.keeps_to_any_schema() => {
                    let (buyer, said) = quotable(&fitted, seller);
                    quoting(&shown.schema, &buyer, &said)
                }
                _ => shown.schema.clone(),
            }),
            response_format: None,
            odds: Some(if kind == ProfileKind::Intent {
                Odds {
                    after: INTENT_AT.to_owned(),
                    words: intent_labels().to_vec(),
                    floor: intent_labels()
                        .iter()
                        .position(|l| l == NO_FIT)
                        .map(|at| (at, NO_FIT_SURE)),
                    only: false,
                }
            } else {
                Odds {
                    after: STATUS_AT.to_owned(),
                    words: STATUSES.iter().map(|s| s.to_string()).collect(),
                    floor: Some((STATUSES.len() - 1, NOT_FOUND_SURE)),
                    only: false,
                }
            }),
        };
        match provider.generate(generation, None).await {
            Err(LlmError::ContextOverflow { prompt, limit }) if attempts < FIT_ATTEMPTS => {
                attempts += 1;
                // Whole steps of 256 tokens: the three analyses' prompts differ by a few
                // tokens, and should still leave out the same lines.
                let excess = (prompt + ANSWER_TOKENS as usize)
                    .saturating_sub(limit)
                    .max(1)
                    .div_ceil(256)
                    * 256;
                match leave_out_middle(&fitted, excess * CHARS_PER_TOKEN) {
                    Some(shorter) => {
                        tracing::debug!(
                            ?kind,
                            prompt,
                            limit,
                            chars = shorter.len(),
                            "transcript shortened to fit the model's window"
                        );
                        fitted = std::borrow::Cow::Owned(shorter);
                    }
                    None => return Err(LlmError::ContextOverflow { prompt, limit }),
                }
            }
            other => return other,
        }
    }
}

/// Longest evidence quote the schemas allow (`maxLength` of an evidence item).
const QUOTE_CHARS: usize = 160;

/// What a BANT or NEAT-P answer may quote of `transcript` (its lines read `Speaker: text`):
/// each sentence said by the buyer (anyone but the `seller`), and each sentence said by
/// anyone, as the transcript has them; a sentence longer than a quote is cut at its commas
/// (or, failing that, between words). A model that quotes from memory changes words, joins
/// lines or quotes the agent; held to these, it copies what was said.
fn quotable(transcript: &str, seller: Option<&str>) -> (Vec<String>, Vec<String>) {
    let labels = speaker_labels(transcript);
    let (mut buyer, mut said) = (Vec::new(), Vec::new());
    let (mut seen_buyer, mut seen_said) = (HashSet::new(), HashSet::new());
    for line in transcript.lines() {
        let text = strip_label(line, &labels);
        if text.len() == line.len() {
            // A line without a speaker (a note of lines left out).
            continue;
        }
        let by_seller = said_by(line, seller);
        for sentence in sentences(text) {
            for piece in cut_to(sentence, QUOTE_CHARS) {
                if seen_said.insert(piece) {
                    said.push(piece.to_owned());
                }
                if !by_seller && seen_buyer.insert(piece) {
                    buyer.push(piece.to_owned());
                }
            }
        }
    }
    (buyer, said)
}

/// `line` (`Speaker: text`) is said by `seller` (a speaker label, any case).
fn said_by(line: &str, seller: Option<&str>) -> bool {
    seller
        .is_some_and(|seller| speaker_of(line).is_some_and(|who| who.eq_ignore_ascii_case(seller)))
}

/// The sentences of `text`: each ends after a mark of [`SENTENCE_ENDS`] (with the
/// [`CLOSERS`] after it) that white space follows, trimmed.
fn sentences(text: &str) -> Vec<&str> {
    cut_after(text, &SENTENCE_ENDS)
}

/// `text` cut after each run of `marks` (with the [`CLOSERS`] after it) that white space
/// follows, in trimmed pieces ("2,000" is not cut at its comma).
fn cut_after<'a>(text: &'a str, marks: &[char]) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if !marks.contains(&c) {
            continue;
        }
        let mut end = i + c.len_utf8();
        while let Some(&(j, next)) = chars.peek() {
            if marks.contains(&next) || CLOSERS.contains(&next) {
                end = j + next.len_utf8();
                chars.next();
            } else {
                break;
            }
        }
        if chars.peek().is_none_or(|&(_, next)| next.is_whitespace()) {
            out.push(text[start..end].trim());
            start = end;
        }
    }
    out.push(text[start..].trim());
    out.retain(|s| !s.is_empty());
    out
}

/// `text` in pieces of at most `max` bytes: whole when it fits, else cut after its commas or
/// semicolons, else between words (a word longer than `max` is cut at a character).
fn cut_to(text: &str, max: usize) -> Vec<&str> {
    if text.len() <= max {
        return vec![text];
    }
    let mut out = Vec::new();
    let mut rest = text;
    while rest.len() > max {
        let mut at = max;
        while !rest.is_char_boundary(at) {
            at -= 1;
        }
        let head = &rest[..at];
        let cut = head
            .rfind([',', ';'])
            .map(|i| i + 1)
            .filter(|&i| i > max / 4)
            .or_else(|| head.rfind(' ').filter(|&i| i > 0))
            .unwrap_or(at);
        out.push(rest[..cut].trim());
        rest = rest[cut..].trim_start();
    }
    out.push(rest.trim());
    out.retain(|s| !s.is_empty());
    out
}

/// `schema` (a BANT or NEAT-P profile's) with every field's evidence held to what was said,
/// by status: an `identified` field quotes sentences of the buyer (`buyer`), a `partial` one
/// sentences of anyone (`said`: a hint the model can back only with the seller's words is
/// then dropped by [`verify_evidence`]), and a `not_found` one quotes nothing. The two lists
/// are written once, under `$defs`, and every field refers to them.
fn quoting(schema: &Value, buyer: &[String], said: &[String]) -> Value {
    let mut schema = schema.clone();
    let quotes = |list: &[String], name: &str| {
        if list.is_empty() {
            serde_json::json!({"type": "array", "maxItems": 0})
        } else {
            serde_json::json!({
                "type": "array",
                "maxItems": 2,
                "items": {"$ref": format!("#/$defs/{name}")}
            })
        }
    };
    if let Some(fields) = schema["properties"].as_object_mut() {
        for field in fields.values_mut() {
            if !field["properties"]["evidence"].is_object() {
                continue;
            }
            let branches: Vec<Value> = STATUSES
                .iter()
                .map(|&status| {
                    let mut branch = field.clone();
                    branch["properties"]["status"] = serde_json::json!({"enum": [status]});
                    branch["properties"]["evidence"] = match status {
                        "identified" => quotes(buyer, "buyer"),
                        "partial" => quotes(said, "said"),
                        _ => quotes(&[], ""),
                    };
                    branch
                })
                .collect();
            *field = serde_json::json!({"anyOf": branches});
        }
    }
    let mut defs = serde_json::Map::new();
    for (name, list) in [("buyer", buyer), ("said", said)] {
        if !list.is_empty() {
            defs.insert(name.into(), serde_json::json!({"enum": list}));
        }
    }
    schema["$defs"] = Value::Object(defs);
    schema
}

/// `transcript` without at least `chars` characters of whole lines from its middle, which a
/// line saying how many were left out replaces; `None` when that would leave out everything.
fn leave_out_middle(transcript: &str, chars: usize) -> Option<String> {
    let lines: Vec<&str> = transcript.lines().collect();
    let marker = |n: usize| format!("[{n} lines of the conversation left out]");
    // An earlier cut's marker is where the gap widens from; its count is carried over.
    let earlier = lines
        .iter()
        .position(|l| l.starts_with('[') && l.ends_with("left out]"));
    let carried: usize = earlier
        .and_then(|at| lines[at][1..].split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    let n = lines.len();
    let (mut lo, mut hi) = earlier.map_or((n / 2, n / 2), |at| (at, at + 1));
    let size = |l: &str| l.len() + 1;
    let (mut before, mut after): (usize, usize) = (
        lines[..lo].iter().map(|l| size(l)).sum(),
        lines[hi..].iter().map(|l| size(l)).sum(),
    );
    let mut removed: usize = lines[lo..hi].iter().map(|l| size(l)).sum();
    let wanted = chars + marker(0).len();
    while removed < wanted {
        // Take from the longer side, so the opening and the end stay about as long.
        if lo > 0 && (hi == n || before >= after) {
            lo -= 1;
            before -= size(lines[lo]);
            removed += size(lines[lo]);
        } else if hi < n {
            after -= size(lines[hi]);
            removed += size(lines[hi]);
            hi += 1;
        } else {
            break;
        }
    }
    if lo == 0 && hi == n {
        return None;
    }
    let left_out = hi - lo - usize::from(earlier.is_some()) + carried;
    let mut out = String::with_capacity(transcript.len());
    for line in &lines[..lo] {
        out.push_str(line);
        out.push('\n');
    }
    out.push_str(&marker(left_out));
    out.push('\n');
    for line in &lines[hi..] {
        out.push_str(line);
        out.push('\n');
    }
    Some(out)
}

/// Where a prompt puts the transcript: what the model can keep evaluated between requests
/// depends on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// The profile's instructions and worked examples, then the transcript. A transcript that
    /// grows (a live call) only adds tokens at the end, so each analysis evaluates only the new
    /// lines. The layout of a live call's intent analyses ([`LIVE_LAYOUT`]).
    InstructionsFirst,
    /// The instructions and worked examples of all three profiles, the transcript, then the
    /// name of the task. Everything but the last few tokens is the same for the three analyses
    /// of one transcript, so the transcript is evaluated once for all of them, and what comes
    /// before it is the same for every transcript. The layout of `POST /api/transcribe`'s
    /// analyses ([`FILE_LAYOUT`]).
    Shared,
}

/// How an uploaded file's analyses are prompted.
pub const FILE_LAYOUT: Layout = Layout::Shared;

/// How a live call's intent analyses are prompted: only the intent profile's instructions
/// come before the transcript, so the prompt a call keeps between its analyses stays short.
pub const LIVE_LAYOUT: Layout = Layout::InstructionsFirst;

impl ProfileKind {
    /// All profiles, in the order of [`Layout::Shared`]'s instructions.
    pub const ALL: [ProfileKind; 3] = [ProfileKind::Intent, ProfileKind::Bant, ProfileKind::NeatP];

    /// The task's name in [`Layout::Shared`] prompts (the response field it fills).
    pub fn task(self) -> &'static str {
        match self {
            ProfileKind::Intent => "intent",
            ProfileKind::Bant => "bant",
            ProfileKind::NeatP => "neat_p",
        }
    }
}

/// The system prompt of [`Layout::Shared`]: every profile's instructions under its task name.
fn shared_instructions(confidence: Confidence) -> &'static str {
    static WRITTEN: OnceLock<String> = OnceLock::new();
    static WEIGHED: OnceLock<String> = OnceLock::new();
    let text = match confidence {
        Confidence::Written => &WRITTEN,
        Confidence::Weighed => &WEIGHED,
    };
    text.get_or_init(|| {
        let mut text = String::from(
            "You analyse contact-center call and chat transcripts. Each user message is a \
             transcript followed by one task: intent, bant or neat_p. Do that task alone, as its \
             section below says, and answer only with its JSON.",
        );
        for kind in ProfileKind::ALL {
            text.push_str("\n\n# Task: ");
            text.push_str(kind.task());
            text.push_str("\n\n");
            text.push_str(profile_for(kind, confidence).prompt.trim_end());
        }
        text
    })
}

/// The last user message of a [`Layout::Shared`] prompt: the transcript, then the task.
fn shared_request(kind: ProfileKind, transcript: &str) -> String {
    format!(
        "Transcript:\n{}\n\nTask: {}",
        transcript.trim_end(),
        kind.task()
    )
}

/// The conversation that asks for analysis `kind` of `transcript`. The worked examples come
/// between the instructions and the transcript, as earlier turns: with
/// [`Layout::InstructionsFirst`] everything before the transcript is the same for every
/// request of the profile, with [`Layout::Shared`] for every request of any profile. The
/// instructions and examples are those of `confidence` ([`profile_for`]).
pub fn messages(
    kind: ProfileKind,
    layout: Layout,
    confidence: Confidence,
    transcript: &str,
) -> Vec<Message> {
    let profile = profile_for(kind, confidence);
    match layout {
        Layout::InstructionsFirst => {
            let mut messages = vec![Message::new(Role::System, profile.prompt.as_str())];
            for example in &profile.examples {
                messages.push(Message::new(
                    Role::User,
                    format!("Transcript:\n{}", example.transcript),
                ));
                messages.push(Message::new(Role::Assistant, example.answer.to_string()));
            }
            messages.push(Message::new(
                Role::User,
                format!("Transcript:\n{transcript}"),
            ));
            messages
        }
        Layout::Shared => {
            let mut messages = vec![Message::new(Role::System, shared_instructions(confidence))];
            for shown in ProfileKind::ALL {
                for example in &profile_for(shown, confidence).examples {
                    messages.push(Message::new(
                        Role::User,
                        shared_request(shown, &example.transcript),
                    ));
                    messages.push(Message::new(Role::Assistant, example.answer.to_string()));
                }
            }
            messages.push(Message::new(Role::User, shared_request(kind, transcript)));
            messages
        }
    }
}

/// The starts that analyses share, for warming a model up: the live intent prompt up to the
/// transcript, the file analyses' prompt up to the transcript, and the check of BANT and
/// NEAT-P findings up to its question, for a model whose records get their confidence from
/// `confidence`.
pub fn warm_ups(confidence: Confidence) -> [Vec<Message>; 3] {
    [
        messages(ProfileKind::Intent, LIVE_LAYOUT, confidence, ""),
        messages(ProfileKind::Intent, FILE_LAYOUT, confidence, ""),
        check::instructions(),
    ]
}

/// Evidence quotes of a record: how many the model gave, how many of them occur verbatim in
/// the transcript, and how many more were near-verbatim and replaced by the words said (the
/// others are dropped).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Quotes {
    /// Quotes the model gave.
    pub given: usize,
    /// Of those, quotes found in the transcript.
    pub verbatim: usize,
    /// Of those, quotes not found as given but aligned to what was said (see
    /// [`verify_evidence`]).
    pub aligned: usize,
}

/// The result of one analysis.
#[derive(Debug, Clone)]
pub struct Analysis {
    /// The record (quotes checked).
    pub record: Value,
    /// Tokens spent.
    pub usage: Usage,
    /// The evidence quotes, before the check.
    pub quotes: Quotes,
    /// What the check of the evidence by topic did (BANT and NEAT-P).
    pub checked: Checked,
}

/// The words of `s`: where each starts and ends, and its letters and digits in lower case.
/// Words without letters or digits (a lone dash) are left out.
fn words(s: &str) -> Vec<(usize, usize, String)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, ch) in s.char_indices().chain(std::iter::once((s.len(), ' '))) {
        match (ch.is_whitespace(), start) {
            (false, None) => start = Some(i),
            (true, Some(from)) => {
                let key: String = s[from..i]
                    .chars()
                    .filter(|c| c.is_alphanumeric())
                    .flat_map(char::to_lowercase)
                    .collect();
                if !key.is_empty() {
                    out.push((from, i, key));
                }
                start = None;
            }
            _ => {}
        }
    }
    out
}

/// Who says `line` (`Speaker: text`), before any check that it is a label.
fn speaker_of(line: &str) -> Option<&str> {
    line.split_once(": ").map(|(who, _)| who.trim())
}

/// The speaker labels of a transcript whose lines read `Speaker: text`.
fn speaker_labels(transcript: &str) -> Vec<String> {
    let mut labels: Vec<String> = transcript
        .lines()
        .filter_map(speaker_of)
        .filter(|who| !who.is_empty() && who.len() <= 32 && who.split_whitespace().count() <= 3)
        .map(str::to_owned)
        .collect();
    labels.sort();
    labels.dedup();
    labels
}

fn strip_label<'a>(s: &'a str, labels: &[String]) -> &'a str {
    labels
        .iter()
        .find_map(|l| {
            s.strip_prefix(l.as_str())
                .and_then(|rest| rest.strip_prefix(": "))
        })
        .unwrap_or(s)
}

/// Most evidence quotes read per criterion (the schemas allow two; an upstream model may not
/// keep to them).
const MAX_QUOTES: usize = 8;

/// A line of what was said and its words (see [`words`]).
type SpokenLine<'a> = (&'a str, Vec<(usize, usize, String)>);

/// Where `quote` was said: the same words in the same order within one line of `spoken`
/// (case and punctuation aside), as the transcript has them.
fn find_quote<'a>(wanted: &[String], spoken: &[SpokenLine<'a>]) -> Option<&'a str> {
    if wanted.is_empty() {
        return None;
    }
    spoken.iter().find_map(|(line, have)| {
        have.windows(wanted.len())
            .find(|w| w.iter().zip(wanted).all(|(h, k)| h.2 == *k))
            .map(|w| &line[w[0].0..w[w.len() - 1].1])
    })
}

/// Fewest words a quote needs before a near miss is aligned; shorter quotes must be exact.
const ALIGN_MIN_WORDS: usize = 5;
/// Longest quote that is aligned (the alignment costs its length times the transcript's).
const ALIGN_MAX_WORDS: usize = 64;

/// Where a quote's words meet a line's: how many match, and the first and last matched word
/// of each (indices into their word lists).
struct Alignment {
    matched: usize,
    quote: (usize, usize),
    line: (usize, usize),
}

/// The best local alignment of `quote` in `line` (words as [`words`] keys them). Scores a
/// match +2 and a substitution, insertion or deletion -1 (Smith-Waterman), so the alignment
/// is a compact stretch where most words agree, and one slip between matches does not cut it.
fn align_words(quote: &[String], line: &[(usize, usize, String)]) -> Option<Alignment> {
    let (n, m) = (quote.len(), line.len());
    let width = m + 1;
    let mut score = vec![0i32; (n + 1) * width];
    let mut best = (0, 0, 0);
    for i in 1..=n {
        for j in 1..=m {
            let same = quote[i - 1] == line[j - 1].2;
            let diagonal = score[(i - 1) * width + j - 1] + if same { 2 } else { -1 };
            let up = score[(i - 1) * width + j] - 1;
            let left = score[i * width + j - 1] - 1;
            let s = diagonal.max(up).max(left).max(0);
            score[i * width + j] = s;
            if s > best.0 {
                best = (s, i, j);
            }
        }
    }
    let (_, mut i, mut j) = best;
    if i == 0 {
        return None;
    }
    let (last_q, last_l) = (i - 1, j - 1);
    let (mut first_q, mut first_l, mut matched) = (last_q, last_l, 0);
    while i > 0 && j > 0 && score[i * width + j] > 0 {
        let s = score[i * width + j];
        let same = quote[i - 1] == line[j - 1].2;
        if same && s == score[(i - 1) * width + j - 1] + 2 {
            matched += 1;
            (first_q, first_l) = (i - 1, j - 1);
            (i, j) = (i - 1, j - 1);
        } else if !same && s == score[(i - 1) * width + j - 1] - 1 {
            (i, j) = (i - 1, j - 1);
        } else if s == score[(i - 1) * width + j] - 1 {
            i -= 1;
        } else {
            j -= 1;
        }
    }
    Some(Alignment {
        matched,
        quote: (first_q, last_q),
        line: (first_l, last_l),
    })
}

/// The words of one line of `spoken` that `quote` nearly repeats, as the transcript has them:
/// a model often changes a word of what it quotes ("we sign off" for "I sign off"), and a
/// transcript heard by the speech engine has its own slips. The quote must have at least
/// [`ALIGN_MIN_WORDS`] words, and at most one word in five may differ, be missing or be
/// added, all within one line: quote words before the first or after the last match stand
/// for the line's words next to them, so a quote that runs past either end of the line does
/// not align.
fn align_quote<'a>(wanted: &[String], spoken: &[SpokenLine<'a>]) -> Option<&'a str> {
    let n = wanted.len();
    if !(ALIGN_MIN_WORDS..=ALIGN_MAX_WORDS).contains(&n) {
        return None;
    }
    let slack = n / 5;
    spoken
        .iter()
        .filter_map(|(line, have)| {
            let Alignment {
                matched,
                quote: (q0, q1),
                line: (l0, l1),
            } = align_words(wanted, have)?;
            let (before, after) = (q0, n - 1 - q1);
            if before > l0 || l1 + after >= have.len() {
                return None;
            }
            let (from, to) = (l0 - before, l1 + after);
            let span = to - from + 1;
            (matched + slack >= n && span <= n + slack && span + slack >= n)
                .then(|| (matched, &line[have[from].0..have[to].1]))
        })
        .max_by_key(|(matched, _)| *matched)
        .map(|(_, said)| said)
}

/// Keeps only evidence quotes that were said in `transcript` (its lines read `Speaker: text`):
/// the same words in the same order within one speaker's line, case and punctuation aside (a
/// speaker label at the start of a quote is not part of it), or, for a quote of five words
/// or more, nearly the same words within one line (see [`align_quote`]). Lines of the
/// `seller` (a speaker label, any case) do not count: the agent's pitch, prices and offers
/// say nothing of what the buyer has, needs or decides. Each kept quote is written as the
/// transcript has it, so it is a substring of the transcript. A status must rest on what was
/// said: a criterion marked identified that is left with no evidence becomes partial, one
/// marked partial with no evidence becomes not_found, and a not_found one has no summary or
/// evidence. Confidences are clamped to 0..1. Returns how many quotes there were and how many
/// were kept, as given or aligned.
pub fn verify_evidence(record: &mut Value, transcript: &str, seller: Option<&str>) -> Quotes {
    let labels = speaker_labels(transcript);
    let spoken: Vec<SpokenLine> = transcript
        .lines()
        .filter(|l| !said_by(l, seller))
        .map(|l| {
            let said = strip_label(l, &labels);
            (said, words(said))
        })
        .collect();
    let mut quotes = Quotes::default();
    let Some(criteria) = record.as_object_mut() else {
        return quotes;
    };
    for criterion in criteria.values_mut() {
        let Some(c) = criterion.as_object_mut() else {
            continue;
        };
        if let Some(Value::Array(given)) = c.get_mut("evidence") {
            let mut kept: Vec<Value> = Vec::new();
            for quote in given.iter().take(MAX_QUOTES).filter_map(Value::as_str) {
                let quote = quote
                    .trim()
                    .trim_matches(|ch| matches!(ch, '"' | '\'' | '“' | '”'));
                let wanted: Vec<String> = words(strip_label(quote, &labels))
                    .into_iter()
                    .map(|(_, _, key)| key)
                    .collect();
                let (said, exact) = match find_quote(&wanted, &spoken) {
                    Some(said) => (said, true),
                    None => match align_quote(&wanted, &spoken) {
                        Some(said) => (said, false),
                        None => continue,
                    },
                };
                if !kept.iter().any(|k| k.as_str() == Some(said)) {
                    kept.push(Value::from(said));
                    if exact {
                        quotes.verbatim += 1;
                    } else {
                        quotes.aligned += 1;
                    }
                }
            }
            quotes.given += given.len();
            *given = kept;
        }
        let no_evidence = c
            .get("evidence")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty);
        let status = c.get("status").and_then(Value::as_str).unwrap_or_default();
        let status = match status {
            "identified" if no_evidence => "partial",
            "partial" if no_evidence => "not_found",
            other => other,
        }
        .to_owned();
        if status == "not_found" {
            c.insert("summary".into(), Value::from(""));
            c.insert("evidence".into(), Value::Array(Vec::new()));
        }
        c.insert("status".into(), Value::from(status));
        if let Some(conf) = c.get("confidence").and_then(Value::as_f64) {
            c.insert(
                "confidence".into(),
                Value::from((conf.clamp(0.0, 1.0) * 100.0).round() / 100.0),
            );
        }
    }
    quotes
}

/// Sets each field's confidence to the probability the model gave its status, when the model
/// reported one per field (`odds`: for each field in the record's order, the probabilities of
/// [`STATUSES`] where it wrote the status). A model's own "confidence" number copies what its
/// examples show (0.9 identified, 0.6 partial); this one says how sure it was. A field whose
/// status the evidence checks stepped down (quotes not said, or about something else) gets the
/// probability of the status it ended with.
/// Left as it is when the counts differ (an upstream model, a status written otherwise). A
/// field that has no confidence then (one the model was not asked to write,
/// [`Confidence::Weighed`], and whose status was not weighed) gets 0: nothing says how sure
/// the model was of it.
fn weigh_statuses(record: &mut Value, odds: &[Vec<f32>]) {
    let Some(fields) = record.as_object_mut() else {
        return;
    };
    let fits = odds.len() == fields.len() && odds.iter().all(|p| p.len() == STATUSES.len());
    for (i, field) in fields.values_mut().enumerate() {
        let Some(f) = field.as_object_mut() else {
            continue;
        };
        let status = f.get("status").and_then(Value::as_str).unwrap_or_default();
        let weighed = STATUSES
            .iter()
            .position(|s| *s == status)
            .filter(|_| fits)
            .map(|at| (f64::from(odds[i][at]).clamp(0.0, 1.0) * 100.0).round() / 100.0);
        match weighed {
            Some(sure) => {
                f.insert("confidence".into(), Value::from(sure));
            }
            None if !f.contains_key("confidence") => {
                tracing::warn!(status, "a field's status was not weighed: confidence 0");
                f.insert("confidence".into(), Value::from(0.0));
            }
            None => {}
        }
    }
}

/// The intent profile of the language model, as the engine's [`IntentClassifier`].
pub struct LlmIntent {
    provider: Arc<dyn Provider>,
}

impl LlmIntent {
    /// Classifies with `provider`.
    pub fn new(provider: Arc<dyn Provider>) -> Self {
        Self { provider }
    }
}

impl IntentClassifier for LlmIntent {
    fn classify(&self, transcript: String) -> IntentFuture {
        let provider = self.provider.clone();
        Box::pin(async move {
            analyse(
                provider.as_ref(),
                ProfileKind::Intent,
                LIVE_LAYOUT,
                &transcript,
                None,
            )
            .await
            .map(|(value, _usage)| value)
            .map_err(|e| e.to_string())
        })
    }

    /// The call's intent prompt so far, for the model to evaluate while it is idle: the next
    /// `classify` of this call then evaluates only what was said since.
    fn prefill(&self, transcript: String) {
        self.provider.prefill(messages(
            ProfileKind::Intent,
            LIVE_LAYOUT,
            Confidence::of(self.provider.as_ref()),
            &transcript,
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model that must not be asked.
    struct Untouchable;

    #[async_trait::async_trait]
    impl Provider for Untouchable {
        async fn generate(
            &self,
            _: Generation,
            _: super::super::Deltas,
        ) -> Result<super::super::Completion, LlmError> {
            Err(LlmError::Engine("the model was asked".into()))
        }

        fn name(&self) -> &str {
            "untouchable"
        }
    }

    /// An answer's text and the odds taken in it.
    type Answer = (&'static str, Vec<Vec<f32>>);

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
            _: super::super::Deltas,
        ) -> Result<super::super::Completion, LlmError> {
            self.asked.lock().push(generation);
            let (text, odds) = self.answers.lock().pop().expect("asked once too often");
            Ok(super::super::Completion {
                text: text.to_owned(),
                tool_calls: Vec::new(),
                usage: Usage {
                    prompt_tokens: 100,
                    completion_tokens: 10,
                    total_tokens: 110,
                },
                finish: super::super::FinishReason::Stop,
                odds,
            })
        }

        fn name(&self) -> &str {
            "scripted"
        }
    }

    /// Odds at the first intent: `given` label by label, none for the rest.
    fn first_intent(given: &[(&str, f32)]) -> Vec<Vec<f32>> {
        let labels = intent_labels();
        let mut first = vec![0.0; labels.len()];
        for (label, p) in given {
            first[labels.iter().position(|l| l == label).unwrap()] = *p;
        }
        vec![first]
    }

    const OTHER: &str =
        r#"{"intents":[{"intent":"other","confidence":"low"}],"reasoning":"unclear"}"#;
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
        let mut weighed = record.clone();
        weigh_intents(&mut weighed, &odds);
        let levels: Vec<&Value> = (0..3)
            .map(|i| &weighed["intents"][i]["confidence"])
            .collect();
        assert_eq!(levels, ["low", "medium", "high"]);
        assert_eq!(weighed["reasoning"], "a fee");
        // Odds that do not fit the record leave it as it is.
        for unfit in [
            &odds[..2],
            &[vec![0.5; 3], vec![0.5; 3], vec![0.5; 3]][..],
            &[],
        ] {
            let mut same = record.clone();
            weigh_intents(&mut same, unfit);
            assert_eq!(same, record);
        }
    }

    #[tokio::test]
    async fn a_transcript_without_speech_gets_the_fixed_record_without_the_model() {
        for transcript in ["", "\n", "Customer: \nAgent:  \n"] {
            for kind in [ProfileKind::Intent, ProfileKind::Bant, ProfileKind::NeatP] {
                let (record, usage) = analyse(&Untouchable, kind, Layout::Shared, transcript, None)
                    .await
                    .unwrap();
                assert_eq!(record, no_speech_record(kind));
                assert_eq!(usage, Usage::default());
            }
        }
        let intent = no_speech_record(ProfileKind::Intent);
        assert_eq!(intent["intents"][0]["intent"], "other");
        assert_eq!(intent["intents"][0]["confidence"], "low");
        let bant = no_speech_record(ProfileKind::Bant);
        let fields: Vec<&String> = bant.as_object().unwrap().keys().collect();
        assert_eq!(fields, ["budget", "authority", "need", "timeline"]);
        assert!(bant
            .as_object()
            .unwrap()
            .values()
            .all(|f| f["status"] == "not_found" && f["evidence"] == serde_json::json!([])));
        assert_eq!(
            no_speech_record(ProfileKind::NeatP)
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
                let errors = schema_errors(&p.schema, &example.answer, &format!("{kind:?}[{i}]"));
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
        let shown: std::collections::HashSet<&str> = profile(ProfileKind::Intent)
            .examples
            .iter()
            .flat_map(|e| e.answer["intents"].as_array().unwrap())
            .filter_map(|i| i["intent"].as_str())
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
        let bant =
            &prompts[0][2 * profile_for(ProfileKind::Intent, confidence).examples.len() + 1..];
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
                assert!(!g.answer.to_string().contains("confidence"));
                let mut stripped = w.answer.clone();
                for field in stripped.as_object_mut().unwrap().values_mut() {
                    field.as_object_mut().unwrap().remove("confidence");
                }
                assert_eq!(g.answer, stripped);
                let errors = schema_errors(&weighed.schema, &g.answer, &format!("{kind:?}"));
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
        let transcript =
            "Customer: We have about fifty thousand dollars set aside.\nAgent: Great.\n\
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
        let quotes = verify_evidence(&mut record, transcript, None);
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
        let transcript =
            "Agent: Our plan costs five hundred a month and we can install next week.\n\
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
        let quotes = verify_evidence(&mut checked, transcript, Some("agent"));
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
            verify_evidence(&mut all, transcript, None),
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
        let quotes = verify_evidence(&mut record, transcript, Some("Agent"));
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
        verify_evidence(&mut record, transcript, Some("Agent"));
        assert_eq!(record["need"]["status"], "partial");
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
        let shown = profile(ProfileKind::NeatP).examples[0].answer["timeline"]["summary"]
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
        let record = serde_json::json!({
            // A BANT record carrying NEAT-P's words, in other case and punctuation.
            "budget": {"status": "partial", "summary": shown.to_uppercase().replace(',', ";")},
            "authority": {"status": "partial", "summary": framed},
            "need": {"status": "identified", "summary": own},
            "timeline": {"status": "identified", "summary": "Before April."},
            "priority": {"status": "not_found", "summary": ""},
        });
        assert_eq!(
            summarised_as_an_example(&record),
            [true, true, false, false, false]
        );
        assert!(summarised_as_an_example(&Value::Null).is_empty());
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
        assert_eq!(
            pushed_past_not_found(&odds),
            [true, false, false, true, false]
        );
        assert!(pushed_past_not_found(&[]).is_empty());
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
        verify_evidence(&mut record, transcript, None);
        let odds = [
            vec![0.7, 0.2, 0.1],
            vec![0.5, 0.3, 0.2],
            vec![0.004, 0.001, 0.995],
        ];
        let mut weighed = record.clone();
        weigh_statuses(&mut weighed, &odds);
        assert_eq!(weighed["budget"]["confidence"], 0.7);
        // Stepped down for want of evidence: as sure as the model was of partial.
        assert_eq!(weighed["timeline"]["status"], "partial");
        assert_eq!(weighed["timeline"]["confidence"], 0.3);
        assert_eq!(weighed["need"]["confidence"], 1.0);
        // Odds that do not fit the record leave it as it is.
        for unfit in [&odds[..2], &[vec![0.5, 0.5], vec![1.0], vec![1.0]][..]] {
            let mut same = record.clone();
            weigh_statuses(&mut same, unfit);
            assert_eq!(same, record);
        }
        // A record written without confidence (the model was not asked for it) gets the
        // odds', and 0 where there are none to weigh.
        let mut unasked = record.clone();
        for field in unasked.as_object_mut().unwrap().values_mut() {
            field.as_object_mut().unwrap().remove("confidence");
        }
        let mut weighed = unasked.clone();
        weigh_statuses(&mut weighed, &odds);
        assert_eq!(weighed["budget"]["confidence"], 0.7);
        assert_eq!(weighed["timeline"]["confidence"], 0.3);
        weigh_statuses(&mut unasked, &odds[..2]);
        for field in unasked.as_object().unwrap().values() {
            assert_eq!(field["confidence"], 0.0);
        }
    }
}
