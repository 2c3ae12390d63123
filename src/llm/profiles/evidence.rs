//! Evidence quotes: what an answer may quote of a transcript, and each quote looked up in it
//! (those whose words were not said there dropped, a status left without evidence stepping
//! down).
use std::collections::HashSet;
use std::sync::OnceLock;

use callstream_actors::asr::wer;
use callstream_actors::transcript::{CLOSERS, SENTENCE_ENDS};
use serde_json::Value;

use super::record::{Record, Status};
use super::*;

/// Fewest words a summary must keep, in order, from a worked example's summary to count as
/// a copy of it (all of them when the example's is shorter).
pub(super) const COPIED_WORDS: usize = 4;

/// Least share of a summary's own words that, kept in order from a worked example's summary,
/// make it a copy of that summary.
pub(super) const COPIED_SHARE: f32 = 0.6;

/// The fields of a BANT or NEAT-P record whose summary copies the summary of a field in one
/// of the worked examples (of any profile: the files layout shows them all): most of its
/// words are that summary's, in the same order, with case, punctuation and the spelling of
/// numbers aside. A small model copies an example's summary instead of reading the call,
/// whole or with a word or two of the call put in: the 0.5B model wrote NEAT-P's "After the
/// summer at the earliest, nothing fixed." as the timeline of calls that named no time at
/// all, and "After the fourth clinic, nothing fixed." (4 of its 6 words) on a call that had
/// none; it then backs the copy with whatever sentence is nearest. A summary that only shares
/// the example's frame ("About 40 thousand dollars is set aside for this project.", 5 of 10
/// words) is the model's own.
pub(super) fn summarised_as_an_example(record: &Record) -> Vec<&'static str> {
    static EXAMPLES: OnceLock<Vec<Vec<String>>> = OnceLock::new();
    let examples = EXAMPLES.get_or_init(|| {
        ProfileKind::ALL
            .iter()
            .flat_map(|kind| &profile(*kind).examples)
            .flat_map(|e| e.answer.criteria())
            .map(|(_, criterion)| wer::normalise(&criterion.summary))
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
        .criteria()
        .into_iter()
        .filter(|(_, criterion)| copies(&criterion.summary))
        .map(|(name, _)| name)
        .collect()
}

/// The buyer's sentences of `transcript` that a BANT or NEAT-P answer may quote (see
/// [`quotable`]).
pub fn buyer_sentences(transcript: &str, seller: Option<&str>) -> Vec<String> {
    quotable(transcript, seller).0
}

/// Longest evidence quote the schemas allow (`maxLength` of an evidence item).
pub(super) const QUOTE_CHARS: usize = 160;

/// What a BANT or NEAT-P answer may quote of `transcript` (its lines read `Speaker: text`): each
/// sentence said by the buyer (anyone but the `seller`), and each sentence said by anyone, as the
/// transcript has them (one that takes back a figure of the sentence before joined to it, see
/// [`with_corrections`]); a sentence longer than a quote is cut at its commas (or, failing that,
/// between words). A model that quotes from memory changes words, joins lines or quotes the agent;
/// held to these, it copies what was said.
pub(super) fn quotable(transcript: &str, seller: Option<&str>) -> (Vec<String>, Vec<String>) {
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
        for sentence in with_corrections(text) {
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
pub(super) fn said_by(line: &str, seller: Option<&str>) -> bool {
    seller
        .is_some_and(|seller| speaker_of(line).is_some_and(|who| who.eq_ignore_ascii_case(seller)))
}

/// The sentences of `text`: each ends after a mark of [`SENTENCE_ENDS`] (with the
/// [`CLOSERS`] after it) that white space follows, trimmed.
pub fn sentences(text: &str) -> Vec<&str> {
    cut_after(text, &SENTENCE_ENDS)
}

/// The [`sentences`] of `text`, each that takes back a figure of the one before it joined to
/// it: "Our budgets are a payroll system in 8,000. No, sorry, 6,000 pounds per year." Apart,
/// one names a figure the speaker withdrew and the other an amount without what it is for,
/// and neither says what the buyer settled on.
pub(super) fn with_corrections(text: &str) -> Vec<&str> {
    let at = |s: &str| s.as_ptr() as usize - text.as_ptr() as usize;
    let mut out: Vec<&str> = Vec::new();
    for sentence in sentences(text) {
        if let Some(last) = out.last_mut() {
            let from = at(last);
            let joined = &text[from..at(sentence) + sentence.len()];
            if claims::taken_back_across(joined, at(sentence) - from) {
                *last = joined;
                continue;
            }
        }
        out.push(sentence);
    }
    out
}

/// `text` cut after each run of `marks` (with the [`CLOSERS`] after it) that white space
/// follows, in trimmed pieces ("2,000" is not cut at its comma).
pub(super) fn cut_after<'a>(text: &'a str, marks: &[char]) -> Vec<&'a str> {
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
pub(super) fn cut_to(text: &str, max: usize) -> Vec<&str> {
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
pub(super) fn quoting(schema: &Value, buyer: &[String], said: &[String]) -> Value {
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
    for field in object_mut(&mut schema, "properties")
        .into_iter()
        .flat_map(|fields| fields.values_mut())
    {
        if field.pointer("/properties/evidence").is_none() {
            continue;
        }
        let branches: Vec<Value> = Status::ALL
            .iter()
            .map(|&status| {
                let mut branch = field.clone();
                if let Some(properties) = object_mut(&mut branch, "properties") {
                    properties.insert(
                        "status".into(),
                        serde_json::json!({"enum": [status.as_str()]}),
                    );
                    let evidence = match status {
                        Status::Identified => quotes(buyer, "buyer"),
                        Status::Partial => quotes(said, "said"),
                        Status::NotFound => quotes(&[], ""),
                    };
                    properties.insert("evidence".into(), evidence);
                }
                branch
            })
            .collect();
        *field = serde_json::json!({"anyOf": branches});
    }
    let mut defs = serde_json::Map::new();
    for (name, list) in [("buyer", buyer), ("said", said)] {
        if !list.is_empty() {
            defs.insert(name.into(), serde_json::json!({"enum": list}));
        }
    }
    if let Some(root) = schema.as_object_mut() {
        root.insert("$defs".into(), Value::Object(defs));
    }
    schema
}

/// The words of `s`: where each starts and ends, and its letters and digits in lower case.
/// Words without letters or digits (a lone dash) are left out.
pub(super) fn words(s: &str) -> Vec<(usize, usize, String)> {
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
pub(super) fn speaker_of(line: &str) -> Option<&str> {
    line.split_once(": ").map(|(who, _)| who.trim())
}

/// The speaker labels of a transcript whose lines read `Speaker: text`.
pub(super) fn speaker_labels(transcript: &str) -> Vec<String> {
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

pub(super) fn strip_label<'a>(s: &'a str, labels: &[String]) -> &'a str {
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
pub(super) const MAX_QUOTES: usize = 8;

/// A line of what was said and its words (see [`words`]).
pub(super) type SpokenLine<'a> = (&'a str, Vec<(usize, usize, String)>);

/// Where `quote` was said: the same words in the same order within one line of `spoken`
/// (case and punctuation aside), as the transcript has them.
pub(super) fn find_quote<'a>(wanted: &[String], spoken: &[SpokenLine<'a>]) -> Option<&'a str> {
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
pub(super) const ALIGN_MIN_WORDS: usize = 5;
/// Longest quote that is aligned (the alignment costs its length times the transcript's).
pub(super) const ALIGN_MAX_WORDS: usize = 64;

/// Where a quote's words meet a line's: how many match, and the first and last matched word
/// of each (indices into their word lists).
pub(super) struct Alignment {
    pub(super) matched: usize,
    pub(super) quote: (usize, usize),
    pub(super) line: (usize, usize),
}

/// The best local alignment of `quote` in `line` (words as [`words`] keys them). Scores a
/// match +2 and a substitution, insertion or deletion -1 (Smith-Waterman), so the alignment
/// is a compact stretch where most words agree, and one slip between matches does not cut it.
pub(super) fn align_words(quote: &[String], line: &[(usize, usize, String)]) -> Option<Alignment> {
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
pub(super) fn align_quote<'a>(wanted: &[String], spoken: &[SpokenLine<'a>]) -> Option<&'a str> {
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
pub fn verify_evidence(record: &mut Record, transcript: &str, seller: Option<&str>) -> Quotes {
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
    for (_, c) in record.criteria_mut() {
        let mut kept: Vec<String> = Vec::new();
        for quote in c.evidence.iter().take(MAX_QUOTES) {
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
            if !kept.iter().any(|k| k == said) {
                kept.push(said.to_owned());
                if exact {
                    quotes.verbatim += 1;
                } else {
                    quotes.aligned += 1;
                }
            }
        }
        quotes.given += c.evidence.len();
        c.evidence = kept;
        c.status = match c.status {
            Status::Identified if c.evidence.is_empty() => Status::Partial,
            Status::Partial if c.evidence.is_empty() => Status::NotFound,
            other => other,
        };
        if c.status == Status::NotFound {
            c.summary.clear();
            c.evidence.clear();
        }
        if let Some(conf) = c.confidence {
            c.confidence = Some((conf.clamp(0.0, 1.0) * 100.0).round() / 100.0);
        }
    }
    quotes
}
