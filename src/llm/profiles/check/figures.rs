//! The figures a BANT or NEAT-P field claims, held to what the buyer said: a summary's amounts
//! and months must be named by its quotes, and where a field's definition is a figure, its
//! status follows what its quotes name.

use super::*;

/// Holds each field's evidence to the figures its summary claims ([`claims::claimed`]: amounts of
/// money, other amounts of 100 or more, months). A summary that gives a figure the buyer took back
/// in its quotes ("eight thousand, no, sorry, six thousand") first gives the one they settled on
/// ([`claims::restate`]). On a field of the [`FIGURE_TOPICS`], a quote about other figures only is
/// dropped (and added to `displaced`): the buyer's limit for signing off purchases under a summary
/// of their budget. When the quotes left do not name a claimed figure, the buyer's sentences that
/// do, most first, are tried as in [`check_findings`] (on the field's topic, not about a twin), and
/// the first that passes leads the evidence. When none does on a field of an amount
/// ([`AMOUNT_TOPICS`]), the buyer's sentence that names another amount and is clearly on the
/// field's topic (see [`clearly_about`]; not one the model quoted for the field, in `quoted`)
/// becomes its evidence and its summary: "For this helpdesk project we have set aside twelve
/// thousand dollars for the first year." for a budget the model summarised as the buyer's limit of
/// thirty thousand dollars for signing off purchases. When none does, nothing the buyer said bears
/// out the claim: an identified field of those topics steps down to partial, a partial one is
/// `not_found` (its quotes displaced), and so is a field left without quotes. [`check_findings`]
/// leaves a field of those topics whose summary claims a figure to this, quotes or none: "For this
/// we have 40, 40, actually 45,000 dollars." backs "45,000 dollars is set aside for classroom
/// training." when the model quoted a sentence about the training.
pub(super) async fn hold_to_figures(
    sorter: &mut Sorter<'_>,
    kind: ProfileKind,
    record: &mut Record,
    buyer: &[String],
    quoted: &HashMap<&'static str, Vec<String>>,
    displaced: &mut Vec<(&'static str, String)>,
) -> Result<(), LlmError> {
    for (name, field) in record.criteria_mut() {
        if field.status == Status::NotFound {
            continue;
        }
        // A summary that gives the figure the buyer took back gives the one they settled on.
        if let Some(restated) = claims::restate(&field.summary, &field.evidence) {
            tracing::debug!(?kind, field = %name, summary = %field.summary, %restated, "a summary's figure the buyer corrected restated");
            sorter.checked.restated += 1;
            field.summary = restated;
        }
        let claimed = claims::claimed(&field.summary);
        if claimed.is_empty() {
            continue;
        }
        let Some(at) = topic_at(kind, name) else {
            continue;
        };
        let essential = FIGURE_TOPICS.contains(&TOPICS[at]);
        let (other, mut kept): (Vec<String>, Vec<String>) = std::mem::take(&mut field.evidence)
            .into_iter()
            .partition(|q| essential && claims::about_other_figures(q, &claimed));
        // The model's own quotes for the field and the sentences tried for its figures: no
        // other amount of theirs is the field's.
        let mut tried: Vec<String> = quoted.get(name).cloned().unwrap_or_default();
        for quote in other {
            tracing::debug!(?kind, field = %name, quote, summary = %field.summary, "a quote about other figures than its summary's dropped");
            sorter.checked.other_figures += 1;
            displaced.push((name, quote));
        }
        let said: Vec<claims::Figure> = kept.iter().flat_map(|q| claims::settled(q)).collect();
        let missing: Vec<claims::Figure> = claimed
            .into_iter()
            .filter(|c| !claims::borne(*c, &said))
            .collect();
        if !missing.is_empty() {
            let mut naming: Vec<(usize, usize, &String)> = buyer
                .iter()
                .enumerate()
                .filter(|(_, s)| !kept.contains(s))
                .map(|(i, s)| {
                    let own = claims::settled(s);
                    (
                        missing.iter().filter(|m| claims::borne(**m, &own)).count(),
                        i,
                        s,
                    )
                })
                .filter(|(n, ..)| *n > 0)
                .collect();
            naming.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
            let mut found = false;
            for (_, _, sentence) in naming.into_iter().take(REPAIR_TRIES) {
                tried.push(sentence.clone());
                let p = sorter.odds(sentence).await?[at];
                let needed = if essential { ON_TOPIC } else { CLEAR_ON_TOPIC };
                // The twin check may sort the sentence's clauses: only for one on topic.
                let fits = p >= needed && !sorter.about_the_twin(sentence, at).await?;
                tracing::debug!(?kind, field = %name, sentence, p, fits, "a sentence naming the summary's figures sorted");
                if fits {
                    kept.insert(0, sentence.clone());
                    kept.truncate(MOST_QUOTES);
                    sorter.checked.figures_found += 1;
                    found = true;
                    break;
                }
            }
            if !found && AMOUNT_TOPICS.contains(&TOPICS[at]) {
                // The figure is not the field's (the sign-off limit summarised as the
                // budget): the buyer's sentence that names an amount and is clearly on the
                // topic is, and the summary becomes it.
                let candidates: Vec<&String> = buyer
                    .iter()
                    .filter(|s| !kept.contains(s) && !tried.contains(s))
                    .filter(|s| claims::names_an_amount(s))
                    .collect();
                if let Some(sentence) = clearly_about(sorter, &candidates, at, REPAIR_TRIES).await?
                {
                    tracing::debug!(?kind, field = %name, summary = %field.summary, sentence, "a sentence naming an amount on the field's topic found");
                    field.summary = summary_of(&sentence);
                    displaced.retain(|(from, quote)| *from != name || *quote != sentence);
                    kept = vec![sentence];
                    sorter.checked.amounts_found += 1;
                    found = true;
                }
            }
            if !found && essential {
                sorter.checked.figures_unsaid += 1;
                if field.status == Status::Identified {
                    field.status = Status::Partial;
                } else {
                    // Only hinted at, and the one figure it claims nobody said: nothing of
                    // it holds. Its quotes may back another field.
                    for quote in kept.drain(..) {
                        displaced.push((name, quote));
                    }
                }
            }
        }
        if kept.is_empty() {
            field.status = Status::NotFound;
            field.summary.clear();
            sorter.checked.cleared += 1;
        }
        field.evidence = kept;
    }
    Ok(())
}

/// Settles identified against partial where a field's definition is a figure, by its kept quotes. A
/// budget is an amount of money or a price range: one whose quotes name no amount is only hinted at
/// ("We're a small company, so the price would have to be modest." is partial), and one whose
/// quotes name the amount its summary claims is stated ("Our budget for a payroll system is eight
/// thousand, no, sorry, six thousand pounds a year." under "The budget is six thousand pounds a
/// year." is identified, though the model, put off by the correction, called it partial). A
/// timeline is a date, deadline or event: one whose quotes name a date is stated ("Our printer
/// lease runs out on the thirtieth of April." is identified). The model took its status from its
/// worked example's loose "sometime after the summer" (partial) for most dated timelines of the
/// labelled sales calls, and called identified budgets that gave no amount.
pub(in super::super) fn settle_stated(
    kind: ProfileKind,
    record: &mut Record,
    checked: &mut Checked,
) {
    for (name, field) in record.criteria_mut() {
        match (topic(kind, name), field.status) {
            (Some("budget"), Status::Identified)
                if !field.evidence.iter().any(|q| claims::names_an_amount(q)) =>
            {
                field.status = Status::Partial;
                checked.amountless += 1;
            }
            (Some("budget"), Status::Partial)
                if field.evidence.iter().any(|q| claims::names_an_amount(q))
                    && !claims::claimed(&field.summary).is_empty()
                    && claims::bears_out(&field.summary, &field.evidence) =>
            {
                field.status = Status::Identified;
                checked.amounted += 1;
            }
            (Some("timing"), Status::Partial)
                if field.evidence.iter().any(|q| claims::names_a_date(q)) =>
            {
                field.status = Status::Identified;
                checked.dated += 1;
            }
            _ => continue,
        }
        tracing::debug!(?kind, field = %name, status = field.status.as_str(), evidence = ?field.evidence, "status settled by what the quotes name");
    }
}

/// The topics whose figures are what a field claims: the money the buyer has, the money the
/// problem costs, the date they must buy by. Elsewhere a figure is incidental ("we print
/// 40,000 pages a month" in a need): a sentence that names it is added to the evidence only
/// when it is clearly on the field's topic ([`CLEAR_ON_TOPIC`]), and nothing is dropped or
/// stepped down for it.
pub(super) const FIGURE_TOPICS: [&str; 3] = ["budget", "cost", "timing"];

/// The [`FIGURE_TOPICS`] whose figure is an amount: the money the buyer has, the money the
/// problem costs.
const AMOUNT_TOPICS: [&str; 2] = ["budget", "cost"];

/// Most quotes a field's evidence holds (the schemas' `maxItems`).
const MOST_QUOTES: usize = 2;
