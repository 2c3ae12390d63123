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

use std::sync::Arc;

use callstream_actors::call::{IntentClassifier, IntentFuture};
use serde_json::Value;

use super::{LlmError, Provider, Usage};

mod catalogue;
mod check;
mod checked;
pub mod claims;
mod clauses;
mod evidence;
mod fit;
mod layout;
mod odds;
pub mod record;
#[cfg(test)]
mod tests;

#[allow(unused_imports)]
use self::{catalogue::*, evidence::*, fit::*, layout::*, odds::*};
pub use catalogue::{
    intent_labels, no_speech_record, profile, profile_for, Confidence, Example, Profile,
    ProfileKind,
};
pub use check::{conversation as check_conversation, field_topic, sort_after, Checked, TOPICS};
pub use evidence::{buyer_sentences, sentences, verify_evidence};
pub use layout::{messages, warm_ups, Layout, FILE_LAYOUT, LIVE_LAYOUT};
pub use record::Record;

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
        .map(|a| (a.record.to_value(), a.usage))
}

/// Whether any line of `transcript` (`Speaker: text` lines) has words: a transcript without
/// any gets the fixed record of no speech, without the model.
pub fn has_speech(transcript: &str) -> bool {
    transcript.lines().any(|l| {
        l.split_once(": ")
            .map_or(!l.trim().is_empty(), |(_, text)| !text.trim().is_empty())
    })
}

/// [`analyse`], also telling how many evidence quotes the model gave and kept.
pub async fn analyse_checked(
    provider: &dyn Provider,
    kind: ProfileKind,
    layout: Layout,
    transcript: &str,
    seller: Option<&str>,
) -> Result<Analysis, LlmError> {
    if !has_speech(transcript) {
        return Ok(Analysis {
            record: no_speech_record(kind),
            usage: Usage::default(),
            quotes: Quotes::default(),
            checked: Checked::default(),
        });
    }
    let mut completion = generate_fitted(provider, kind, layout, transcript, seller).await?;
    let mut record = parse_answer(kind, &completion)?;
    tracing::debug!(?kind, answer = %completion.text.trim(), odds = ?completion.odds, "analysis answered");
    let (quotes, checked) = match &mut record {
        Record::Intent(intent) => {
            weigh_intents(intent, &completion.odds);
            Default::default()
        }
        _ => {
            let quotes = verify_evidence(&mut record, transcript, seller);
            let mut doubted = pushed_past_not_found(&record, &completion.odds);
            doubted.extend(summarised_as_an_example(&record));
            let (mut checked, moved) =
                check::check_findings(provider, kind, &mut record, transcript, seller, &doubted)
                    .await?;
            completion.usage += checked.usage;
            // A field backed by a moved quote gets a status, then every status follows what
            // its quotes name, and last each field's confidence is its final status's
            // probability (a moved field's, its quote's): a field the checks left not_found
            // gets that status's.
            settle_moved(&mut record, &completion.odds, &moved);
            check::settle_stated(kind, &mut record, &mut checked);
            weigh_statuses(&mut record, &completion.odds, &moved);
            (quotes, checked)
        }
    };
    Ok(Analysis {
        record,
        usage: completion.usage,
        quotes,
        checked,
    })
}

/// The record in `completion`'s text. The schema holds the embedded model to the record's
/// shape; an upstream model that strays from it is an engine error naming the field.
fn parse_answer(kind: ProfileKind, completion: &super::Completion) -> Result<Record, LlmError> {
    Record::parse(kind, completion.text.trim()).map_err(|e| {
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
            "the {kind:?} analysis is not a {kind:?} record ({e}; {:?}, ends {tail:?})",
            completion.finish
        ))
    })
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
    pub record: Record,
    /// Tokens spent.
    pub usage: Usage,
    /// The evidence quotes, before the check.
    pub quotes: Quotes,
    /// What the check of the evidence by topic did (BANT and NEAT-P).
    pub checked: Checked,
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

    /// The call's intent prompt so far, for the model to evaluate while it is idle once the
    /// call has asked: the next `classify` of this call then evaluates only what was said
    /// since. (The service's own classifier also reads a few calls ahead before they ask.)
    fn prefill(&self, transcript: String, asked: bool) {
        if !asked {
            return;
        }
        self.provider.prefill(
            messages(
                ProfileKind::Intent,
                LIVE_LAYOUT,
                Confidence::of(self.provider.as_ref()),
                &transcript,
            ),
            None,
            crate::llm::fair::Class::Live,
        );
    }
}
