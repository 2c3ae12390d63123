//! A second look at the evidence of each BANT and NEAT-P finding. Reading a whole call, a
//! small model reports fields nobody spoke of, resting them on a quote about something else:
//! the buyer's budget given as the economic impact, a deadline as the priority. So each quote
//! it gives is put to it again alone, without the rest of the call, to be sorted by topic
//! (budget, decision, problem, timing, cost, ranking, other), and the model tells how likely
//! each topic is. A quote unlikely to be about its field's topic is dropped, and so is one
//! only somewhat likely to be about it that is clearly about its twin (a budget for a cost, a
//! deadline for a ranking, and the other way round). When none of a
//! field's quotes is about it, the model often still named the right thing in its summary
//! and only picked the wrong sentence: the buyer's sentences that share the most words with
//! the summary (then with the topic's definition) are sorted in turn, and the first on the
//! field's topic becomes its evidence.
//! A need the model did not doubt that is still without a quote then gets the buyer's
//! sentence clearly about a problem, if one is: every sales call has a need, and on garbled
//! speech the summary no longer shares words with it.
//! A quote kept takes the place of a summary that claims figures it does not name, or that
//! speaks of another sentence. A field left without quotes is `not_found`. A sentence tried
//! in place of a weak quote is also sorted clause by clause (one sentence often says two
//! things: who decides and how much they may spend), so that it can back either; whether a
//! field is kept at all rests on whole sentences, but for who decides: a buyer says who they
//! are at work in a clause that opens a sentence about something else, and that clause alone
//! keeps the authority.
//!
//! A sentence quoted for several fields stays with the one it backs best (see `shared`), and
//! a sentence another field quotes takes no weak quote's place.
//!
//! Last, where a field's definition is a figure, its status follows its kept quotes: a
//! budget without an amount is partial, a timeline that names a date identified.
//!
//! The same check lets the analysis ask for more: the model may call a field `not_found` only
//! when it is nearly sure, and a field it reported only for that reason keeps its evidence
//! only when the quote is clearly on its topic.
//!
//! The check's instructions and worked examples are the same for every quote, so the embedded
//! model evaluates them once (they are warmed up with the analyses' own) and each check only
//! its quote.

use std::collections::{HashMap, HashSet};
use std::sync::OnceLock;

use serde_json::Value;

pub use super::checked::Checked;
use super::claims;
use super::clauses::{clauses, CLAUSE_WORDS};
use super::record::{Record, Status};
use super::ProfileKind;

mod figures;
mod shared;
use crate::llm::{Generation, LlmError, Message, Odds, PointOdds, Provider, Role, Sampling, Usage};
pub(super) use figures::settle_stated;
use figures::{hold_to_figures, FIGURE_TOPICS};

/// The topics a quote is sorted into, as the check's instructions define them.
pub const TOPICS: [&str; 7] = [
    "budget", "decision", "problem", "timing", "cost", "ranking", "other",
];

/// Where the model is about to write the topic.
const TOPIC_AT: &str = "\"topic\":\"";
/// Where the topic's odds are taken.
const TOPIC_POINT: &str = "/topic";

/// Most tokens a check answers with (`{"topic":"decision"}` and some room).
const ANSWER_TOKENS: u32 = 16;

/// Least probability of its field's topic at which a quote stays evidence of the field.
const ON_TOPIC: f32 = 0.1;

/// Buyer sentences tried in place of a field's quotes when none of them is on its topic.
const REPAIR_TRIES: usize = 2;

/// Probability of its field's topic below which a kept quote is weak: the buyer's sentences
/// closest to the field's summary are then sorted too, and the first that is clearly on the
/// topic (at least this) takes the quotes' place. Reading a garbled transcript, the model
/// sometimes names the right thing in its summary but quotes a neighbouring sentence: on the
/// transcribed sales calls a deadline given as the authority's quote got 0.12 for "decision",
/// while the sentences that state a field clearly got 0.4 to 0.98.
const CLEAR_ON_TOPIC: f32 = 0.3;

/// [`ON_TOPIC`] for a field in doubt: one the model reported only because it was held back
/// from calling it `not_found` (see `NOT_FOUND_SURE` in the parent module), or one it
/// summarised in the words of a worked example's summary (it copied the example instead of
/// reading the call). Pressed to back a field nobody spoke of, the model quotes whatever is
/// nearest: on the labelled sales calls (written and transcribed) and the long support call,
/// such quotes got at most 0.13 for their field's topic (0.14 from the 0.5B model under a
/// copied summary), while sentences of fields the buyer did speak of got 0.25 or more.
const DOUBTED_ON_TOPIC: f32 = 0.2;

/// The topics a small model mistakes for each other when it writes a record, as (the field's
/// topic, the topic its quote is about instead): the money the buyer has to spend and the
/// money the problem costs them; when the buyer must buy and how the purchase ranks among
/// their other projects. A budget line was the economic impact the model invented most often,
/// on the written and the transcribed calls alike, and a deadline or a ranking stood for the
/// other of the two (docs/benchmarks.md). A budget is also mistaken for a decision, one way
/// only: the limit up to which the buyer signs off purchases ("I sign off on purchases up to
/// 50,000 dollars") stood as the budget, but it says who decides, not what this purchase may
/// cost; a statement of who decides that carries an amount is still the authority's.
const TWINS: [(&str, &str); 5] = [
    ("budget", "cost"),
    ("cost", "budget"),
    ("timing", "ranking"),
    ("ranking", "timing"),
    ("budget", "decision"),
];

/// The topics a quote about topic `at` is mistaken for, by [`TWINS`].
fn twins(at: usize) -> impl Iterator<Item = usize> {
    TWINS
        .iter()
        .filter(move |(of, _)| *of == TOPICS[at])
        .filter_map(|(_, other)| TOPICS.iter().position(|t| t == other))
}

/// Least probability of a topic's twin (likelier than all the others together) at which a
/// quote below [`CLEAR_ON_TOPIC`] for its field's topic is taken to be about the twin, and is
/// no evidence of the field (unless a clause of it is clearly on the field's topic).
/// Transcribed, "Yes, we have around 8,000 pounds for hardware, and the first year of
/// service." got 0.53 for budget and 0.10 for cost, and stood as an economic impact nobody
/// spoke of. Only twins count: on garbled speech, the buyer's own statement of who decides
/// ("I'm the Operations Director and I'm his big firm and I kind of purchase enough to fifty
/// thousand dollars my health.") got 0.11 for decision under a likelier problem (0.52), and
/// is right.
const ELSEWHERE: f32 = 0.5;

/// [`REPAIR_TRIES`] for a field in doubt: each sort costs about as much as a short analysis
/// step, and such fields are many on a call that is not a sale.
const DOUBTED_REPAIR_TRIES: usize = 1;

/// The topics a field keeps or takes a sentence for by its likeliest clause, not only by the
/// whole sentence (see [`Sorter::on_topic`]). Who the buyer is at work and who decides is said
/// in a clause that opens a sentence about something else, and sorted whole the rest of the
/// sentence pulls it away, the more so when the speech engine garbled it: on the espeak-ng
/// transcripts of the labelled sales calls "Hello, I'm the righty lead, and it's only one food
/// that I'm on top where there." got 0.18 for "decision" and its first clause 0.23; "The office
/// manager asks me, the side monitor whip went well, together with the senior partners, we
/// decided jointly." 0.19, its first clause 0.31 and its last 0.92.
const BY_CLAUSE: [&str; 1] = ["decision"];

/// Fewest words a sentence must share with a field's summary to be tried as its evidence.
const MIN_SHARED: usize = 1;

/// Fewest words a sentence must share with a field's summary to replace quotes that share
/// none with it.
const SUMMARISED: usize = 3;

/// Words too common to tell what a sentence is about.
const COMMON: [&str; 40] = [
    "the", "and", "for", "are", "but", "not", "you", "our", "was", "has", "its", "can", "any",
    "all", "this", "that", "with", "have", "they", "them", "their", "there", "what", "when",
    "which", "would", "about", "from", "will", "been", "were", "your", "into", "than", "then",
    "also", "just", "some", "customer", "buyer",
];

/// The words of `s` that say what it is about: no common words, plurals as singulars.
fn content_words(s: &str) -> HashSet<String> {
    super::words(s)
        .into_iter()
        .filter_map(|(_, _, w)| {
            let stem = match w.strip_suffix('s') {
                Some(stem) if stem.len() >= 3 => stem,
                _ => &w,
            };
            let common = |w: &str| w.len() < 3 || COMMON.contains(&w);
            (!common(&w) && !common(stem)).then(|| stem.to_owned())
        })
        .collect()
}

/// The definition of `topic` in the check's instructions (the words after `- topic: `).
fn definition(topic: &str) -> &'static str {
    let line = format!("- {topic}: ");
    include_str!("check.md")
        .lines()
        .find_map(|l| l.strip_prefix(line.as_str()))
        .unwrap_or_default()
}

/// Of `sentences`, those sharing at least [`MIN_SHARED`] words with `summary` or with the
/// definition of the field's `topic`, ranked by the words shared with the summary, then with
/// the definition (the earlier of equals first). The summary tells which thing the model
/// meant; when it says nothing of its own ("The customer is the economic buyer."), the
/// topic's words still find the sentence that speaks of it ("I make all the purchasing
/// decisions myself.").
fn closest<'a>(summary: &str, topic: &str, sentences: &'a [String]) -> Vec<&'a str> {
    let wanted = content_words(summary);
    let defined = content_words(definition(topic));
    let mut scored: Vec<(usize, usize, usize, &str)> = sentences
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let own = content_words(s);
            (
                own.intersection(&wanted).count(),
                own.intersection(&defined).count(),
                i,
                s.as_str(),
            )
        })
        .filter(|&(by_summary, by_topic, _, _)| by_summary.max(by_topic) >= MIN_SHARED)
        .collect();
    scored.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
    scored.into_iter().map(|(.., s)| s).collect()
}

/// The position in [`TOPICS`] of the [`topic`] of a field.
fn topic_at(kind: ProfileKind, field: &str) -> Option<usize> {
    topic(kind, field).and_then(|t| TOPICS.iter().position(|x| *x == t))
}

/// The topic of `field` of a `kind` record.
fn topic(kind: ProfileKind, field: &str) -> Option<&'static str> {
    Some(match (kind, field) {
        (ProfileKind::Bant, "budget") => "budget",
        (ProfileKind::Bant, "authority") | (ProfileKind::NeatP, "access_to_authority") => {
            "decision"
        }
        (_, "need") => "problem",
        (_, "timeline") => "timing",
        (ProfileKind::NeatP, "economic_impact") => "cost",
        (ProfileKind::NeatP, "priority") => "ranking",
        _ => return None,
    })
}

/// A worked example of the check.
#[derive(serde::Deserialize)]
struct Example {
    said: String,
    topic: String,
}

