//! `callstream bench topics`: how the evidence check sorts the buyer's sentences of the labelled
//! sales calls by topic. Each sentence a BANT or NEAT-P answer may quote is placed in its turn
//! of the call, and the turn's labels tell which topics it states (a turn stating the need and
//! what it costs: "problem" or "cost"). The check keeps or drops a field's quote by these odds,
//! so a sentence sorted under another field's topic is a quote the check cannot set right.
//!
//! It runs only the check's short requests, a few minutes for the sales calls where `bench
//! analysis` takes twenty, and it can try another wording of the check's instructions or
//! worked examples without a build (`--instructions`, `--examples`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context;
use callstream::config::Config;
use callstream::files::seller_label;
use callstream::llm::profiles::{
    buyer_sentences, check_conversation, field_topic, sort_after, TOPICS,
};
use callstream::llm::Message;

use super::bench_analysis::kept_transcript;
use super::labelled::{read_calls, Call, Placed};

/// Options of `bench topics`.
pub struct Options {
    /// The labelled set.
    pub set: PathBuf,
    /// Kept transcripts of the recordings (`bench analysis --transcripts`); the written
    /// dialogues when `None`.
    pub transcripts: Option<PathBuf>,
    /// Only the calls whose id starts with one of these.
    pub calls: Vec<String>,
    /// The check's instructions in place of the built-in ones.
    pub instructions: Option<PathBuf>,
    /// The check's worked examples in place of the built-in ones.
    pub examples: Option<PathBuf>,
}

/// Sentences of at most this many words are not sorted: greetings ("Hi Chris.") say nothing of
/// a topic, even in the turn that goes on to state one.
const GREETING_WORDS: usize = 2;

/// The sentences of the turns that state one topic: how many were sorted under a topic their
/// turn states (this one or another), how many there were, and the sum of the odds of this one.
#[derive(Default)]
struct Row {
    right: usize,
    all: usize,
    odds: f32,
}

/// The topics turn `turn` of `call` states, by the BANT and NEAT-P fields labelled with it.
fn stated_topics(call: &Call, turn: usize) -> Vec<&'static str> {
    let mut topics: Vec<&str> = call
        .bant
        .iter()
        .chain(&call.neat_p)
        .filter(|l| l.turns.contains(&turn))
        .filter_map(|l| field_topic(&l.field))
        .collect();
    topics.sort_unstable();
    topics.dedup();
    topics
}

