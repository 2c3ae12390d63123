//! One sentence quoted for several fields of a record. Reading a garbled call, the model
//! often quotes the sentence it found for one field under the next ones too: the budget's "We
//! approve forty thousand dollars for this planet." as the authority's evidence, the buyer's
//! statement of who decides as every field's. Sorted alone, such a sentence can be as likely
//! about one field's topic as another's (0.447 budget, 0.450 decision), so each keeps it. A
//! quote that fits another field better is moved: the sentence stays with the field it backs
//! best, and another field keeps it only when part of it says that field's own thing.

use super::*;

/// Pairs of topics one clause states together: what a problem costs names the problem ("we
/// lose about twenty thousand dollars a month in overtime because of mistakes" is the need
/// and the economic impact alike), as the topic's definition says.
const SAID_TOGETHER: [(&str, &str); 1] = [("problem", "cost")];

/// Whether topics `a` and `b` are [`SAID_TOGETHER`].
fn said_together(a: &str, b: &str) -> bool {
    SAID_TOGETHER
        .iter()
        .any(|&(x, y)| (x, y) == (a, b) || (y, x) == (a, b))
}

/// How well a sentence backs a field (see [`backing`]).
type Backing = (bool, usize, f32);

/// How well `sentence` backs a field of topic `at` whose summary the model `said` (not one the
/// check restated from a quote), best first when compared: whether it names every figure the
/// summary claims (and the summary claims one), how many of the summary's words it has, and
/// its likeliest odds of the topic, whole or by clause.
async fn backing(
    sorter: &mut Sorter<'_>,
    sentence: &str,
    said: &str,
    at: usize,
) -> Result<Backing, LlmError> {
    let names =
        !claims::claimed(said).is_empty() && claims::bears_out(said, &[sentence.to_owned()]);
    let words = content_words(sentence)
        .intersection(&content_words(said))
        .count();
    let mut odds = sorter.odds(sentence).await?[at];
    for clause in clauses(sentence) {
        odds = odds.max(sorter.odds(clause).await?[at]);
    }
    Ok((names, words, odds))
}

/// Whether a clause of `sentence`, sorted alone, is likeliest about topic `at`: the
/// sentence says that field's thing besides another's ("The board has agreed to spend up to
/// two hundred thousand dollars, and the final say is with our chief executive.").
async fn says_it_in_a_clause(
    sorter: &mut Sorter<'_>,
    sentence: &str,
    at: usize,
) -> Result<bool, LlmError> {
    for clause in clauses(sentence) {
        let odds = sorter.odds(clause).await?;
        if (0..TOPICS.len()).all(|t| t == at || odds[t] < odds[at]) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// What [`share_out`] reads of the call and the record as the model wrote it.
#[derive(Clone, Copy)]
pub(super) struct Call<'a> {
    pub kind: ProfileKind,
    /// The buyer's sentences.
    pub buyer: &'a [String],
    /// The fields in doubt (see [`check_findings`]).
    pub doubted: &'a [&'a str],
    /// Each field's summary as the model wrote it.
    pub summaries: &'a [(&'static str, String)],
}

/// Rounds of [`share_out`]: a field that looks again may take a sentence another field
/// quotes, which is then settled in the next round.
const ROUNDS: usize = 3;

/// Gives each sentence that several fields of `record` quote to the one it backs best (see
/// [`backing`]); the others drop it, but for a field whose topic is [`SAID_TOGETHER`] with
/// that one's, or that a clause of the sentence is about (see [`says_it_in_a_clause`]). A
/// field left without quotes looks again, as [`check_findings`] repairs one: of the buyer's
/// sentences closest to its summary, but those it gave up, the first on its topic (at least
/// [`ON_TOPIC`], [`DOUBTED_ON_TOPIC`] for a field in `doubted`) and not about a twin or a
/// decision; else it is `not_found`. A sentence so taken that another field quotes is settled
/// the same way in the next of [`ROUNDS`]: the buyer's statement of who decides, which a need
/// took as a problem, backs the authority that lost the budget's sentence.
pub(super) async fn share_out(
    sorter: &mut Sorter<'_>,
    record: &mut Record,
    call: &Call<'_>,
) -> Result<(), LlmError> {
    let mut settled = Settled::default();
    for _ in 0..ROUNDS {
        // Every sentence quoted for more than one field, in the order first quoted, that a
        // field quotes not yet found to keep it.
        let mut shared: Vec<String> = Vec::new();
        let fields = record.criteria();
        for (i, (_, field)) in fields.iter().enumerate() {
            for quote in &field.evidence {
                let again = fields[i + 1..]
                    .iter()
                    .any(|(_, f)| f.evidence.contains(quote));
                let unsettled = fields
                    .iter()
                    .any(|(n, f)| f.evidence.contains(quote) && !settled.keeps(n, quote));
                if again && unsettled && !shared.contains(quote) {
                    shared.push(quote.clone());
                }
            }
        }
        if shared.is_empty() {
            break;
        }
        for sentence in shared {
            settle(sorter, record, call, &sentence, &mut settled).await?;
        }
    }
    Ok(())
}