/// The check's answer.
#[derive(serde::Serialize, serde::Deserialize)]
struct Sorted {
    topic: String,
}

fn answer(topic: &str) -> String {
    serde_json::to_string(&Sorted {
        topic: topic.to_owned(),
    })
    .unwrap_or_default()
}

/// The check's conversation up to the quote: its instructions, then the worked examples as
/// earlier turns. The same for every check.
pub(super) fn instructions() -> Vec<Message> {
    static MESSAGES: OnceLock<Vec<Message>> = OnceLock::new();
    MESSAGES
        .get_or_init(|| {
            conversation(
                include_str!("check.md"),
                include_str!("check.examples.json"),
            )
            .expect("the check's examples are valid JSON (checked by a test)")
        })
        .clone()
}

/// A check's conversation up to the quote from `instructions` (the system message, as
/// `check.md`) and `examples` (a JSON list of `{"said": ..., "topic": ...}`, as
/// `check.examples.json`): `bench topics` tries other wordings with it.
pub fn conversation(instructions: &str, examples: &str) -> Result<Vec<Message>, serde_json::Error> {
    let examples: Vec<Example> = serde_json::from_str(examples)?;
    let mut messages = vec![Message::new(Role::System, instructions)];
    for e in examples {
        messages.push(Message::new(Role::User, e.said));
        messages.push(Message::new(Role::Assistant, answer(&e.topic)));
    }
    Ok(messages)
}

/// The topic a BANT or NEAT-P field's quotes must be about (`need`: "problem").
pub fn field_topic(field: &str) -> Option<&'static str> {
    topic(ProfileKind::Bant, field).or_else(|| topic(ProfileKind::NeatP, field))
}

fn schema() -> Value {
    serde_json::json!({
        "type": "object",
        "properties": {"topic": {"type": "string", "enum": TOPICS}},
        "required": ["topic"],
        "additionalProperties": false,
    })
}

/// How likely each of [`TOPICS`] is as the topic of `quote`: the model's odds, or, from a
/// model that does not tell them, certainty of the topic it answered.
async fn sort(provider: &dyn Provider, quote: &str) -> Result<(Vec<f32>, Usage), LlmError> {
    sort_after(provider, instructions(), quote).await
}

/// [`sort`] after another check's `conversation` (see [`conversation`]).
pub async fn sort_after(
    provider: &dyn Provider,
    mut messages: Vec<Message>,
    quote: &str,
) -> Result<(Vec<f32>, Usage), LlmError> {
    messages.push(Message::new(Role::User, quote));
    let completion = provider
        .generate(
            Generation {
                messages,
                tools: Vec::new(),
                sampling: Sampling {
                    max_tokens: ANSWER_TOKENS,
                    temperature: 0.0,
                    ..Sampling::default()
                },
                json_schema: Some(schema()),
                response_format: None,
                tenant: None,
                class: crate::llm::fair::Class::default(),
                odds: Some(Odds {
                    after: TOPIC_AT.to_owned(),
                    words: TOPICS.iter().map(|s| s.to_string()).collect(),
                    floor: None,
                    // The topic is read from the odds: nothing after them is needed.
                    only: true,
                }),
            },
            None,
        )
        .await?;
    let odds = match PointOdds::find(&completion.odds, TOPIC_POINT, TOPICS.len()) {
        Some(p) => p.to_vec(),
        None => {
            let said = serde_json::from_str::<Sorted>(completion.text.trim()).ok();
            match said.and_then(|a| TOPICS.iter().position(|s| *s == a.topic)) {
                Some(at) => (0..TOPICS.len()).map(|i| f32::from(i == at)).collect(),
                // No answer to go by: the quote stays.
                None => vec![1.0; TOPICS.len()],
            }
        }
    };
    Ok((odds, completion.usage))
}