/// Runs the bench.
pub fn bench(config: &Config, options: &Options) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new()?;
    let provider = callstream::llm::build_provider(config)?;
    let read = |path: &Option<PathBuf>, built_in: &'static str| -> anyhow::Result<String> {
        match path {
            Some(p) => {
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
            }
            None => Ok(built_in.to_owned()),
        }
    };
    let conversation: Vec<Message> = check_conversation(
        &read(
            &options.instructions,
            include_str!("../llm/profiles/check.md"),
        )?,
        &read(
            &options.examples,
            include_str!("../llm/profiles/check.examples.json"),
        )?,
    )
    .context("the worked examples are not a JSON list of {\"said\", \"topic\"}")?;
    let calls: Vec<Call> = read_calls(&options.set.join("calls.txt"))?
        .into_iter()
        .filter(|c| !c.bant.is_empty() || !c.neat_p.is_empty())
        .filter(|c| options.calls.is_empty() || options.calls.iter().any(|p| c.id.starts_with(p)))
        .collect();
    let seller = seller_label(&config.transcribe.channel_roles);
    println!(
        "model {}; {} sales calls, {}",
        provider.name(),
        calls.len(),
        match &options.transcripts {
            Some(dir) => format!("transcripts kept in {}", dir.display()),
            None => "written dialogues".to_owned(),
        }
    );
    let mut rows: BTreeMap<&str, Row> = BTreeMap::new();
    // Buyer sentences in no labelled turn: (sorted under a field's topic at 0.5 or more, all).
    let (mut unlabelled_topical, mut unlabelled) = (0, 0);
    let (mut unplaced, mut greetings) = (0, 0);
    // Sentences in labelled turns: (sorted under one of the turn's topics, all).
    let (mut right_sentences, mut labelled) = (0, 0);
    for call in &calls {
        let transcript = match &options.transcripts {
            Some(dir) => kept_transcript(dir, &call.id)?.1.with_context(|| {
                format!("no kept transcript of {} in {}", call.id, dir.display())
            })?,
            None => call.written_dialogue(),
        };
        let placed = Placed::new(&transcript, &call.turns);
        for sentence in buyer_sentences(&transcript, seller.as_deref()) {
            if sentence.split_whitespace().count() <= GREETING_WORDS {
                greetings += 1;
                continue;
            }
            let Some(turn) = placed.turn_of(&sentence) else {
                unplaced += 1;
                continue;
            };
            let expected = stated_topics(call, turn);
            let (odds, _) = runtime.block_on(sort_after(
                provider.as_ref(),
                conversation.clone(),
                &sentence,
            ))?;
            let mut ranked: Vec<(&str, f32)> = TOPICS.iter().copied().zip(odds).collect();
            ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
            let shown: Vec<String> = ranked
                .iter()
                .take(3)
                .map(|(t, p)| format!("{t} {p:.2}"))
                .collect();
            if expected.is_empty() {
                unlabelled += 1;
                if ranked[0].0 != "other" && ranked[0].1 >= 0.5 {
                    unlabelled_topical += 1;
                    println!(
                        "  unlabelled {} turn {turn}: {} | {sentence}",
                        call.id,
                        shown.join(", ")
                    );
                }
                continue;
            }
            let right = expected.contains(&ranked[0].0);
            labelled += 1;
            right_sentences += usize::from(right);
            for topic in &expected {
                let row = rows.entry(topic).or_default();
                row.all += 1;
                row.right += usize::from(right);
                row.odds += ranked.iter().find(|(t, _)| t == topic).map_or(0.0, |r| r.1);
            }
            if !right {
                println!(
                    "  miss {} turn {turn} {:?}: {} | {sentence}",
                    call.id,
                    expected,
                    shown.join(", ")
                );
            }
        }
    }
    println!(
        "| topic stated | its sentences sorted under a topic their turn states (top-1) | mean odds of this topic |"
    );
    println!("|---|---|---|");
    for (topic, row) in &rows {
        println!(
            "| {topic} | {}/{} | {:.2} |",
            row.right,
            row.all,
            row.odds / row.all.max(1) as f32
        );
    }
    println!("| any of its turn's topics, per sentence | {right_sentences}/{labelled} | |");
    println!(
        "buyer sentences in no labelled turn sorted under a field's topic at 0.5 or more: \
         {unlabelled_topical}/{unlabelled}; sentences placed in no turn: {unplaced}; greetings \
         (at most {GREETING_WORDS} words) not sorted: {greetings}"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_states_the_topics_of_the_fields_labelled_with_it() {
        let dir = std::env::temp_dir().join(format!("bench-topics-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("calls.txt");
        std::fs::write(
            &path,
            "## sales-x | intent=purchase_intent \
             | bant=budget:identified@3,authority:identified@2,need:identified@2+4,timeline:partial \
             | neat_p=need:identified@4,economic_impact:identified@4,access_to_authority:identified@2\n\
             A: Hello.\n\
             C: I'm the office manager and I sign off up to 5,000 dollars.\n\
             C: We have 3,000 dollars for this.\n\
             C: Our phones drop calls, which costs us about 400 dollars a week.\n",
        )
        .unwrap();
        let calls = read_calls(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let call = &calls[0];
        assert_eq!(stated_topics(call, 1), Vec::<&str>::new());
        assert_eq!(stated_topics(call, 2), ["decision", "problem"]);
        assert_eq!(stated_topics(call, 3), ["budget"]);
        assert_eq!(stated_topics(call, 4), ["cost", "problem"]);
    }
}
