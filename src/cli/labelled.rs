//! The labelled calls of `callstream bench analysis` (`fixtures/analysis/calls.txt`): what each
//! call's analyses should find, and how an answer is held to it.

use std::path::Path;

use anyhow::Context;
use callstream::llm::profiles::claims::{bears_out, figures, Figure};
use callstream::llm::profiles::sentences;
use callstream_actors::asr::wer::{normalise, words_in_order};
use callstream_actors::transcript::dialogue;

/// One labelled call.
#[derive(Debug, PartialEq)]
pub struct Call {
    /// Its name in calls.txt.
    pub id: String,
    /// The expected top-1 intent.
    pub intent: String,
    /// The expected BANT record (empty on a call that is no sale).
    pub bant: Vec<Label>,
    /// The expected NEAT-P record (empty on a call that is no sale).
    pub neat_p: Vec<Label>,
    /// (is the customer, text)
    pub turns: Vec<(bool, String)>,
}

impl Call {
    /// The written dialogue as a transcript of it reads (`Customer: ...` and `Agent: ...`
    /// lines, as the default channel roles label them).
    pub fn written_dialogue(&self) -> String {
        dialogue(
            self.turns.iter().map(|(customer, said)| {
                (if *customer { "Customer" } else { "Agent" }, said.as_str())
            }),
        )
    }
}

/// The expected answer for one BANT or NEAT-P field of a call.
#[derive(Debug, PartialEq)]
pub struct Label {
    /// The field's name in the record.
    pub field: String,
    /// identified, partial or not_found.
    pub status: String,
    /// For a field the call states, the turns (numbered from 1 in the call) that state it:
    /// `need:identified@3` or `access_to_authority:identified@2+4`. Its quote is right when
    /// it is the transcription of one of these.
    pub turns: Vec<usize>,
    /// What the field's summary must name, if the label says (`budget:identified@3=6000`,
    /// `timeline:identified@5=February`): on a call where the customer corrects themselves,
    /// the amount or date they settled on.
    pub names: Option<String>,
}

fn parse_fields(spec: &str) -> anyhow::Result<Vec<Label>> {
    spec.split(',')
        .map(|f| {
            let (field, rest) = f
                .split_once(':')
                .with_context(|| format!("bad field {f:?}"))?;
            let (rest, names) = match rest.split_once('=') {
                Some((rest, names)) => (rest, Some(names.trim().to_owned())),
                None => (rest, None),
            };
            let (status, turns) = rest.split_once('@').unwrap_or((rest, ""));
            let turns = turns
                .split('+')
                .filter(|l| !l.trim().is_empty())
                .map(|l| l.trim().parse::<usize>())
                .collect::<Result<Vec<_>, _>>()
                .with_context(|| format!("bad turn numbers in {f:?}"))?;
            Ok(Label {
                field: field.trim().to_owned(),
                status: status.trim().to_owned(),
                turns,
                names,
            })
        })
        .collect()
}

/// Least share of a quote's words, in order, that must come from a turn for the quote to be
/// that turn's (a transcription misses words; a quote may be part of a turn).
const QUOTE_FROM_TURN: f64 = 0.5;

/// The turn (numbered from 1) a quote comes from: the one holding the largest share of the
/// quote's words in order, if that share is at least [`QUOTE_FROM_TURN`] and no other turn
/// holds as much. Words are compared by their [`stem`]: a transcription often drops a plural's
/// "s" ("our front desk ... incoming call at peak time" for "our front desks ... incoming calls
/// at peak times").
pub fn quoted_turn(quote: &str, turns: &[(bool, String)]) -> Option<usize> {
    let words = stems(quote);
    if words.is_empty() {
        return None;
    }
    let shares: Vec<f64> = turns
        .iter()
        .map(|(_, said)| words_in_order(&stems(said), &words) as f64 / words.len() as f64)
        .collect();
    let best = shares.iter().copied().fold(0.0, f64::max);
    let mut at = shares.iter().enumerate().filter(|(_, s)| **s == best);
    match (at.next(), at.next()) {
        (Some((i, _)), None) if best >= QUOTE_FROM_TURN => Some(i + 1),
        _ => None,
    }
}