/// What [`share_out`] settled: the sentences each field gave up, and the fields found to keep
/// a shared one.
#[derive(Default)]
struct Settled {
    lost: Vec<(&'static str, String)>,
    kept: Vec<(&'static str, String)>,
}

impl Settled {
    /// Whether `field` was found to keep `sentence`.
    fn keeps(&self, field: &str, sentence: &str) -> bool {
        self.kept.iter().any(|(f, s)| *f == field && s == sentence)
    }

    /// Whether `field` gave `sentence` up.
    fn lost(&self, field: &str, sentence: &str) -> bool {
        self.lost.iter().any(|(f, s)| *f == field && s == sentence)
    }
}

/// Settles one `sentence` several fields of `record` quote (see [`share_out`]).
async fn settle(
    sorter: &mut Sorter<'_>,
    record: &mut Record,
    call: &Call<'_>,
    sentence: &str,
    settled: &mut Settled,
) -> Result<(), LlmError> {
    let Call {
        kind,
        buyer,
        doubted,
        summaries,
    } = *call;
    // The fields quoting it, with their topic, the summary the model wrote and how well it
    // backs them.
    let mut quoting: Vec<(&'static str, usize, String, Backing)> = Vec::new();
    for (name, field) in record.criteria() {
        let Some(at) = topic_at(kind, name) else {
            continue;
        };
        if field.evidence.iter().any(|q| q == sentence) {
            let said = summaries
                .iter()
                .find_map(|(n, s)| (*n == name).then_some(s.as_str()))
                .unwrap_or(&field.summary);
            let backs = backing(sorter, sentence, said, at).await?;
            quoting.push((name, at, said.to_owned(), backs));
        }
    }
    // The field it backs best; the field first in the record wins a tie.
    let mut best: Option<(&'static str, usize, Backing)> = None;
    for &(name, at, _, backs) in &quoting {
        let better = best.is_none_or(|(.., b)| {
            (backs.0, backs.1)
                .cmp(&(b.0, b.1))
                .then(backs.2.total_cmp(&b.2))
                .is_gt()
        });
        if better {
            best = Some((name, at, backs));
        }
    }
    let Some((owner, owner_at, _)) = best else {
        return Ok(());
    };
    settled.kept.push((owner, sentence.to_owned()));
    for (name, at, said, backs) in quoting {
        if name == owner
            || said_together(TOPICS[at], TOPICS[owner_at])
            || says_it_in_a_clause(sorter, sentence, at).await?
        {
            settled.kept.push((name, sentence.to_owned()));
            continue;
        }
        tracing::debug!(?kind, field = %name, to = owner, sentence, ?backs, "a quote another field fits better dropped");
        sorter.checked.unshared += 1;
        settled.lost.push((name, sentence.to_owned()));
        let Some(field) = record
            .criteria_mut()
            .into_iter()
            .find_map(|(n, f)| (n == name).then_some(f))
        else {
            continue;
        };
        field.evidence.retain(|q| *q != sentence);
        if !field.evidence.is_empty() {
            continue;
        }
        let (least, tries) = if doubted.contains(&name) {
            (DOUBTED_ON_TOPIC, DOUBTED_REPAIR_TRIES)
        } else {
            (ON_TOPIC, REPAIR_TRIES)
        };
        // The sentences closest to what the model wrote: a summary the check restated was of
        // the sentence given up.
        let candidates: Vec<&str> = closest(&said, TOPICS[at], buyer)
            .into_iter()
            .filter(|s| !settled.lost(name, s))
            .take(tries)
            .collect();
        for candidate in candidates {
            let (p, elsewhere) = sorter.in_place(candidate, at, least).await?;
            tracing::debug!(?kind, field = %name, candidate, p, elsewhere, "a sentence closest to the summary sorted in place of a shared one");
            if p >= least && !elsewhere {
                field.evidence = vec![candidate.to_owned()];
                field.summary = if claims::bears_out(&said, &field.evidence) {
                    said.clone()
                } else {
                    summary_of(candidate)
                };
                sorter.checked.repaired += 1;
                break;
            }
        }
        if field.evidence.is_empty() {
            field.status = Status::NotFound;
            field.summary.clear();
            sorter.checked.cleared += 1;
        }
    }
    Ok(())
}