/// Checks the evidence of every field of `record` (a BANT or NEAT-P record of `transcript`
/// whose quotes were verified) that is not `not_found`: a quote unlikely to be about the
/// field's topic is dropped; a field left without one gets the first of the buyer's sentences
/// (anyone's but the `seller`'s) closest to its summary (see [`closest`]) that is on its
/// topic, or becomes `not_found` (one of the figure topics whose summary claims a figure is
/// left to [`hold_to_figures`]). A field named in `doubted` is in doubt: the model reported
/// it only because it was held back from calling it `not_found`, or summarised it in the words
/// of a worked example's summary. It is held to [`DOUBTED_ON_TOPIC`] and tries
/// [`DOUBTED_REPAIR_TRIES`] sentences. A field whose quotes are all weak (below
/// [`CLEAR_ON_TOPIC`]) tries as many of the sentences closest to its summary, and the first
/// clearly on its topic replaces them. Returns what was done.
pub(super) async fn check_findings(
    provider: &dyn Provider,
    kind: ProfileKind,
    record: &mut Record,
    transcript: &str,
    seller: Option<&str>,
    doubted: &[&str],
) -> Result<(Checked, Vec<(&'static str, f32)>), LlmError> {
    let mut sorter = Sorter {
        provider,
        sorted: HashMap::new(),
        checked: Checked::default(),
    };
    let mut buyer: Option<Vec<String>> = None;
    // Quotes dropped from a field, with the field: they may back another.
    let mut displaced: Vec<(&'static str, String)> = Vec::new();
    // The quotes the model gave each field: a sentence another field quotes takes no weak
    // quote's place.
    let quoted: HashMap<&'static str, Vec<String>> = record
        .criteria()
        .into_iter()
        .map(|(name, f)| (name, f.evidence.clone()))
        .collect();
    // Each field's summary as the model wrote it (see `shared`).
    let summaries: Vec<(&'static str, String)> = record
        .criteria()
        .into_iter()
        .map(|(name, f)| (name, f.summary.clone()))
        .collect();
    for (name, field) in record.criteria_mut() {
        let status = field.status.as_str();
        if field.status == Status::NotFound {
            continue;
        }
        let Some(wanted) = topic(kind, name) else {
            continue;
        };
        let in_doubt = doubted.contains(&name);
        let (least, tries) = if in_doubt {
            sorter.checked.doubted += 1;
            (DOUBTED_ON_TOPIC, DOUBTED_REPAIR_TRIES)
        } else {
            (ON_TOPIC, REPAIR_TRIES)
        };
        let at = TOPICS
            .iter()
            .position(|t| *t == wanted)
            .expect("a known topic");
        let given = std::mem::take(&mut field.evidence);
        let mut kept = Vec::new();
        // The kept quotes' best probability of the field's topic.
        let mut best = 0.0f32;
        let by_clause = BY_CLAUSE.contains(&wanted);
        for quote in &given {
            let p = sorter.topic_odds(quote, at, by_clause).await?;
            let elsewhere = p >= least && sorter.about_the_twin(quote, at).await?;
            tracing::debug!(?kind, field = %name, %status, quote, p, in_doubt, elsewhere, "evidence sorted");
            if p >= least && !elsewhere {
                kept.push(quote.clone());
                best = best.max(p);
            } else {
                sorter.checked.dropped += 1;
                displaced.push((name, quote.clone()));
            }
        }
        let summary = field.summary.as_str();
        let buyer = buyer.get_or_insert_with(|| super::quotable(transcript, seller).0);
        // Quotes that share no word with the summary, which speaks of another sentence: "Holiday
        // requests are still on paper forms." over "My boss asked me to collect a few options".
        let summarised = content_words(summary);
        let shared = |s: &str| content_words(s).intersection(&summarised).count();
        let unrelated = !kept.is_empty()
            && kept.iter().all(|q| shared(q) == 0)
            && buyer
                .iter()
                .any(|s| !given.contains(s) && shared(s) >= SUMMARISED);
        let elsewhere = || quoted.iter().filter(move |(n, _)| **n != name);
        let quoted_elsewhere = |s: &str| elsewhere().any(|(_, q)| q.iter().any(|q| q == s));
        let mut replaced = false;
        if kept.is_empty() || best < CLEAR_ON_TOPIC || unrelated {
            // No quote, only weak ones, or ones the summary does not speak of: a sentence the
            // summary speaks of, if on the topic (clearly so in place of a quote, and no less
            // than the quotes it replaces).
            let needed = if kept.is_empty() {
                least
            } else {
                CLEAR_ON_TOPIC.max(best)
            };
            // A weak quote the summary speaks of gives way to a sentence it speaks of less only
            // when that one is likelier on the topic than off it: the model summarised what it
            // quoted, and only the sort doubts it. Dropped quotes give way only to a sentence
            // the summary speaks of as much: a summary of an off-topic quote ("The office
            // manager decides on equipment.") is off the topic with it. But for a need the
            // model did not doubt: every sale has one, and its summary often joins the problem
            // to the deadline quoted ("Training needs to be ready for the graduate intake in
            // September.").
            let repairing = kept.is_empty();
            let held = repairing && (wanted != "problem" || in_doubt);
            let spoken_of = if repairing { &given } else { &kept }
                .iter()
                .map(|q| shared(q))
                .max()
                .unwrap_or(0);
            let tries = closest(summary, wanted, buyer)
                .into_iter()
                .filter(|s| !given.iter().any(|g| g == s))
                .filter(|s| kept.is_empty() || !quoted_elsewhere(s))
                .filter(|s| !unrelated || shared(s) >= SUMMARISED)
                .filter(|s| !held || shared(s) >= spoken_of)
                .take(tries);
            for quote in tries {
                // Whether the field is kept rests on whole sentences (but for the
                // `BY_CLAUSE` topics); which sentence backs a kept one may rest on a clause.
                let (p, elsewhere) = if kept.is_empty() {
                    sorter.in_place(quote, at, needed).await?
                } else {
                    (sorter.on_topic(quote, at).await?, false)
                };
                let needed = if !repairing && shared(quote) < spoken_of {
                    needed.max(MOVED_ON_TOPIC)
                } else {
                    needed
                };
                tracing::debug!(?kind, field = %name, %status, quote, p, in_doubt, elsewhere, "sentence closest to the summary sorted");
                if p >= needed && !elsewhere {
                    if kept.is_empty() {
                        sorter.checked.repaired += 1;
                    } else {
                        sorter.checked.replaced += 1;
                    }
                    kept = vec![quote.to_owned()];
                    replaced = true;
                    break;
                }
            }
        }
        // A need left without a quote, or with only weak ones, takes the buyer's sentence
        // clearly about a problem.
        let weak = !kept.is_empty() && !replaced && best < CLEAR_ON_TOPIC;
        let mut found_need = false;
        if (kept.is_empty() || weak) && wanted == "problem" && !in_doubt {
            // A weak need keeps its own quote before one another field has.
            let mut passed = given.clone();
            if weak {
                passed.extend(elsewhere().flat_map(|(_, q)| q.iter().cloned()));
            }
            if let Some(quote) = stated_need(&mut sorter, buyer, &passed, at).await? {
                tracing::debug!(?kind, field = %name, %status, quote, summary = %field.summary, "a need found among the buyer's sentences");
                if shared(&quote) == 0 {
                    field.summary = summary_of(&quote);
                }
                sorter.checked.needs_found += 1;
                kept = vec![quote];
                found_need = true;
            }
        }
        // Kept quotes on the topic that the summary does not speak of, while it speaks of a
        // sentence off the topic: the summary is of the wrong sentence, and the quote says
        // what the field is ("The owner has given me 1,500 pounds for booking software." over
        // "Patients phone to book and we can't answer them all").
        if unrelated && !replaced && !found_need && !FIGURE_TOPICS.contains(&wanted) {
            tracing::debug!(?kind, field = %name, %status, summary = %field.summary, quote = %kept[0], "a summary of another sentence restated from the quote");
            field.summary = summary_of(&kept[0]);
            sorter.checked.resummarised += 1;
        }
        // A field whose topic is a figure and whose summary claims one is left to
        // `hold_to_figures`, which tries the buyer's sentences that name it.
        let figured =
            FIGURE_TOPICS.contains(&wanted) && !claims::claimed(&field.summary).is_empty();
        if kept.is_empty() && !figured {
            field.status = Status::NotFound;
            field.summary.clear();
            sorter.checked.cleared += 1;
        } else if in_doubt && !kept.is_empty() {
            sorter.checked.doubted_kept += 1;
        }
        // A summary says no more than its quotes: one claiming a figure they do not name is
        // restated from them ("The bank needs to hire staff for a contract of 45,000 dollars"
        // over the buyer's statement of who decides). The figure topics' summaries are held
        // to their figures by `hold_to_figures`.
        if !kept.is_empty()
            && !FIGURE_TOPICS.contains(&wanted)
            && !claims::bears_out(&field.summary, &kept)
        {
            tracing::debug!(?kind, field = %name, %status, summary = %field.summary, quote = %kept[0], "a summary claiming figures its quotes do not name restated from them");
            field.summary = summary_of(&kept[0]);
            sorter.checked.resummarised += 1;
        }
        field.evidence = kept;
    }
    let buyer = buyer.get_or_insert_with(|| super::quotable(transcript, seller).0);
    hold_to_figures(&mut sorter, kind, record, buyer, &quoted, &mut displaced).await?;
    let call = shared::Call {
        kind,
        buyer,
        doubted,
        summaries: &summaries,
    };
    shared::share_out(&mut sorter, record, &call).await?;
    let moved = move_displaced(&mut sorter, kind, record, displaced).await?;
    Ok((sorter.checked, moved))
}

/// Buyer sentences sorted, besides those the check sorted already, to find a need (see
/// [`stated_need`]).
const NEED_TRIES: usize = 3;

/// The buyer's sentence that states the need, for a need the model did not doubt whose quotes
/// and the sentences closest to its summary were all off the topic (topic `at`, "problem"):
/// of the buyer's sentences not `given` (the field's quotes; for a weak need, every field's),
/// of [`CLAUSE_WORDS`] words or more when not sorted yet, the one [`clearly_about`] a problem,
/// trying [`NEED_TRIES`]. Every sales call has a need, and on garbled speech the model, sure of
/// one, summarises it in words the sentence no longer has and quotes the line next to it:
/// "We'd like to go live before the holiday even starts in November." for "Our agents answer
/// the same emails again and again".
async fn stated_need(
    sorter: &mut Sorter<'_>,
    buyer: &[String],
    given: &[String],
    at: usize,
) -> Result<Option<String>, LlmError> {
    let candidates: Vec<&String> = buyer
        .iter()
        .filter(|s| !given.contains(s))
        .filter(|s| {
            sorter.sorted.contains_key(s.as_str()) || s.split_whitespace().count() >= CLAUSE_WORDS
        })
        .collect();
    clearly_about(sorter, &candidates, at, NEED_TRIES).await
}

/// Of `candidates` (buyer sentences, in the order said), one likelier about topic `at` than
/// about every other topic together ([`MOVED_ON_TOPIC`]), for a field the model did not point
/// at it for: of those the check sorted already, the likeliest; else the first of `tries` more
/// that is.
async fn clearly_about(
    sorter: &mut Sorter<'_>,
    candidates: &[&String],
    at: usize,
    tries: usize,
) -> Result<Option<String>, LlmError> {
    // A sort the model gave no answer to keeps a quote (every topic at 1, see [`sort`]); it
    // is about nothing here.
    let about = |odds: &[f32]| {
        let answered = odds.iter().sum::<f32>() <= 1.5;
        if answered {
            odds[at]
        } else {
            0.0
        }
    };
    let sorted = candidates
        .iter()
        .filter_map(|s| sorter.sorted.get(s.as_str()).map(|odds| (about(odds), *s)))
        .filter(|(p, _)| *p >= MOVED_ON_TOPIC)
        .max_by(|a, b| a.0.total_cmp(&b.0));
    if let Some((_, sentence)) = sorted {
        return Ok(Some(sentence.clone()));
    }
    let unsorted: Vec<&String> = candidates
        .iter()
        .filter(|s| !sorter.sorted.contains_key(s.as_str()))
        .take(tries)
        .copied()
        .collect();
    for sentence in unsorted {
        if about(sorter.odds(sentence).await?) >= MOVED_ON_TOPIC {
            return Ok(Some(sentence.clone()));
        }
    }
    Ok(None)
}

/// Least probability of a field's topic, for the whole sentence, at which a quote dropped from
/// another field backs a field the record left `not_found`: likelier than every other topic
/// together.
const MOVED_ON_TOPIC: f32 = 0.5;

/// Gives each quote dropped from a field (`displaced`) to the first field of the record that
/// is `not_found` and whose topic the quote, sorted whole, is clearly about
/// ([`MOVED_ON_TOPIC`]): the buyer's "I sign off purchases up to 50,000 dollars myself", quoted
/// for the budget, is the authority's evidence. That field is reported with the quote as its
/// evidence and its summary. Returns the fields so backed, each with the quote's probability
/// of its topic (the caller settles their status and confidence).
async fn move_displaced(
    sorter: &mut Sorter<'_>,
    kind: ProfileKind,
    record: &mut Record,
    displaced: Vec<(&'static str, String)>,
) -> Result<Vec<(&'static str, f32)>, LlmError> {
    let mut moved = Vec::new();
    for (from, quote) in displaced {
        for (name, field) in record.criteria_mut() {
            if name == from || field.status != Status::NotFound {
                continue;
            }
            let Some(at) = topic_at(kind, name) else {
                continue;
            };
            let p = sorter.odds(&quote).await?[at];
            if p >= MOVED_ON_TOPIC {
                tracing::debug!(?kind, from, to = %name, quote, p, "a dropped quote moved to the field it is about");
                field.status = Status::Identified;
                field.summary = summary_of(&quote);
                field.evidence = vec![quote];
                sorter.checked.moved += 1;
                moved.push((name, p));
                break;
            }
        }
    }
    Ok(moved)
}

/// The summary of a field backed by a moved quote: the quote, cut to a summary's length at a
/// word.
fn summary_of(quote: &str) -> String {
    let most = super::record::SUMMARY_CHARS;
    if quote.chars().count() <= most {
        return quote.to_owned();
    }
    let cut: String = quote.chars().take(most - 3).collect();
    let at = cut.rfind(' ').unwrap_or(cut.len());
    format!("{}...", cut[..at].trim_end())
}

/// Sorts quotes by topic, each once, counting what it does.
struct Sorter<'a> {
    provider: &'a dyn Provider,
    sorted: HashMap<String, Vec<f32>>,
    checked: Checked,
}

impl Sorter<'_> {
    /// How likely each of [`TOPICS`] is as the topic of `quote` (see [`sort`]).
    async fn odds(&mut self, quote: &str) -> Result<&[f32], LlmError> {
        if !self.sorted.contains_key(quote) {
            let (odds, spent) = sort(self.provider, quote).await?;
            tracing::trace!(quote, odds = ?TOPICS.iter().zip(&odds).collect::<Vec<_>>(), "quote sorted");
            self.checked.usage += spent;
            self.checked.sorted += 1;
            self.sorted.insert(quote.to_owned(), odds);
        }
        Ok(&self.sorted[quote])
    }

    /// How likely `quote` is to be about topic `at`: sorted whole, or `by_clause`, as
    /// [`Sorter::on_topic`] tells.
    async fn topic_odds(
        &mut self,
        quote: &str,
        at: usize,
        by_clause: bool,
    ) -> Result<f32, LlmError> {
        if by_clause {
            self.on_topic(quote, at).await
        } else {
            Ok(self.odds(quote).await?[at])
        }
    }

    /// How likely `quote` is about topic `at` (by [`Sorter::topic_odds`]) as the evidence of a
    /// field left without quotes, and, when at least `least`, whether it is about something
    /// else instead: one of the [`twins`] of the topic, or, but for the [`BY_CLAUSE`] topics,
    /// a decision (see [`Sorter::says_who_decides`]).
    async fn in_place(
        &mut self,
        quote: &str,
        at: usize,
        least: f32,
    ) -> Result<(f32, bool), LlmError> {
        let by_clause = BY_CLAUSE.contains(&TOPICS[at]);
        let p = self.topic_odds(quote, at, by_clause).await?;
        let elsewhere = p >= least
            && (self.about_the_twin(quote, at).await?
                || (!by_clause && self.says_who_decides(quote, at).await?));
        Ok((p, elsewhere))
    }

    /// Whether `quote` is about one of the [`twins`] of topic `at` rather than `at`: below
    /// [`CLEAR_ON_TOPIC`] for it, whole and in each of its [`clauses`], while the twin has at
    /// least [`ELSEWHERE`]. "We need it before June, and it's our top priority this year."
    /// leans to a timing whole; its second clause is clearly a ranking, and the sentence stays
    /// the priority's evidence.
    async fn about_the_twin(&mut self, quote: &str, at: usize) -> Result<bool, LlmError> {
        let odds = self.odds(quote).await?;
        if odds[at] >= CLEAR_ON_TOPIC || !twins(at).any(|twin| odds[twin] >= ELSEWHERE) {
            return Ok(false);
        }
        Ok(self.on_topic(quote, at).await? < CLEAR_ON_TOPIC)
    }

    /// Whether `quote`, sorted whole, is likelier about a decision than about topic `at`: a
    /// statement of who decides is the authority's, and backs no other field the model did not
    /// quote it for. On garbled speech such a statement often sounds like a problem ("I run the
    /// marketing team at a hotel, and it's been over 10,000 euros and to be approved by our
    /// managing director." got 0.32 for "problem" under 0.44 for "decision").
    async fn says_who_decides(&mut self, quote: &str, at: usize) -> Result<bool, LlmError> {
        let decision = TOPICS
            .iter()
            .position(|t| *t == "decision")
            .expect("a known topic");
        let odds = self.odds(quote).await?;
        Ok(at != decision && odds[decision] > odds[at])
    }

    /// How likely `quote` is to be about topic `at`: sorted whole, or, when that leaves it
    /// below [`CLEAR_ON_TOPIC`], the best of that and of its [`clauses`], each sorted alone
    /// until one is clearly on the topic.
    async fn on_topic(&mut self, quote: &str, at: usize) -> Result<f32, LlmError> {
        let mut best = self.odds(quote).await?[at];
        if best >= CLEAR_ON_TOPIC {
            return Ok(best);
        }
        for clause in clauses(quote) {
            let p = self.odds(clause).await?[at];
            tracing::debug!(quote, clause, p, "clause sorted");
            if p > best {
                self.checked.by_clause += 1;
                best = p;
            }
            if best >= CLEAR_ON_TOPIC {
                break;
            }
        }
        Ok(best)
    }
}

/// The fields each task's schema has, for the tests.
#[cfg(test)]
fn schema_fields(kind: ProfileKind) -> Vec<String> {
    super::no_speech_record(kind)
        .criteria()
        .into_iter()
        .map(|(name, _)| name.to_owned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::{Completion, Deltas, FinishReason};
    use parking_lot::Mutex;

    #[test]
    fn every_field_has_a_topic_and_the_examples_parse() {
        for kind in [ProfileKind::Bant, ProfileKind::NeatP] {
            let fields = schema_fields(kind);
            assert!(!fields.is_empty());
            for field in &fields {
                assert!(topic(kind, field).is_some(), "{kind:?} {field}");
            }
        }
        let messages = instructions();
        assert!(messages.len() >= 3 && messages.len() % 2 == 1);
        for m in messages.iter().skip(2).step_by(2) {
            let answer: Value = serde_json::from_str(&m.content).unwrap();
            assert!(
                TOPICS.contains(&answer["topic"].as_str().unwrap()),
                "{answer}"
            );
        }
        for t in TOPICS {
            assert!(!definition(t).is_empty(), "{t}");
        }
    }

    #[test]
    fn the_closest_sentences_share_the_most_words_that_say_something() {
        let sentences: Vec<String> = [
            "We would like it in the spring.",
            "Our vans keep getting lost on the way to customers.",
            "The vans are old and the drivers are lost without maps.",
        ]
        .map(str::to_owned)
        .to_vec();
        // "van", "lost" and "driver" are shared; "the", "would", "customers" say nothing.
        assert_eq!(
            closest("The drivers and their van get lost.", "timing", &sentences),
            [sentences[2].as_str(), sentences[1].as_str()]
        );
        assert!(closest("The customers would want that.", "timing", &sentences).is_empty());
    }

    #[test]
    fn a_summary_that_says_nothing_of_its_own_leaves_the_topic_to_find_the_sentence() {
        let sentences: Vec<String> = [
            "Hi Dana, thanks for calling back.",
            "Our paper records cost us two thousand dollars a month.",
            "I own the clinic and I make all the purchasing decisions myself.",
            "My partner signs off on the paper records.",
        ]
        .map(str::to_owned)
        .to_vec();
        assert!(definition("decision").contains("who makes or signs off"));
        // Nothing but "economic" is the summary's own, and no sentence says it: the words of
        // the definition of "decision" ("makes", "decision"; "signs", "off") find the two that
        // speak of one.
        assert_eq!(
            closest(
                "The customer is the economic buyer.",
                "decision",
                &sentences
            ),
            [sentences[2].as_str(), sentences[3].as_str()]
        );
        // The summary's words come first ("paper", "records"), then the topic's.
        assert_eq!(
            closest("Paper records decide it.", "decision", &sentences),
            [
                sentences[3].as_str(),
                sentences[1].as_str(),
                sentences[2].as_str()
            ]
        );
    }

    /// A quote that shares no word with its summary, on a call where another sentence shares
    /// several: the summary speaks of that sentence, which takes the quote's place when it is
    /// clearly on the field's topic; a summary of its own words keeps its quote.
    #[tokio::test]
    async fn a_quote_the_summary_does_not_speak_of_gives_way_to_the_sentence_it_does() {
        const PAPER: &str =
            "Hi, I work in the HR team of a retail company, and our holiday requests are still on paper forms.";
        const BOSS: &str =
            "My boss asked me to collect a few options, but I don't know who will make the final call.";
        let call = format!("Agent: Thanks for calling.\nCustomer: {PAPER}\nCustomer: {BOSS}");
        for (summary, kept) in [
            ("Holiday requests are still on paper forms.", PAPER),
            ("The team wants a better way of working.", BOSS),
        ] {
            let model = Table::new(
                vec![(BOSS, "problem", 0.8), (PAPER, "problem", 0.9)],
                Vec::new(),
            );
            let mut record = serde_json::json!({
                "need": field("identified", summary, &[BOSS]),
            });
            bant(&model, &mut record, &call).await;
            assert_eq!(
                record["need"],
                field("identified", summary, &[kept]),
                "{summary}"
            );
        }
    }

    /// A sentence that states a problem and its cost is sorted as a cost. In place of a weak
    /// quote, its first clause, sorted alone, is the problem, and the need takes the sentence;
    /// as the model's own quote it is dropped all the same, clauses never keeping a need.
    #[tokio::test]
    async fn a_sentence_that_says_two_things_can_back_either_in_place_of_a_weak_quote() {
        const BOTH: &str =
            "Our records take ten hours a week, which costs us 2,000 dollars a month.";
        const WEAK: &str = "It could be better.";
        let call = format!("Agent: Tell me more.\nCustomer: {WEAK}\nCustomer: {BOTH}");
        for own in [WEAK, BOTH] {
            let model = Table::new(
                vec![
                    (WEAK, "problem", 0.15),
                    (BOTH, "cost", 0.9),
                    ("Our records take ten hours a week,", "problem", 0.85),
                    ("which costs us 2,000 dollars a month.", "cost", 0.95),
                ],
                Vec::new(),
            );
            let mut record = serde_json::json!({
                "need": field("identified", "Records take hours.", &[own]),
                "economic_impact": field("not_found", "", &[]),
                "access_to_authority": field("not_found", "", &[]),
                "timeline": field("not_found", "", &[]),
                "priority": field("not_found", "", &[]),
            });
            let checked = neat_p(&model, &mut record, &call, &[]).await;
            let asked = model.asked.into_inner();
            if own == WEAK {
                assert_eq!(
                    record["need"],
                    field("identified", "Records take hours.", &[BOTH])
                );
                // The weak quote, the sentence closest to the summary, then its first clause,
                // which is clearly a problem.
                assert_eq!(asked, [WEAK, BOTH, "Our records take ten hours a week,"]);
                assert_eq!((checked.replaced, checked.by_clause), (1, 1));
            } else {
                // Dropped; the one other sentence shares no word with the summary or with the
                // definition of a problem, and as a need's last resort it is sorted and is not
                // clearly a problem either.
                assert_eq!(record["need"], field("not_found", "", &[]));
                assert_eq!(asked, [BOTH, WEAK]);
                assert_eq!((checked.dropped, checked.by_clause), (1, 0));
            }
        }
    }

    /// Who the buyer is at work, said in a clause that opens a sentence about something else:
    /// sorted whole the sentence is a problem, its first clause (a greeting part of it) is
    /// clearly a decision, and it stays the authority's quote, for a field in doubt too.
    #[tokio::test]
    async fn a_role_said_in_the_first_clause_of_a_sentence_keeps_the_authority() {
        const ROLE: &str = "Hello, I'm the IT lead, and the backups keep failing on us.";
        const OPENING: &str = "Hello, I'm the IT lead,";
        let call = format!("Agent: Tell me more.\nCustomer: {ROLE}");
        for in_doubt in [false, true] {
            let model = Table::new(
                vec![
                    (ROLE, "problem", 0.8),
                    (OPENING, "decision", 0.7),
                    ("and the backups keep failing on us.", "problem", 0.9),
                ],
                vec![(ROLE, "decision", 0.05)],
            );
            let mut record = serde_json::json!({
                "budget": field("not_found", "", &[]),
                "authority": field("identified", "The IT lead.", &[ROLE]),
                "need": field("not_found", "", &[]),
                "timeline": field("not_found", "", &[]),
            });
            let doubted: &[&str] = if in_doubt { &["authority"] } else { &[] };
            let (typed, checked, _) =
                check_given(&model, ProfileKind::Bant, &record, &call, doubted).await;
            record = typed.to_value();
            assert_eq!(
                record["authority"],
                field("identified", "The IT lead.", &[ROLE]),
                "in doubt: {in_doubt}"
            );
            assert_eq!(model.asked.into_inner(), [ROLE, OPENING]);
            assert_eq!(checked.by_clause, 1);
        }
    }

    /// A quote only somewhat about its field's topic and clearly about its twin is no evidence
    /// of the field, nor is such a sentence tried in its place; a sentence whose clause is
    /// clearly on the topic stays, and so do a weak quote about nothing else in particular and
    /// one clearly about a topic that is not the twin.
    #[tokio::test]
    async fn a_quote_clearly_about_the_twin_of_its_topic_backs_no_field_it_is_only_somewhat_about()
    {
        const BUDGET: &str =
            "Yes, we have around 8,000 pounds for hardware, and the first year of service.";
        const SEPARATE: &str = "The hardware budget is separate from service.";
        const AUTH: &str = "I'm the director and I kind of purchase enough to fifty thousand.";
        const LATER: &str = "Sometime after the summer, maybe.";
        const BOTH: &str = "We need it before June, and it's our top priority this year.";
        const RANK: &str = "and it's our top priority this year.";
        let call = format!(
            "Agent: Do you have a budget in mind?\nCustomer: {BUDGET}\nCustomer: {AUTH}\n\
             Customer: {LATER}\nCustomer: {SEPARATE}\nCustomer: {BOTH}"
        );
        let model = Table::new(
            vec![
                (BUDGET, "budget", 0.55),
                (SEPARATE, "budget", 0.7),
                (AUTH, "budget", 0.6),
                (LATER, "timing", 0.2),
                (BOTH, "timing", 0.6),
                (RANK, "ranking", 0.9),
            ],
            vec![
                (BUDGET, "cost", 0.12),
                (SEPARATE, "cost", 0.15),
                (AUTH, "decision", 0.12),
                (BOTH, "ranking", 0.2),
            ],
        );
        let answer = || {
            serde_json::json!({
                "need": field("not_found", "", &[]),
                "economic_impact": field("identified", "Hardware and service for 8,000 pounds.",
                    &[BUDGET]),
                "access_to_authority": field("identified", "The director decides.", &[AUTH]),
                "timeline": field("partial", "After the summer.", &[LATER]),
                "priority": field("identified", "Top priority this year.", &[BOTH]),
            })
        };
        let mut record = answer();
        let checked = neat_p(&model, &mut record, &call, &[]).await;
        // 0.12 for cost would pass alone, but its twin, the budget, is likelier than all else
        // together; and no other sentence speaks of the summary as much (the sentence sharing
        // two of its words is a budget too).
        assert_eq!(record["economic_impact"], field("not_found", "", &[]));
        // A budget is no twin of a decision: the weak quote stays, as it always did.
        assert_eq!(
            record["access_to_authority"],
            answer()["access_to_authority"]
        );
        // Weak, but about nothing else.
        assert_eq!(record["timeline"], answer()["timeline"]);
        // A timing whole, but its second clause is clearly a ranking.
        assert_eq!(record["priority"], answer()["priority"]);
        assert_eq!(
            model.asked.into_inner(),
            [
                BUDGET,
                // Its clauses, sorted alone, are not clearly a cost either.
                "Yes, we have around 8,000 pounds for hardware,",
                "and the first year of service.",
                AUTH,
                LATER,
                BOTH,
                "We need it before June,",
                RANK
            ]
        );
        assert_eq!(
            (
                checked.sorted,
                checked.dropped,
                checked.repaired,
                checked.cleared,
                checked.by_clause
            ),
            (8, 1, 0, 1, 1)
        );
    }

    const SIGN_OFF: &str =
        "I'm the operations director, and I sign off on purchases up to 50,000 dollars.";
    const SET_ASIDE: &str = "We have set aside twenty thousand dollars a year for the tool.";
    const SOME_MONEY: &str = "There is some money put by for it.";
    const BUDGET_SUMMARY: &str = "20,000 dollars a year is set aside for the tool.";

    /// A summary's figures are held to its quotes: a quote about another amount is dropped,
    /// and the buyer's sentence that names the summary's amount takes its place.
    #[tokio::test]
    async fn a_quote_about_another_amount_than_its_summary_gives_way_to_the_sentence_that_names_it()
    {
        let call = format!(
            "Agent: Tell me about your firm.\nCustomer: {SIGN_OFF}\nAgent: And the budget?\n\
             Customer: {SET_ASIDE}"
        );
        // The model takes the sign-off limit for a budget, clearly enough to pass the topic
        // check, and not clearly enough for a decision to move it.
        let model = Table::new(
            vec![(SIGN_OFF, "budget", 0.6), (SET_ASIDE, "budget", 0.9)],
            vec![(SIGN_OFF, "decision", 0.3)],
        );
        let mut record = serde_json::json!({
            "budget": field("identified", BUDGET_SUMMARY, &[SIGN_OFF]),
        });
        let (checked, moved) = bant(&model, &mut record, &call).await;
        assert_eq!(
            record["budget"],
            field("identified", BUDGET_SUMMARY, &[SET_ASIDE])
        );
        assert_eq!(record["authority"]["status"], "not_found");
        assert!(moved.is_empty());
        assert_eq!(
            (
                checked.other_figures,
                checked.figures_found,
                checked.figures_unsaid,
                checked.moved
            ),
            (1, 1, 0, 0)
        );
        assert_eq!(model.asked.into_inner(), [SIGN_OFF, SET_ASIDE]);
    }

    /// A figure nobody said: the field keeps its other evidence, stepped down to partial; left
    /// without any, or only partial to begin with, it is not found.
    #[tokio::test]
    async fn a_summary_whose_amount_the_buyer_never_said_is_no_identified_field() {
        let call = format!("Customer: {SIGN_OFF}\nCustomer: {SOME_MONEY}");
        // The sign-off limit passes for a budget, not clearly enough to be one in place of the
        // summary's amount.
        let model = Table::new(
            vec![(SIGN_OFF, "budget", 0.4), (SOME_MONEY, "budget", 0.8)],
            vec![(SIGN_OFF, "decision", 0.3)],
        );
        let mut record = serde_json::json!({
            "budget": field("identified", BUDGET_SUMMARY, &[SIGN_OFF, SOME_MONEY]),
        });
        let (checked, _) = bant(&model, &mut record, &call).await;
        assert_eq!(
            record["budget"],
            field("partial", BUDGET_SUMMARY, &[SOME_MONEY])
        );
        assert_eq!((checked.other_figures, checked.figures_unsaid), (1, 1));

        let mut record = serde_json::json!({
            "budget": field("identified", BUDGET_SUMMARY, &[SIGN_OFF]),
        });
        let (checked, _) = bant(&model, &mut record, &call).await;
        assert_eq!(record["budget"], field("not_found", "", &[]));
        assert_eq!((checked.figures_unsaid, checked.cleared), (1, 1));

        // A field only hinted at whose figure nobody said is not found, whatever its quotes.
        let mut record = serde_json::json!({
            "budget": field("partial", BUDGET_SUMMARY, &[SOME_MONEY]),
        });
        let (checked, _) = bant(&model, &mut record, &call).await;
        assert_eq!(record["budget"], field("not_found", "", &[]));
        assert_eq!((checked.figures_unsaid, checked.cleared), (1, 1));
    }

    /// A field in doubt whose quote is off its topic is not cleared while its summary claims
    /// an amount: the buyer's sentence that names it, somewhat about a budget, backs it, and
    /// one about none of it leaves the field not found.
    #[tokio::test]
    async fn a_budget_in_doubt_takes_the_sentence_that_names_its_amount() {
        const TRAINING: &str =
            "Our new staff need six weeks of classroom training, and we want to cut that in half.";
        const FORTY_FIVE: &str = "For this we have 40, 40, actually 45,000 dollars.";
        const SUMMARY: &str = "45,000 dollars is set aside for the training.";
        let call = format!("Customer: {TRAINING}\nCustomer: {FORTY_FIVE}");
        let given = serde_json::json!({"budget": field("identified", SUMMARY, &[TRAINING])});
        for (p, status, evidence, cleared) in [
            (0.15, "identified", vec![FORTY_FIVE], 0),
            (0.05, "not_found", vec![], 1),
        ] {
            let model = Table::new(
                vec![(TRAINING, "problem", 0.8), (FORTY_FIVE, "budget", p)],
                Vec::new(),
            );
            let (typed, checked, _) =
                check_given(&model, ProfileKind::Bant, &given, &call, &["budget"]).await;
            let summary = if evidence.is_empty() { "" } else { SUMMARY };
            assert_eq!(
                typed.to_value()["budget"],
                field(status, summary, &evidence),
                "{p}"
            );
            assert_eq!(
                (checked.figures_found, checked.cleared),
                (1 - cleared, cleared),
                "{p}"
            );
        }
    }

    /// A budget summarised as the buyer's sign-off limit takes the sentence that names another
    /// amount and is clearly about a budget, in its own words, and the limit backs the
    /// authority. A sentence only somewhat about a budget is not taken.
    #[tokio::test]
    async fn a_budget_summarised_as_the_sign_off_limit_takes_the_amount_set_aside() {
        const LIMIT: &str = "I can approve spending up to 30,000 dollars on my own.";
        const TWELVE: &str = "For this project we have put 12,000 dollars aside.";
        const SUMMARY: &str = "30,000 dollars is approved for spending.";
        let call = format!("Customer: {LIMIT}\nCustomer: {TWELVE}");
        for (p, amounts_found) in [(0.8, 1), (0.4, 0)] {
            let model = Table::new(
                vec![(LIMIT, "decision", 0.9), (TWELVE, "budget", p)],
                Vec::new(),
            );
            let mut record = serde_json::json!({
                "budget": field("identified", SUMMARY, &[LIMIT]),
            });
            let (checked, moved) = bant(&model, &mut record, &call).await;
            if amounts_found == 1 {
                assert_eq!(record["budget"], field("identified", TWELVE, &[TWELVE]));
            } else {
                assert_eq!(record["budget"], field("not_found", "", &[]), "{p}");
            }
            // Moved: its confidence is set once its status is weighed.
            assert_eq!(record["authority"]["evidence"], serde_json::json!([LIMIT]));
            assert_eq!(moved, [("authority", 0.9)], "{p}");
            assert_eq!(checked.amounts_found, amounts_found, "{p}");
        }
    }

    /// A budget called partial whose quote names the amount its summary claims is stated; one
    /// whose summary claims no amount keeps the status written.
    #[tokio::test]
    async fn a_partial_budget_whose_quote_names_its_amount_is_identified() {
        const CORRECTED: &str =
            "Our budget for a payroll system is eight thousand, no, sorry, six thousand pounds a year.";
        let call = format!("Customer: {CORRECTED}");
        let model = Table::new(vec![(CORRECTED, "budget", 0.9)], Vec::new());
        for (summary, status, amounted) in [
            ("The budget is six thousand pounds a year.", "identified", 1),
            ("There is a budget for payroll.", "partial", 0),
        ] {
            let mut record = serde_json::json!({"budget": field("partial", summary, &[CORRECTED])});
            let checked = stated(&model, &mut record, &call).await;
            assert_eq!(record["budget"], field(status, summary, &[CORRECTED]));
            assert_eq!(checked.amounted, amounted);
        }
    }

    /// A need the model did not doubt, whose quote and the sentences like its summary are off
    /// the topic, gets the buyer's sentence clearly about a problem, and that sentence as its
    /// summary when the summary shares no word with it. One in doubt does not.
    #[tokio::test]
    async fn a_need_the_model_is_sure_of_is_found_among_the_buyer_sentences() {
        const LIVE: &str = "We'd like to go live before the holiday starts in November.";
        const EMAILS: &str = "Our agents answer the same emails again and again.";
        const HELLO: &str = "Hi, thanks for picking up so quickly.";
        let call = format!("Customer: {HELLO}\nCustomer: {EMAILS}\nCustomer: {LIVE}");
        let model = Table::new(
            vec![(LIVE, "timing", 0.9), (EMAILS, "problem", 0.8)],
            Vec::new(),
        );
        let given = || {
            serde_json::json!({
                "need": field("identified", "The company wants to go live soon.", &[LIVE]),
            })
        };
        let mut record = given();
        let (checked, _) = bant(&model, &mut record, &call).await;
        assert_eq!(record["need"], field("identified", EMAILS, &[EMAILS]));
        assert_eq!((checked.needs_found, checked.cleared), (1, 0));

        let (typed, checked, _) =
            check_given(&model, ProfileKind::Bant, &given(), &call, &["need"]).await;
        assert_eq!(typed.to_value()["need"], field("not_found", "", &[]));
        assert_eq!((checked.needs_found, checked.cleared), (0, 1));
    }

    /// A weak quote that the summary speaks of keeps the field before a sentence more on the
    /// topic, but not clearly so, that the summary speaks of less: garbled, the buyer's
    /// statement of who they are sorts as a problem more surely than the need the model
    /// summarised and quoted.
    #[tokio::test]
    async fn a_weak_quote_its_summary_speaks_of_stays_before_a_sentence_it_speaks_of_less() {
        const DIRECTOR: &str =
            "Hi, I'm the training director for a bank, and I can't hire in contract of 200,000 dollars without the board.";
        const TRAINING: &str =
            "Our new staff needs six weeks of classroom training before they can work on their own, and we want to cut that in half.";
        let call = format!("Agent: Hello.\nCustomer: {DIRECTOR}\nCustomer: {TRAINING}");
        let model = Table::new(
            vec![(DIRECTOR, "problem", 0.48), (TRAINING, "problem", 0.26)],
            Vec::new(),
        );
        let summary = "Classroom training needs to be cut in half.";
        let mut record = serde_json::json!({"need": field("identified", summary, &[TRAINING])});
        let (checked, _) = bant(&model, &mut record, &call).await;
        assert_eq!(record["need"], field("identified", summary, &[TRAINING]));
        assert_eq!(checked.replaced, 0);

        // A summary that speaks of the director's sentence as much does take it.
        let summary = "The training director needs a bank of training.";
        let mut record = serde_json::json!({"need": field("identified", summary, &[TRAINING])});
        let (checked, _) = bant(&model, &mut record, &call).await;
        assert_eq!(record["need"], field("identified", summary, &[DIRECTOR]));
        assert_eq!(checked.replaced, 1);
    }

    /// A quote clearly on its topic that the summary does not speak of gives way only to a
    /// sentence at least as likely on the topic; kept, it becomes the summary, which spoke of
    /// another sentence.
    #[tokio::test]
    async fn a_quote_surely_on_its_topic_stays_and_restates_a_summary_of_another_sentence() {
        const LEAD: &str = "Hello, I'm the IT lead and the only one who decides on software here.";
        const LAPTOP: &str =
            "Last month a laptop died and we lost two weeks of design work because nobody had a backup.";
        let call = format!("Agent: Hi.\nCustomer: {LEAD}\nCustomer: {LAPTOP}");
        let summary = "The IT lead is the only one who decides on software.";
        for (lead, kept) in [(0.4, LAPTOP), (0.95, LEAD)] {
            let model = Table::new(
                vec![(LEAD, "problem", lead), (LAPTOP, "problem", 0.92)],
                Vec::new(),
            );
            let mut record = serde_json::json!({"need": field("identified", summary, &[LAPTOP])});
            let (checked, _) = bant(&model, &mut record, &call).await;
            let restated = if kept == LAPTOP { LAPTOP } else { summary };
            assert_eq!(
                record["need"],
                field("identified", restated, &[kept]),
                "{lead}"
            );
            assert_eq!(
                (checked.replaced, checked.resummarised),
                (usize::from(kept == LEAD), usize::from(kept == LAPTOP)),
                "{lead}"
            );
        }
    }

    /// A field without a quote is not given the buyer's statement of who decides, though it
    /// is somewhat about the field's topic and its summary speaks of it: that is the
    /// authority's. A need then gets the sentence clearly about a problem.
    #[tokio::test]
    async fn a_statement_of_who_decides_backs_no_need_the_model_did_not_quote_it_for() {
        const HOTEL: &str =
            "Hi, I run the marketing team at a hotel group, and anything over 10,000 euros has to be approved by our managing director.";
        const FUNDS: &str = "We have about 15,000 euros available for a reporting tool this year.";
        const COPY: &str =
            "Right now we copy numbers from five different systems into slides by hand every Monday.";
        let call = format!("Agent: Hello.\nCustomer: {HOTEL}\nCustomer: {FUNDS}\nCustomer: {COPY}");
        for decision in [0.44, 0.2] {
            let model = Table::new(
                vec![
                    (HOTEL, "problem", 0.32),
                    (FUNDS, "budget", 0.95),
                    (COPY, "problem", 0.8),
                ],
                vec![(HOTEL, "decision", decision)],
            );
            // A summary that speaks of the funds no more than of the director.
            let summary = "The hotel needs a better way of working.";
            let mut record = serde_json::json!({"need": field("identified", summary, &[FUNDS])});
            let (checked, _) = bant(&model, &mut record, &call).await;
            if decision > 0.32 {
                // Its summary spoke of none of its words: the sentence is the summary.
                assert_eq!(record["need"], field("identified", COPY, &[COPY]));
                assert_eq!((checked.repaired, checked.needs_found), (0, 1));
            } else {
                assert_eq!(record["need"], field("identified", summary, &[HOTEL]));
                assert_eq!((checked.repaired, checked.needs_found), (1, 0));
            }
        }
    }

    /// A field whose quote is off its topic and whose summary speaks of that quote is about
    /// the wrong thing: it takes no sentence the summary speaks of less. One whose summary
    /// speaks of another sentence takes it.
    #[tokio::test]
    async fn a_field_summarising_its_off_topic_quote_takes_no_other_sentence() {
        const OFFICE: &str =
            "The office manager, that's me, decides on equipment, together with the senior partner.";
        const PAGES: &str =
            "We print about forty thousand pages a month in our law office, and the old printers keep jamming.";
        let call = format!("Agent: Hello.\nCustomer: {PAGES}\nCustomer: {OFFICE}");
        for (summary, kept) in [
            ("The office manager decides on equipment.", None),
            (
                "Printing forty thousand pages a month costs the office.",
                Some(PAGES),
            ),
        ] {
            let model = Table::new(
                vec![(OFFICE, "decision", 0.95), (PAGES, "cost", 0.2)],
                Vec::new(),
            );
            let mut record = serde_json::json!({
                "economic_impact": field("identified", summary, &[OFFICE]),
            });
            neat_p(&model, &mut record, &call, &[]).await;
            let expected = match kept {
                Some(quote) => field("identified", summary, &[quote]),
                None => field("not_found", "", &[]),
            };
            assert_eq!(record["economic_impact"], expected, "{summary}");
        }
    }

    /// A need whose quote is weak and that no sentence its summary speaks of replaces takes
    /// the buyer's sentence clearly about a problem; a summary claiming a figure its quotes do
    /// not name is restated from them.
    #[tokio::test]
    async fn a_weak_need_takes_the_problem_and_a_summary_says_no_more_than_its_quote() {
        const OWNER: &str =
            "Our owner signs anything over 2,000 pounds, and she's given me 1,500 pounds for booking software.";
        const PATIENTS: &str =
            "Patients phone to book and we can't answer them all, so we lose appointments every day.";
        let call = format!("Agent: Hello.\nCustomer: {OWNER}\nCustomer: {PATIENTS}");
        let model = Table::new(
            vec![(OWNER, "budget", 0.8), (PATIENTS, "problem", 0.86)],
            vec![(OWNER, "problem", 0.15)],
        );
        let summary = "The owner has given 1,500 pounds for booking software.";
        let mut record = serde_json::json!({"need": field("identified", summary, &[OWNER])});
        let (checked, _) = bant(&model, &mut record, &call).await;
        assert_eq!(record["need"], field("identified", PATIENTS, &[PATIENTS]));
        assert_eq!((checked.needs_found, checked.resummarised), (1, 0));

        // Kept, a quote that does not name the month its summary claims is the summary.
        let model = Table::new(vec![(PATIENTS, "problem", 0.86)], Vec::new());
        for (summary, restated) in [
            (
                "Patients who phone must be answered by September.",
                PATIENTS,
            ),
            (
                "Patients phone and appointments are lost.",
                "Patients phone and appointments are lost.",
            ),
        ] {
            let mut record = serde_json::json!({"need": field("identified", summary, &[PATIENTS])});
            bant(&model, &mut record, &call).await;
            assert_eq!(
                record["need"],
                field("identified", restated, &[PATIENTS]),
                "{summary}"
            );
        }
    }

    /// A weak need quote its summary does not speak of, replaced by the sentence about a
    /// problem: the summary, which shares a word with that sentence, stays the model's.
    #[tokio::test]
    async fn a_need_found_in_place_of_an_unrelated_weak_quote_keeps_its_summary() {
        const OWNER: &str =
            "Our owner signs anything over two thousand pounds for booking software.";
        const WEAK: &str = "It could be better.";
        const PATIENTS: &str =
            "Patients phone to book and we lose appointments, the software we have is slow.";
        let call = format!("Agent: Hi.\nCustomer: {OWNER}\nCustomer: {WEAK}\nCustomer: {PATIENTS}");
        let model = Table::new(
            vec![
                (OWNER, "decision", 0.9),
                (WEAK, "problem", 0.15),
                (PATIENTS, "problem", 0.8),
            ],
            Vec::new(),
        );
        let summary = "The owner signs for booking software.";
        let mut record = serde_json::json!({"need": field("identified", summary, &[WEAK])});
        let (checked, _) = bant(&model, &mut record, &call).await;
        assert_eq!(record["need"], field("identified", summary, &[PATIENTS]));
        assert_eq!((checked.needs_found, checked.resummarised), (1, 0));
    }

    /// A need the model did not doubt whose summary joins the problem to the deadline it
    /// quoted still takes the sentence about the problem; in doubt, it does not.
    #[tokio::test]
    async fn a_need_summarised_with_its_deadline_takes_the_problem_unless_in_doubt() {
        const TRAINING: &str =
            "Our new staff need six weeks of classroom training before they can work on their own.";
        const INTAKE: &str = "It needs to be ready for the graduate intake in September.";
        let call = format!("Agent: Hello.\nCustomer: {TRAINING}\nCustomer: {INTAKE}");
        let model = Table::new(
            vec![(TRAINING, "problem", 0.24), (INTAKE, "timing", 0.9)],
            Vec::new(),
        );
        let summary = "Training needs to be ready for the graduate intake in September.";
        let record = serde_json::json!({"need": field("identified", summary, &[INTAKE])});
        for in_doubt in [false, true] {
            let doubted: &[&str] = if in_doubt { &["need"] } else { &[] };
            let (typed, ..) = check_given(&model, ProfileKind::Bant, &record, &call, doubted).await;
            let expected = if in_doubt {
                field("not_found", "", &[])
            } else {
                // Its month is in no quote: the quote is the summary.
                field("identified", TRAINING, &[TRAINING])
            };
            assert_eq!(typed.to_value()["need"], expected, "in doubt: {in_doubt}");
        }
    }

    /// A budget is stated with an amount and a timeline with a date: the status follows what
    /// the kept quotes name, whatever the model wrote.
    #[tokio::test]
    async fn a_budget_without_an_amount_is_partial_and_a_dated_timeline_identified() {
        const MODEST: &str = "We're a small company, so the price would have to be modest.";
        const LEASE: &str = "Our printer lease runs out on the thirtieth of April.";
        const LATER: &str = "Probably sometime after the summer.";
        let call = format!("Customer: {MODEST}\nCustomer: {LEASE}\nCustomer: {LATER}");
        let model = Table::new(
            vec![
                (MODEST, "budget", 0.8),
                (LEASE, "timing", 0.8),
                (LATER, "timing", 0.8),
            ],
            Vec::new(),
        );
        let mut record = serde_json::json!({
            "budget": field("identified", "The price must be modest.", &[MODEST]),
            "timeline": field("partial", "The lease ends on 30 April.", &[LEASE]),
        });
        let checked = stated(&model, &mut record, &call).await;
        assert_eq!(record["budget"]["status"], "partial");
        assert_eq!(record["timeline"]["status"], "identified");
        assert_eq!((checked.amountless, checked.dated), (1, 1));

        // An undated timeline keeps the status written, and so does a budget with an amount.
        let mut record = serde_json::json!({
            "budget": field("identified", BUDGET_SUMMARY, &[SET_ASIDE]),
            "timeline": field("partial", "After the summer.", &[LATER]),
        });
        let call = format!("Customer: {SET_ASIDE}\nCustomer: {LATER}");
        let model = Table::new(
            vec![(SET_ASIDE, "budget", 0.8), (LATER, "timing", 0.8)],
            Vec::new(),
        );
        let checked = stated(&model, &mut record, &call).await;
        assert_eq!(record["budget"]["status"], "identified");
        assert_eq!(record["timeline"]["status"], "partial");
        assert_eq!((checked.amountless, checked.dated), (0, 0));
    }

    /// A quote dropped from one field backs the field it is clearly about, when the record
    /// left that one not found: the sign-off limit given as the budget is the authority.
    #[tokio::test]
    async fn a_sign_off_limit_quoted_for_the_budget_backs_the_authority() {
        let call = format!("Customer: {SIGN_OFF}\nCustomer: {SET_ASIDE}");
        let model = Table::new(
            vec![(SIGN_OFF, "decision", 0.7), (SET_ASIDE, "budget", 0.9)],
            vec![(SIGN_OFF, "budget", 0.25)],
        );
        let mut record = serde_json::json!({
            "budget": field("identified", BUDGET_SUMMARY, &[SIGN_OFF]),
            "need": field("identified", "A tool.", &[SET_ASIDE]),
        });
        let (checked, moved) = bant(&model, &mut record, &call).await;
        // Below 0.3 for a budget and clearly a decision, whole and in each clause: dropped
        // from the budget, which gets the sentence its summary speaks of.
        assert_eq!(
            record["budget"],
            field("identified", BUDGET_SUMMARY, &[SET_ASIDE])
        );
        // Its confidence is settled below, from the quote's odds.
        assert_eq!(record["authority"]["status"], "identified");
        assert_eq!(record["authority"]["summary"], SIGN_OFF);
        assert_eq!(
            record["authority"]["evidence"],
            serde_json::json!([SIGN_OFF])
        );
        assert_eq!(moved, [("authority", 0.7)]);
        assert_eq!(checked.moved, 1);
        // Not to a field the record reports, nor one it is not clearly about: the need's
        // budget sentence is dropped and goes nowhere (the budget is reported).
        assert_eq!(record["need"], field("not_found", "", &[]));
        // Settled: the quote's probability of its topic is the field's confidence; the
        // model's odds, where it wrote the status, choose between identified and partial.
        let mut typed = Record::parse(ProfileKind::Bant, &record.to_string()).unwrap();
        let odds = vec![PointOdds {
            at: super::super::odds::status_point("authority"),
            p: vec![0.1, 0.3, 0.6],
        }];
        super::super::odds::settle_moved(&mut typed, &odds, &moved);
        let authority = &typed.to_value()["authority"];
        assert_eq!(authority["status"], "partial");
        assert_eq!(authority["confidence"], 0.7);
    }

    /// An authority's summary that speaks of the buyer's role, not of the sentence quoted.
    const WHO_APPROVES: &str = "The operations director approves the budget.";

    /// One sentence quoted for the budget and the authority, as likely about either, stays
    /// with the budget whose amount it names; the authority takes the sentence its summary
    /// speaks of. A sentence with a clause of each field's own keeps backing both.
    #[tokio::test]
    async fn a_sentence_two_fields_quote_stays_with_the_one_it_backs_best() {
        const DIRECTOR: &str = "I'm the operations director at a logistics firm.";
        const APPROVED: &str = "We approve forty thousand dollars for this project.";
        let call = format!("Customer: {DIRECTOR}\nCustomer: {APPROVED}");
        let model = Table::new(
            vec![(DIRECTOR, "decision", 0.8), (APPROVED, "decision", 0.45)],
            vec![(APPROVED, "budget", 0.44)],
        );
        let budget = "40,000 dollars approved for the project.";
        let mut record = serde_json::json!({
            "budget": field("identified", budget, &[APPROVED]),
            "authority": field("identified", WHO_APPROVES, &[APPROVED]),
        });
        let (checked, _) = bant(&model, &mut record, &call).await;
        assert_eq!(record["budget"], field("identified", budget, &[APPROVED]));
        assert_eq!(
            record["authority"]["evidence"],
            serde_json::json!([DIRECTOR])
        );
        assert_eq!((checked.unshared, checked.repaired), (1, 1));

        const BOTH: &str = "The board has agreed to spend up to two hundred thousand dollars, \
                            and the final say is with our chief executive.";
        const SAY: &str = "and the final say is with our chief executive.";
        let call = format!("Customer: {BOTH}");
        let model = Table::new(
            vec![(BOTH, "budget", 0.6), (SAY, "decision", 0.8)],
            vec![(BOTH, "decision", 0.35)],
        );
        let budget = "Up to 200,000 dollars agreed by the board.";
        let mut record = serde_json::json!({
            "budget": field("identified", budget, &[BOTH]),
            "authority": field("identified", "The chief executive has the final say.", &[BOTH]),
        });
        let (checked, _) = bant(&model, &mut record, &call).await;
        assert_eq!(record["budget"]["evidence"], serde_json::json!([BOTH]));
        assert_eq!(record["authority"]["evidence"], serde_json::json!([BOTH]));
        assert_eq!(checked.unshared, 0);
    }

    /// A field that looks again may take a sentence another field quotes, which is settled in
    /// turn: the authority that gave the budget its sentence takes the statement of who
    /// decides a need had, and the need, whose summary the model wrote of another sentence
    /// (the check restated it from its quote), takes that one back with its own summary.
    #[tokio::test]
    async fn a_sentence_taken_in_place_of_a_shared_one_is_settled_in_turn() {
        const DIRECTOR: &str =
            "I'm the operations director, and I purchase up to fifty thousand dollars.";
        const APPROVED: &str = "We approve forty thousand dollars for this project.";
        const SHIFTS: &str = "Our shift planning mistakes cost overtime every single week.";
        let call = format!("Customer: {DIRECTOR}\nCustomer: {SHIFTS}\nCustomer: {APPROVED}");
        let model = Table::new(
            vec![
                (DIRECTOR, "problem", 0.55),
                (APPROVED, "decision", 0.45),
                (SHIFTS, "problem", 0.25),
            ],
            vec![(DIRECTOR, "decision", 0.35), (APPROVED, "budget", 0.44)],
        );
        let need = "Shift planning mistakes cost overtime.";
        let mut record = serde_json::json!({
            "budget": field("identified", "40,000 dollars approved.", &[APPROVED]),
            "authority": field("identified", WHO_APPROVES, &[APPROVED]),
            "need": field("identified", need, &[DIRECTOR]),
        });
        let (checked, _) = bant(&model, &mut record, &call).await;
        assert_eq!(record["budget"]["evidence"], serde_json::json!([APPROVED]));
        assert_eq!(
            record["authority"]["evidence"],
            serde_json::json!([DIRECTOR])
        );
        assert_eq!(record["need"], field("identified", need, &[SHIFTS]));
        assert_eq!((checked.unshared, checked.repaired), (2, 2));
    }

    /// A problem and what it costs are said in one clause: both fields keep the sentence. A
    /// field that loses a shared sentence and finds no other on its topic is not found.
    #[tokio::test]
    async fn a_problem_and_its_cost_share_a_sentence_and_a_field_left_bare_is_not_found() {
        const LOSS: &str =
            "We lose twenty thousand dollars a month in overtime because of mistakes.";
        const DATE: &str = "It must be live before April.";
        let call = format!("Customer: {LOSS}\nCustomer: {DATE}");
        let model = Table::new(
            vec![(LOSS, "cost", 0.6), (DATE, "timing", 0.9)],
            vec![(LOSS, "problem", 0.3), (LOSS, "ranking", 0.12)],
        );
        let mut record = serde_json::json!({
            "need": field("identified", "Mistakes in overtime.", &[LOSS]),
            "economic_impact": field("identified", "20,000 dollars a month lost.", &[LOSS]),
            "priority": field("partial", "Losses in overtime matter.", &[LOSS]),
        });
        let checked = neat_p(&model, &mut record, &call, &[false; 5]).await;
        assert_eq!(record["need"]["evidence"], serde_json::json!([LOSS]));
        assert_eq!(
            record["economic_impact"]["evidence"],
            serde_json::json!([LOSS])
        );
        // The priority's only quote backs the economic impact better, and the one other
        // sentence is no ranking.
        assert_eq!(record["priority"], field("not_found", "", &[]));
        assert_eq!((checked.unshared, checked.cleared), (1, 1));
    }

    /// A weak quote its summary speaks of does not give way to a sentence another field
    /// quotes, however likely on the topic: the timeline's deadline is no need.
    #[tokio::test]
    async fn a_weak_quote_does_not_give_way_to_a_sentence_another_field_quotes() {
        const TRAINING: &str = "New staff need six weeks of classroom training, we want it halved.";
        const READY: &str = "It needs to be ready for the graduate intake.";
        let call = format!("Customer: {TRAINING}\nCustomer: {READY}");
        let model = Table::new(
            vec![(TRAINING, "problem", 0.19), (READY, "problem", 0.55)],
            vec![(READY, "timing", 0.4)],
        );
        let need = "Classroom training needs to be cut in half.";
        let mut record = serde_json::json!({
            "need": field("identified", need, &[TRAINING]),
            "timeline": field("identified", "Ready for the graduate intake.", &[READY]),
        });
        let (checked, _) = bant(&model, &mut record, &call).await;
        assert_eq!(record["need"], field("identified", need, &[TRAINING]));
        assert_eq!(record["timeline"]["evidence"], serde_json::json!([READY]));
        assert_eq!((checked.replaced, checked.needs_found), (0, 0));
    }

    #[test]
    fn a_moved_quote_longer_than_a_summary_is_cut_at_a_word() {
        let long = "word ".repeat(60);
        let summary = summary_of(long.trim());
        assert!(summary.chars().count() <= super::super::record::SUMMARY_CHARS);
        assert!(summary.ends_with("word..."));
        assert_eq!(summary_of("Short."), "Short.");
    }

    /// Checks a BANT `record` of `call`, whose agent is the seller, with `model`, as
    /// [`neat_p`] does.
    async fn bant(
        model: &Table,
        record: &mut Value,
        call: &str,
    ) -> (Checked, Vec<(&'static str, f32)>) {
        let (typed, checked, moved) =
            check_given(model, ProfileKind::Bant, record, call, &[]).await;
        *record = typed.to_value();
        (checked, moved)
    }

    /// [`bant`], then [`settle_stated`].
    async fn stated(model: &Table, record: &mut Value, call: &str) -> Checked {
        let (mut typed, mut checked, _) =
            check_given(model, ProfileKind::Bant, record, call, &[]).await;
        settle_stated(ProfileKind::Bant, &mut typed, &mut checked);
        *record = typed.to_value();
        checked
    }

    /// Checks a `kind` record given as JSON, in part (fields left out are `not_found`), of
    /// `call`, whose agent is the seller, with `model`.
    async fn check_given(
        model: &Table,
        kind: ProfileKind,
        record: &Value,
        call: &str,
        doubted: &[&str],
    ) -> (Record, Checked, Vec<(&'static str, f32)>) {
        let mut full = super::super::no_speech_record(kind).to_value();
        for (name, field) in full.as_object_mut().unwrap() {
            *field = record.get(name).cloned().unwrap_or_else(
                || serde_json::json!({"status": "not_found", "summary": "", "evidence": []}),
            );
        }
        let mut typed = Record::parse(kind, &full.to_string()).unwrap();
        let (checked, moved) =
            check_findings(model, kind, &mut typed, call, Some("Agent"), doubted)
                .await
                .unwrap();
        (typed, checked, moved)
    }

    /// Checks a NEAT-P `record` of `call`, whose agent is the seller, with `model`.
    /// `record` is given as JSON, in part (fields left out are `not_found`), and `doubted`
    /// by position in NEAT-P's field order.
    async fn neat_p(model: &Table, record: &mut Value, call: &str, doubted: &[bool]) -> Checked {
        let names = schema_fields(ProfileKind::NeatP);
        let doubted: Vec<&str> = names
            .iter()
            .zip(doubted)
            .filter(|(_, d)| **d)
            .map(|(n, _)| n.as_str())
            .collect();
        let (typed, checked, _) =
            check_given(model, ProfileKind::NeatP, record, call, &doubted).await;
        let all = typed.to_value();
        for (name, field) in record.as_object_mut().unwrap() {
            *field = all[name.as_str()].clone();
        }
        checked
    }

    /// A model that sorts each quote by a fixed table (the quote, its topic and that topic's
    /// probability, each other topic getting 0.02 unless `also` gives it more), telling (or
    /// not) its odds, and keeps the quotes it was asked about.
    struct Table {
        topics: Vec<(&'static str, &'static str, f32)>,
        also: Vec<(&'static str, &'static str, f32)>,
        odds: bool,
        asked: Mutex<Vec<String>>,
    }

    impl Table {
        /// A table that tells its odds.
        fn new(
            topics: Vec<(&'static str, &'static str, f32)>,
            also: Vec<(&'static str, &'static str, f32)>,
        ) -> Self {
            Table {
                topics,
                also,
                odds: true,
                asked: Mutex::new(Vec::new()),
            }
        }
    }

    #[async_trait::async_trait]
    impl Provider for Table {
        async fn generate(&self, g: Generation, _: Deltas) -> Result<Completion, LlmError> {
            let quote = g.messages.last().unwrap().content.clone();
            assert_eq!(g.messages[..g.messages.len() - 1], instructions()[..]);
            let (topic, p) = self
                .topics
                .iter()
                .find(|(q, _, _)| *q == quote)
                .map_or(("other", 0.88), |(_, t, p)| (*t, *p));
            let at = TOPICS.iter().position(|t| *t == topic).unwrap();
            let odds: Vec<f32> = (0..TOPICS.len())
                .map(|i| {
                    let also = self
                        .also
                        .iter()
                        .find(|(q, t, _)| *q == quote && *t == TOPICS[i]);
                    match also {
                        _ if i == at => p,
                        Some((.., p)) => *p,
                        None => 0.02,
                    }
                })
                .collect();
            self.asked.lock().push(quote);
            Ok(Completion {
                text: answer(topic),
                tool_calls: Vec::new(),
                usage: Usage {
                    prompt_tokens: 20,
                    completion_tokens: 5,
                    total_tokens: 25,
                },
                finish: FinishReason::Stop,
                odds: if self.odds {
                    vec![PointOdds {
                        at: TOPIC_POINT.to_owned(),
                        p: odds,
                    }]
                } else {
                    Vec::new()
                },
            })
        }

        fn name(&self) -> &str {
            "sorter"
        }
    }

    const CALL: &str = "Agent: What is our top priority for you today?\n\
                        Customer: Our vans keep getting lost.\n\
                        Customer: We have about eight thousand pounds.\n\
                        Customer: We need it before June.\n\
                        Customer: This is our top priority this year.";

    fn field(status: &str, summary: &str, evidence: &[&str]) -> Value {
        serde_json::json!({"status": status, "summary": summary, "confidence": 0.9,
            "evidence": evidence})
    }

    async fn checked(odds: bool) -> (Value, Checked, Vec<String>) {
        let model = Table {
            odds,
            ..Table::new(
                vec![
                    ("Our vans keep getting lost.", "problem", 0.88),
                    ("We have about eight thousand pounds.", "budget", 0.88),
                    ("We need it before June.", "timing", 0.88),
                    ("This is our top priority this year.", "ranking", 0.88),
                ],
                Vec::new(),
            )
        };
        let mut record = serde_json::json!({
            "need": field("identified", "Vans get lost.", &["Our vans keep getting lost."]),
            "economic_impact": field("identified", "About eight thousand pounds for the vans.",
                &["We have about eight thousand pounds."]),
            "access_to_authority": field("partial", "Has money.",
                &["We have about eight thousand pounds."]),
            "timeline": field("not_found", "", &[]),
            "priority": field("identified", "It is their top priority.",
                &["We need it before June."]),
        });
        let checked = neat_p(&model, &mut record, CALL, &[]).await;
        (record, checked, model.asked.into_inner())
    }

    #[tokio::test]
    async fn quotes_off_their_topic_are_dropped_or_replaced_by_the_sentence_summarised() {
        for odds in [true, false] {
            let (record, checked, asked) = checked(odds).await;
            // On topic: kept as it was.
            assert_eq!(
                record["need"],
                field(
                    "identified",
                    "Vans get lost.",
                    &["Our vans keep getting lost."]
                )
            );
            // The budget is no economic impact, and the only other sentence sharing a word
            // with the summary (the vans) is a problem: nothing is left of the field.
            assert_eq!(record["economic_impact"], field("not_found", "", &[]));
            assert_eq!(record["access_to_authority"], field("not_found", "", &[]));
            // The deadline dropped from the priority is clearly a timing, and the record left
            // the timeline not found: it backs the timeline, in its own words.
            assert_eq!(
                record["timeline"],
                field(
                    "identified",
                    "We need it before June.",
                    &["We need it before June."]
                )
            );
            // A deadline is no priority; the buyer's sentence the summary speaks of is (the
            // agent's sharing more words does not count).
            assert_eq!(
                record["priority"],
                field(
                    "identified",
                    "It is their top priority.",
                    &["This is our top priority this year."]
                )
            );
            // Each quote sorted once; the field not found never asked about.
            let mut once = asked.clone();
            once.sort();
            once.dedup();
            assert_eq!(once.len(), asked.len(), "{asked:?}");
            assert_eq!(asked.len(), 4, "{asked:?}");
            assert_eq!(
                checked,
                Checked {
                    sorted: 4,
                    dropped: 3,
                    repaired: 1,
                    replaced: 0,
                    cleared: 2,
                    // The economic impact's figure is in no sentence about a cost.
                    figures_unsaid: 1,
                    moved: 1,
                    doubted: 0,
                    doubted_kept: 0,
                    by_clause: 0,
                    usage: Usage {
                        prompt_tokens: 4 * 20,
                        completion_tokens: 4 * 5,
                        total_tokens: 4 * 25
                    },
                    ..Checked::default()
                }
            );
        }
    }

    /// A field reported only because the model was held back from `not_found` keeps a quote
    /// only well on its topic, and tries one sentence in its place.
    #[tokio::test]
    async fn fields_pushed_past_not_found_are_held_to_a_stricter_standard() {
        const SALE: &str = "Agent: Who decides on this?\n\
                            Customer: I decide.\n\
                            Customer: Lost parcels cost us a little.\n\
                            Customer: Lost parcels annoy our drivers.\n\
                            Customer: Those parcels come to ten thousand a year.";
        let answer = || {
            serde_json::json!({
                "need": field("not_found", "", &[]),
                "economic_impact": field("identified", "Lost parcels cost us.",
                    &["Lost parcels cost us a little."]),
                "access_to_authority": field("identified", "They decide.", &["I decide."]),
                "timeline": field("not_found", "", &[]),
                "priority": field("not_found", "", &[]),
            })
        };
        for pushed in [false, true] {
            let model = Table::new(
                vec![
                    ("I decide.", "decision", 0.88),
                    ("Lost parcels cost us a little.", "cost", 0.15),
                    ("Lost parcels annoy our drivers.", "problem", 0.88),
                    ("Those parcels come to ten thousand a year.", "cost", 0.88),
                ],
                Vec::new(),
            );
            let mut record = answer();
            let checked = neat_p(
                &model,
                &mut record,
                SALE,
                &[false, pushed, pushed, false, false],
            )
            .await;
            let asked = model.asked.into_inner();
            // Clearly about a decision: kept either way.
            assert_eq!(
                record["access_to_authority"],
                answer()["access_to_authority"]
            );
            if !pushed {
                // 0.15 for cost is enough for a field the model reported of its own accord,
                // but weak: of the sentences closest to its summary, the first is a problem,
                // the second clearly a cost, and that one takes the quote's place.
                assert_eq!(
                    record["economic_impact"],
                    field(
                        "identified",
                        "Lost parcels cost us.",
                        &["Those parcels come to ten thousand a year."]
                    )
                );
                assert_eq!(
                    asked,
                    [
                        "Lost parcels cost us a little.",
                        "Lost parcels annoy our drivers.",
                        "Those parcels come to ten thousand a year.",
                        "I decide."
                    ]
                );
                assert_eq!(
                    (checked.replaced, checked.repaired, checked.dropped),
                    (1, 0, 0)
                );
                assert_eq!((checked.doubted, checked.doubted_kept), (0, 0));
                continue;
            }
            // Not for a pushed one. Dropped, the quote gives way only to a sentence its summary
            // speaks of as much, and none does.
            assert_eq!(record["economic_impact"], field("not_found", "", &[]));
            assert_eq!(asked, ["Lost parcels cost us a little.", "I decide."]);
            assert_eq!(
                checked,
                Checked {
                    sorted: 2,
                    dropped: 1,
                    repaired: 0,
                    replaced: 0,
                    cleared: 1,
                    doubted: 2,
                    doubted_kept: 1,
                    by_clause: 0,
                    usage: Usage {
                        prompt_tokens: 2 * 20,
                        completion_tokens: 2 * 5,
                        total_tokens: 2 * 25
                    },
                    ..Checked::default()
                }
            );
        }
    }
}
