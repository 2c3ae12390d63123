//! Confidence from the model's own odds: how likely it found each intent and each status at
//! the points of its answer where it wrote them. Odds are found by where they were taken
//! (the JSON Pointer of the value written there), never by how many came before.

use super::record::{IntentRecord, Level, Record, Status};
use super::*;
use crate::llm::PointOdds;

/// The intent label for a contact none of the others fits.
pub(super) const NO_FIT: &str = "other";

/// Least probability at which the model may write [`NO_FIT`] as an intent; below, it writes
/// the likeliest of the other labels there (the floor of the intent point's odds). The model
/// also picks `other` when it cannot tell which label fits (a prospect it is unsure is a
/// customer, a transcript with misheard words), and then with a probability that says so: on
/// the labelled set, the calls that are `other` got 0.50 to 0.82, the ones it put there
/// wrongly 0.20 to 0.39 (docs/benchmarks.md).
pub(super) const NO_FIT_SURE: f32 = 0.4;

/// Least probability of an intent said to be `high` confidence, and of one said to be
/// `medium` (below, `low`). On the labelled set, transcribed, the main intents the model gave
/// at 0.8 or more were all right, those at 0.5 to 0.8 11 in 12, those below 0.5 8 in 15 (see
/// docs/benchmarks.md).
pub(super) const INTENT_SURE: [f32; 2] = [0.8, 0.5];

/// Where the odds of the `i`th intent's label are taken.
pub(super) fn intent_point(i: usize) -> String {
    format!("/intents/{i}/intent")
}

/// Where the odds of field `name`'s status are taken.
pub(super) fn status_point(name: &str) -> String {
    format!("/{name}/status")
}

/// Sets each intent's `confidence` from the probability the model gave its label where it
/// wrote it (the odds at [`intent_point`]): `high`, `medium` or `low` by [`INTENT_SURE`]. The
/// confidence the model writes itself copies its worked examples. Where the model would have
/// written [`NO_FIT`] (the likeliest word there) but was held below [`NO_FIT_SURE`], the
/// label written instead is weighed among the labels other than `other`, as the choice it
/// was. An intent without odds (an upstream model gives none) keeps the level written.
pub(super) fn weigh_intents(record: &mut IntentRecord, odds: &[PointOdds]) {
    let labels = intent_labels();
    let no_fit = labels.iter().position(|l| l == NO_FIT);
    for (i, intent) in record.intents.iter_mut().enumerate() {
        let Some(p) = PointOdds::find(odds, &intent_point(i), labels.len()) else {
            continue;
        };
        let label = intent.intent.name();
        let Some(at) = labels.iter().position(|l| *l == label) else {
            continue;
        };
        let mut p_at = p[at];
        if let Some(no_fit) = no_fit.filter(|&i| i != at) {
            let held_back = p[no_fit] < NO_FIT_SURE && p.iter().all(|other| *other <= p[no_fit]);
            if held_back {
                p_at /= 1.0 - p[no_fit];
            }
        }
        intent.confidence = match p_at {
            p if p >= INTENT_SURE[0] => Level::High,
            p if p >= INTENT_SURE[1] => Level::Medium,
            _ => Level::Low,
        };
    }
}

/// Where the model is about to write an intent in an intent answer.
pub(super) const INTENT_AT: &str = "\"intent\":\"";

/// The statuses of a BANT or NEAT-P field, in the schemas' order.
pub(super) const STATUSES: [&str; 3] = [
    Status::ALL[0].as_str(),
    Status::ALL[1].as_str(),
    Status::ALL[2].as_str(),
];
/// Where the model is about to write a field's status in a BANT or NEAT-P answer.
pub(super) const STATUS_AT: &str = "\"status\":\"";

/// Least probability at which the model may write `not_found` for a BANT or NEAT-P field;
/// below, it writes the likelier of the other two statuses and backs the field with what it
/// finds, and the evidence check holds that field to a stricter standard (see
/// [`check::check_findings`]). Reading a whole call, the model called fields the buyer spoke
/// of `not_found` at 0.52 to 0.90 ("I make all the purchasing decisions myself": 0.80), as
/// sure as it was of fields nobody spoke of (0.46 to 0.97), so its status alone cannot tell
/// them apart; a quote sorted by topic on its own can (docs/benchmarks.md).
pub(super) const NOT_FOUND_SURE: f32 = 0.95;

/// For each field of a BANT or NEAT-P `record` (by name), whether the model would have
/// written `not_found` there but was held back by [`NOT_FOUND_SURE`]: `not_found` was the
/// likeliest status where it wrote the field's status, yet below that probability.
pub(super) fn pushed_past_not_found(record: &Record, odds: &[PointOdds]) -> Vec<&'static str> {
    let last = STATUSES.len() - 1;
    record
        .criteria()
        .into_iter()
        .filter(|(name, _)| {
            PointOdds::find(odds, &status_point(name), STATUSES.len()).is_some_and(|p| {
                p[last] < NOT_FOUND_SURE && p[..last].iter().all(|other| *other <= p[last])
            })
        })
        .map(|(name, _)| name)
        .collect()
}

/// Sets each field's confidence to the probability the model gave its status where it wrote
/// it (the odds at [`status_point`]). A model's own "confidence" number copies what its
/// examples show (0.9 identified, 0.6 partial); this one says how sure it was. A field whose
/// status the evidence checks stepped down (quotes not said, or about something else) gets the
/// probability of the status it ended with. A field without odds (an upstream model) keeps
/// the confidence written; one that has none then (one the model was not asked to write,
/// [`Confidence::Weighed`], and whose status was not weighed) gets 0: nothing says how sure
/// the model was of it. The fields `moved` (see [`settle_moved`]) keep theirs.
pub(super) fn weigh_statuses(record: &mut Record, odds: &[PointOdds], moved: &[(&str, f32)]) {
    for (name, criterion) in record.criteria_mut() {
        if moved.iter().any(|(m, _)| *m == name) {
            continue;
        }
        let at = Status::ALL.iter().position(|s| *s == criterion.status);
        let weighed = PointOdds::find(odds, &status_point(name), STATUSES.len())
            .zip(at)
            .map(|(p, at)| (f64::from(p[at]).clamp(0.0, 1.0) * 100.0).round() / 100.0);
        match weighed {
            Some(sure) => criterion.confidence = Some(sure),
            None if criterion.confidence.is_none() => {
                tracing::warn!(
                    field = name,
                    "a field's status was not weighed: confidence 0"
                );
                criterion.confidence = Some(0.0);
            }
            None => {}
        }
    }
}

/// Settles the fields of `record` that the evidence check backed with a quote dropped from
/// another field (`moved`: each field with the quote's probability of the field's topic). The
/// model did not report them, so its odds do not say how sure it is of them: their confidence
/// is the quote's probability of the topic. Their status is the likelier of identified and
/// partial where the model wrote the field's status ("I'd have to ask my partner" is a partial
/// authority), identified without odds.
pub(super) fn settle_moved(record: &mut Record, odds: &[PointOdds], moved: &[(&str, f32)]) {
    for (name, criterion) in record.criteria_mut() {
        let Some((_, p)) = moved.iter().find(|(m, _)| *m == name) else {
            continue;
        };
        if let Some(statuses) = PointOdds::find(odds, &status_point(name), STATUSES.len()) {
            if statuses[1] > statuses[0] {
                criterion.status = Status::Partial;
            }
        }
        criterion.confidence = Some((f64::from(*p).clamp(0.0, 1.0) * 100.0).round() / 100.0);
    }
}