/// A labelled call's turns as a transcript of its recording reads them: every word of the
/// transcript with the turn (numbered from 1) it is the transcription of. The speech engine
/// garbles words ("dogs get no more books" for "jobs get double booked"), joins two turns in
/// one line and splits one in two, so a garbled quote may share too few words with any turn
/// to be placed by [`quoted_turn`]; its place in the transcript still tells the turn. The
/// transcript's sentences are placed in the turns in order, never before the sentence before
/// it, so that the sum of the shares of their words found in their turns (in order, by
/// [`stem`]) is the largest.
pub struct Placed<'a> {
    turns: &'a [(bool, String)],
    /// The transcript's words, normalised and stemmed, each with its turn.
    words: Vec<(String, usize)>,
}

impl<'a> Placed<'a> {
    /// Places the sentences of `transcript` (`Speaker: text` lines) in `turns`.
    pub fn new(transcript: &str, turns: &'a [(bool, String)]) -> Placed<'a> {
        // Each sentence's words, and whether its speaker is the customer, if the line says.
        let sentences: Vec<(Vec<String>, Option<bool>)> = transcript
            .lines()
            .flat_map(|line| {
                let (customer, said) = match line.split_once(": ") {
                    Some((who, said)) if !who.contains(['.', '?', '!']) => {
                        (speaker_is_customer(who), said)
                    }
                    _ => (None, line),
                };
                sentences(said)
                    .into_iter()
                    .map(move |s| (stems(s), customer))
            })
            .filter(|(s, _)| !s.is_empty())
            .collect();
        let turn_words: Vec<Vec<String>> = turns.iter().map(|(_, t)| stems(t)).collect();
        let share = |(s, customer): &(Vec<String>, Option<bool>), t: usize| {
            let words = words_in_order(&turn_words[t], s) as f64 / s.len() as f64;
            words
                + if *customer == Some(turns[t].0) {
                    SAME_SPEAKER
                } else {
                    0.0
                }
        };
        let m = turns.len();
        let mut placed = vec![0; sentences.len()];
        if m > 0 && !sentences.is_empty() {
            // best[i][j]: the largest sum of shares of sentences 0..=i with sentence i in turn
            // j; from[i][j]: the turn of sentence i - 1 on that placement.
            let mut best = vec![vec![0.0f64; m]; sentences.len()];
            let mut from = vec![vec![0usize; m]; sentences.len()];
            for (i, sentence) in sentences.iter().enumerate() {
                // The best placement of the sentences before, with the last in turn j or
                // before (the earlier turn of equals).
                let (mut top, mut at) = (f64::NEG_INFINITY, 0);
                for j in 0..m {
                    let before = if i == 0 { 0.0 } else { best[i - 1][j] };
                    if before > top {
                        (top, at) = (before, j);
                    }
                    best[i][j] = top + share(sentence, j);
                    from[i][j] = at;
                }
            }
            let last = sentences.len() - 1;
            let mut j = (0..m).fold(0, |b, j| if best[last][j] > best[last][b] { j } else { b });
            for i in (0..sentences.len()).rev() {
                placed[i] = j;
                j = from[i][j];
            }
        }
        let words = sentences
            .into_iter()
            .zip(placed)
            .flat_map(|((s, _), t)| s.into_iter().map(move |w| (w, t + 1)))
            .collect();
        Placed { turns, words }
    }

    /// The turn `quote` comes from: where its words stand in the transcript, the turn most of
    /// them were placed in (the earlier of equals); a quote not in the transcript word for word,
    /// by [`quoted_turn`].
    pub fn turn_of(&self, quote: &str) -> Option<usize> {
        let wanted = stems(quote);
        if wanted.is_empty() || wanted.len() > self.words.len() {
            return quoted_turn(quote, self.turns);
        }
        let found = self
            .words
            .windows(wanted.len())
            .find(|w| w.iter().map(|(s, _)| s).eq(wanted.iter()));
        let Some(found) = found else {
            return quoted_turn(quote, self.turns);
        };
        let mut counts: Vec<(usize, usize)> = Vec::new();
        for (_, t) in found {
            match counts.iter_mut().find(|(turn, _)| turn == t) {
                Some((_, n)) => *n += 1,
                None => counts.push((*t, 1)),
            }
        }
        counts
            .iter()
            .fold(None, |b: Option<(usize, usize)>, &(t, n)| match b {
                Some((_, most)) if most >= n => b,
                _ => Some((t, n)),
            })
            .map(|(t, _)| t)
    }
}

/// What a sentence gains towards a turn whose speaker its line names (`Customer` or `Agent`,
/// as the default channel roles label them): little, only enough to choose between turns that
/// share as much of it, as a greeting or a word the seller repeats does.
const SAME_SPEAKER: f64 = 0.05;

/// Whether a transcript's speaker label is the customer's, if it is one the default channel
/// roles give.
fn speaker_is_customer(who: &str) -> Option<bool> {
    match who.trim() {
        "Customer" => Some(true),
        "Agent" => Some(false),
        _ => None,
    }
}

/// The normalised words of `text`, each by its [`stem`].
fn stems(text: &str) -> Vec<String> {
    normalise(text).iter().map(|w| stem(w)).collect()
}

/// A normalised word without the "s" or "es" of a plural or a verb's third person: "desks",
/// "desk" and "times", "time" compare equal. Words of three letters or fewer and words in "ss"
/// ("business", "boss") stay whole.
fn stem(word: &str) -> String {
    if word.len() <= 3 || word.ends_with("ss") {
        return word.to_owned();
    }
    let Some(single) = word.strip_suffix('s') else {
        return word.to_owned();
    };
    single
        .strip_suffix('e')
        .filter(|w| w.ends_with("ch") || w.ends_with("sh") || w.ends_with('x'))
        .unwrap_or(single)
        .to_owned()
}

/// Whether the evidence of a field identified by the analysis supports its claim, on a call
/// whose labels say which turns state the field (`turns`) and which state only other fields
/// (`others`): a quote comes from one of the field's turns (as the transcript the analysis
/// read is `said`), none comes from another field's only, and the quotes bear out every figure
/// the summary claims (amounts of money, other amounts of 100 or more, months;
/// [`bears_out`]). Else, why not.
pub fn supports_claim(
    summary: &str,
    evidence: &[String],
    turns: &[usize],
    others: &[usize],
    said: &Placed,
) -> Result<(), String> {
    let from: Vec<Option<usize>> = evidence.iter().map(|q| said.turn_of(q)).collect();
    if !from.iter().flatten().any(|t| turns.contains(t)) {
        return Err(format!(
            "no quote from turn {turns:?}, quotes from {from:?}"
        ));
    }
    if let Some(t) = from.iter().flatten().find(|t| others.contains(t)) {
        return Err(format!("a quote from turn {t}, which states another field"));
    }
    if !bears_out(summary, evidence) {
        return Err("the quotes do not name the summary's figures".into());
    }
    Ok(())
}

/// Whether `summary` names `wanted`: a number (the same amount, however written) or a word.
pub fn names_it(summary: &str, wanted: &str) -> bool {
    match wanted.parse::<f64>() {
        Ok(n) => figures(summary).iter().any(|f| match f {
            Figure::Money(v) | Figure::Number(v) => (v - n).abs() <= 0.005 * n.abs(),
            Figure::Month(_) => false,
        }),
        Err(_) => normalise(summary).contains(&wanted.to_lowercase()),
    }
}

/// The calls of a set's `calls.txt`, in order (call N is recorded in `call-NN.flac`).
pub fn read_calls(path: &Path) -> anyhow::Result<Vec<Call>> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    let mut calls: Vec<Call> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if let Some(header) = line.strip_prefix("## ") {
            let mut parts = header.split('|').map(str::trim);
            let mut call = Call {
                id: parts.next().unwrap_or_default().to_owned(),
                intent: String::new(),
                bant: Vec::new(),
                neat_p: Vec::new(),
                turns: Vec::new(),
            };
            for part in parts {
                match part.split_once('=') {
                    Some(("intent", v)) => call.intent = v.to_owned(),
                    Some(("bant", v)) => call.bant = parse_fields(v)?,
                    Some(("neat_p", v)) => call.neat_p = parse_fields(v)?,
                    _ => anyhow::bail!("line {}: unknown label {part:?}", n + 1),
                }
            }
            anyhow::ensure!(!call.intent.is_empty(), "line {}: no intent", n + 1);
            calls.push(call);
        } else if let Some((who, said)) = line
            .split_once(": ")
            .filter(|(w, _)| *w == "C" || *w == "A")
        {
            let call = calls
                .last_mut()
                .with_context(|| format!("line {}: a turn before any call", n + 1))?;
            call.turns.push((who == "C", said.trim().to_owned()));
        }
    }
    Ok(calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quote_is_placed_in_the_turn_it_comes_from() {
        let turns: Vec<(bool, String)> = [
            "Thanks for calling, how can I help?",
            "Our shift planning is done in spreadsheets and we lose about twenty thousand dollars a month.",
            "We've approved forty thousand dollars for this project.",
            "Okay, thanks.",
            "Okay, thanks.",
        ]
        .iter()
        .map(|t| (true, (*t).to_owned()))
        .collect();
        // Verbatim, a part, and a transcription with misheard words and digits.
        assert_eq!(
            quoted_turn(
                "We've approved forty thousand dollars for this project.",
                &turns
            ),
            Some(3)
        );
        assert_eq!(
            quoted_turn("we lose about twenty thousand dollars", &turns),
            Some(2)
        );
        assert_eq!(
            quoted_turn(
                "Our ship's planning is not in French and we lose about $20,000 a month.",
                &turns
            ),
            Some(2)
        );
        // A transcription that drops plurals' endings.
        let garbled: Vec<(bool, String)> = [
            "Thanks for calling Orbit Telecom business sales.",
            "Our front desks miss about a third of incoming calls at peak times, and those are lost memberships.",
        ]
        .iter()
        .map(|t| (true, (*t).to_owned()))
        .collect();
        assert_eq!(
            quoted_turn(
                "Our front desk is a microphone on incoming call at peak time, and no one lost membership.",
                &garbled
            ),
            Some(2)
        );
        // Nothing like any turn, or as like two turns: from none.
        assert_eq!(quoted_turn("The board meets in June.", &turns), None);
        assert_eq!(quoted_turn("Okay, thanks.", &turns), None);
        assert_eq!(quoted_turn("", &turns), None);
    }

    /// A transcript that garbles words, joins two turns in one line and splits one in two:
    /// each quote is placed by where it stands in the transcript.
    #[test]
    fn a_garbled_quote_is_placed_by_where_it_stands_in_the_transcript() {
        let turns: Vec<(bool, String)> = [
            (false, "Thank you for calling Fieldline, the field service app."),
            (true, "Hi, we have twenty engineers visiting customers, and jobs get double booked because the office plans them on a whiteboard."),
            (true, "Double bookings cost us about three thousand dollars a month in wasted visits."),
            (false, "Our scheduler stops double bookings. When would you want to start?"),
            (true, "We want it by March, no, wait, by the end of February, before our busy season."),
            (true, "I'd need to talk to my partners before signing, though."),
        ]
        .iter()
        .map(|(c, t)| (*c, (*t).to_owned()))
        .collect();
        let transcript = "Agent: Thank you for calling Field Line and the Field Permissar.\n\
            Customer: Hi, we have 20 engineers living in customers and dogs get no more books because they don't have this plan anymore. No more looking cars cut about $3,000 a month in waste and with it.\n\
            Agent: I will share your restocked double working.\n\
            Agent: When will you want to start? When will you want to start?\n\
            Customer: We want it by March, no, wait, by the end of February before our living even.\n\
            Customer: I need to talk to my partners before tidings, no.";
        let placed = Placed::new(transcript, &turns);
        let engineers = "Hi, we have 20 engineers living in customers and dogs get no more books because they don't have this plan anymore.";
        let waste = "No more looking cars cut about $3,000 a month in waste and with it.";
        // Too garbled for the words alone.
        assert_eq!(quoted_turn(engineers, &turns), None);
        assert_eq!(placed.turn_of(engineers), Some(2));
        assert_eq!(placed.turn_of(waste), Some(3));
        assert_eq!(
            placed.turn_of("I will share your restocked double working."),
            Some(4)
        );
        assert_eq!(placed.turn_of("When will you want to start?"), Some(4));
        assert_eq!(placed.turn_of("by the end of February"), Some(5));
        assert_eq!(
            placed.turn_of("I need to talk to my partners before tidings, no."),
            Some(6)
        );
        // Across two sentences: the turn of most of its words.
        assert_eq!(
            placed.turn_of("this plan anymore. No more looking cars cut about $3,000 a month"),
            Some(3)
        );
        // Not in the transcript: by its words.
        assert_eq!(
            placed.turn_of("Double bookings cost us about three thousand dollars a month."),
            Some(3)
        );
        assert_eq!(placed.turn_of("The board meets in June."), None);
        assert_eq!(
            Placed::new("", &turns).turn_of("Hi, we have twenty engineers"),
            Some(2)
        );
    }

    #[test]
    fn plurals_and_third_persons_are_stemmed_and_short_words_kept() {
        for (word, stemmed) in [
            ("desks", "desk"),
            ("times", "time"),
            ("memberships", "membership"),
            ("matches", "match"),
            ("boxes", "box"),
            ("business", "business"),
            ("boss", "boss"),
            ("was", "was"),
            ("its", "its"),
            ("dollars", "dollar"),
            ("niche", "niche"),
        ] {
            assert_eq!(stem(word), stemmed, "{word}");
        }
    }

    #[test]
    fn evidence_supports_a_claim_from_its_own_turns_with_its_figures() {
        let said: Vec<(bool, String)> = [
            "I'm the finance manager, and I sign off purchases up to twenty five thousand pounds.",
            "Our budget for a payroll system is eight thousand, no, sorry, six thousand pounds a year.",
            "Payroll is done by hand in spreadsheets.",
        ]
        .iter()
        .map(|t| (true, (*t).to_owned()))
        .collect();
        let written: String = said
            .iter()
            .map(|(_, t)| format!("Customer: {t}\n"))
            .collect();
        let placed = Placed::new(&written, &said);
        let q = |i: usize| vec![said[i].1.clone()];
        let budget = "A budget of 6,000 pounds a year.";
        assert_eq!(
            supports_claim(budget, &q(1), &[2], &[1, 3], &placed),
            Ok(())
        );
        // The authority's sentence under the budget: from another field's turn, and it names
        // another amount.
        assert!(supports_claim(budget, &q(0), &[2], &[1, 3], &placed).is_err());
        // From the right turn, but the summary's figure is not in it.
        assert!(
            supports_claim("A budget of 9,000 pounds.", &q(1), &[2], &[1, 3], &placed).is_err()
        );
        // No quote.
        assert!(supports_claim(budget, &[], &[2], &[1, 3], &placed).is_err());
        // The settled figure, against the one taken back.
        assert!(names_it(budget, "6000"));
        assert!(!names_it("A budget of 8,000 pounds a year.", "6000"));
        assert!(names_it("By the end of February.", "February"));
        assert!(!names_it("By March.", "February"));
    }

    #[test]
    fn labels_name_the_turns_that_state_a_field() {
        let labels =
            parse_fields("need:identified@3, access_to_authority:identified@2+4,timeline:partial")
                .unwrap();
        assert_eq!(labels[0].turns, [3]);
        assert_eq!(labels[1].field, "access_to_authority");
        assert_eq!(labels[1].turns, [2, 4]);
        assert_eq!(labels[2].status, "partial");
        assert!(labels[2].turns.is_empty());
        let named =
            parse_fields("budget:identified@3=6000,timeline:identified@5=February").unwrap();
        assert_eq!(named[0].turns, [3]);
        assert_eq!(named[0].names.as_deref(), Some("6000"));
        assert_eq!(named[1].names.as_deref(), Some("February"));
        assert_eq!(labels[0].names, None);
        assert!(parse_fields("need:identified@three").is_err());
        assert!(parse_fields("need").is_err());
    }
}
