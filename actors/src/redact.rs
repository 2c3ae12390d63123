//! Redaction of personal data in transcripts: card numbers (digit runs of 13 to 19 digits
//! that pass the Luhn check), US social security numbers, e-mail addresses and phone numbers,
//! each replaced by a tag (`[card]`, `[ssn]`, `[email]`, `[phone]`).
//!
//! Speech engines write numbers as they hear them: as numerals grouped any way
//! (`4111 1111 1111 1111`, `4111-1111-...`, `4111, 1111, ...`), or as spoken digits
//! (`four one one one ...`, `oh` for zero). The text is read as whitespace-separated pieces; a
//! run of pieces that are numerals or digit words is one number, whatever its grouping, and
//! the first and longest match from each position wins, cards first.
//!
//! - card: 13 to 19 digits passing the Luhn check; or 12 to 20 digits said within six words
//!   after a card word (`card`, `credit`, `debit`, `visa`, ...), since a speech engine may add
//!   or drop a digit of a long run, which the check then fails;
//! - ssn: 9 digits written 3-2-4 (`123-45-6789`, `123 45 6789`), or 9 digits said after
//!   "social security" or "SSN";
//! - phone: 10 digits, 11 starting with 1, 11 to 15 after a `+`, or 7 written 3-4;
//! - email: `name@domain.tld`, or said: `name at domain dot com` (`dot` and `underscore`
//!   join the parts, `.` may be written).
//!
//! A transcript's words follow its text: the words a match covers become one word holding the
//! tag, timed from the first word's start to the last one's end.

use crate::asr::{Transcript, Word};

/// What a match is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A payment card number.
    Card,
    /// A US social security number.
    Ssn,
    /// An e-mail address.
    Email,
    /// A phone number.
    Phone,
}

impl Kind {
    /// The tag that replaces it.
    pub fn tag(self) -> &'static str {
        match self {
            Kind::Card => "[card]",
            Kind::Ssn => "[ssn]",
            Kind::Email => "[email]",
            Kind::Phone => "[phone]",
        }
    }
}

/// Punctuation that may close a piece without ending a number or an address.
fn trailing(c: char) -> bool {
    matches!(c, ',' | '.' | ';' | ':' | '!' | '?' | '"' | '\'' | ')')
}

fn leading(c: char) -> bool {
    matches!(c, '"' | '\'' | '(')
}

/// The core of a piece: without its leading quotes and trailing punctuation.
fn core(piece: &str) -> (usize, &str) {
    let start = piece.len() - piece.trim_start_matches(leading).len();
    let rest = &piece[start..];
    let core = rest.trim_end_matches(trailing);
    (start, core)
}

fn digit_word(w: &str) -> Option<char> {
    Some(match w.to_ascii_lowercase().as_str() {
        "zero" | "oh" | "o" => '0',
        "one" => '1',
        "two" => '2',
        "three" => '3',
        "four" | "for" => '4',
        "five" => '5',
        "six" => '6',
        "seven" => '7',
        "eight" => '8',
        "nine" => '9',
        _ => return None,
    })
}

/// A piece read as part of a number: its digits, the sizes of its digit groups, whether it
/// was spoken, whether it starts with `+`.
#[derive(Debug, Clone, Default)]
struct Num {
    digits: String,
    groups: Vec<usize>,
    spoken: bool,
    plus: bool,
}

fn number(core: &str) -> Option<Num> {
    if core.is_empty() {
        return None;
    }
    if core
        .chars()
        .all(|c| c.is_ascii_digit() || matches!(c, '-' | '.' | '(' | ')' | '+' | '/'))
    {
        let mut num = Num {
            plus: core.starts_with('+'),
            ..Num::default()
        };
        let mut run = 0;
        for c in core.chars() {
            if c.is_ascii_digit() {
                num.digits.push(c);
                run += 1;
            } else if run > 0 {
                num.groups.push(run);
                run = 0;
            }
        }
        if run > 0 {
            num.groups.push(run);
        }
        return (!num.digits.is_empty()).then_some(num);
    }
    // Spoken digits, alone or hyphenated ("four-one-one-one").
    let mut digits = String::new();
    for part in core.split('-') {
        digits.push(digit_word(part)?);
    }
    Some(Num {
        groups: vec![digits.len()],
        digits,
        spoken: true,
        plus: false,
    })
}

fn luhn(digits: &str) -> bool {
    let mut sum = 0;
    for (i, c) in digits.bytes().rev().enumerate() {
        let mut d = u32::from(c - b'0');
        if i % 2 == 1 {
            d *= 2;
            if d > 9 {
                d -= 9;
            }
        }
        sum += d;
    }
    sum % 10 == 0
}

const TLDS: &[&str] = &[
    "com", "net", "org", "edu", "gov", "io", "co", "uk", "de", "us", "info", "biz", "ca", "fr",
    "es", "it", "nl", "au", "me", "ai", "app", "dev",
];

fn is_word(core: &str) -> bool {
    !core.is_empty()
        && core
            .chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '.' | '_' | '-' | '+'))
}

/// A written domain: `example.com`.
fn written_domain(core: &str) -> bool {
    let Some((name, tld)) = core.rsplit_once('.') else {
        return false;
    };
    !name.is_empty() && is_word(name) && TLDS.contains(&tld.to_ascii_lowercase().as_str())
}

/// Finds what to redact in `pieces` (the cores of whitespace-separated pieces): spans of
/// pieces, inclusive, in order, not overlapping.
fn find(cores: &[&str]) -> Vec<(usize, usize, Kind)> {
    let nums: Vec<Option<Num>> = cores.iter().map(|c| number(c)).collect();
    let lower: Vec<String> = cores.iter().map(|c| c.to_ascii_lowercase()).collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < cores.len() {
        if let Some(end) = email_at(cores, &lower, i) {
            found.push((i, end, Kind::Email));
            i = end + 1;
            continue;
        }
        if nums[i].is_some() {
            if let Some((end, kind)) = number_at(&nums, &lower, i) {
                found.push((i, end, kind));
                i = end + 1;
                continue;
            }
        }
        i += 1;
    }
    found
}

/// An e-mail address starting at piece `i`: its last piece.
fn email_at(cores: &[&str], lower: &[String], i: usize) -> Option<usize> {
    let c = cores[i];
    if let Some((local, domain)) = c.split_once('@') {
        if !local.is_empty() && (written_domain(domain) || domain.contains('.')) {
            return Some(i);
        }
    }
    // Said: local ("dot"|"underscore" part)* "at" domain ("dot" part)+ | written domain.
    if !is_word(c) {
        return None;
    }
    let mut j = i;
    while j + 2 < cores.len()
        && matches!(lower[j + 1].as_str(), "dot" | "underscore")
        && is_word(cores[j + 2])
    {
        j += 2;
    }
    if j + 2 >= cores.len() || lower[j + 1] != "at" {
        return None;
    }
    let d = j + 2;
    if written_domain(cores[d]) {
        return Some(d);
    }
    let mut end = None;
    let mut k = d;
    while is_word(cores[k]) && k + 2 < cores.len() && lower[k + 1] == "dot" && is_word(cores[k + 2])
    {
        k += 2;
        if TLDS.contains(&lower[k].as_str()) {
            end = Some(k);
        }
    }
    // The local part must be a name, not a sentence's word before "at" ("look at example
    // dot com" has no local part the speaker meant): one word or dotted words.
    end.filter(|_| {
        !matches!(
            lower[i].as_str(),
            "look" | "me" | "us" | "him" | "her" | "them"
        )
    })
}

/// Words that say a card number follows.
const CARD_WORDS: &[&str] = &[
    "card",
    "cards",
    "credit",
    "debit",
    "visa",
    "mastercard",
    "amex",
    "express",
    "discover",
];

/// How many pieces before a number a card word is looked for.
const CARD_CONTEXT: usize = 6;

/// A number starting at piece `i`: its last piece and kind.
fn number_at(nums: &[Option<Num>], lower: &[String], i: usize) -> Option<(usize, Kind)> {
    // The pieces of the run from i.
    let mut run: Vec<&Num> = Vec::new();
    for n in &nums[i..] {
        match n {
            Some(n) => run.push(n),
            None => break,
        }
    }
    let mut digits = String::new();
    let mut groups = Vec::new();
    let mut spans: Vec<(usize, String, Vec<usize>)> = Vec::new();
    for (k, n) in run.iter().enumerate() {
        digits.push_str(&n.digits);
        groups.extend_from_slice(&n.groups);
        spans.push((i + k, digits.clone(), groups.clone()));
    }
    // Cards: the longest span from i of 13 to 19 digits passing Luhn.
    if let Some((end, _, _)) = spans
        .iter()
        .rev()
        .find(|(_, d, _)| (13..=19).contains(&d.len()) && luhn(d))
    {
        return Some((*end, Kind::Card));
    }
    // A long number said just after a card word is the card, even when the speech engine
    // added or dropped a digit (the check then fails).
    let said_card = lower[i.saturating_sub(CARD_CONTEXT)..i]
        .iter()
        .any(|w| CARD_WORDS.contains(&w.as_str()));
    if said_card {
        if let Some((end, _, _)) = spans
            .iter()
            .rev()
            .find(|(_, d, _)| (12..=20).contains(&d.len()))
        {
            return Some((*end, Kind::Card));
        }
    }
    let spoken = run.iter().take(9).all(|n| n.spoken);
    let said_ssn = lower[i.saturating_sub(8)..i]
        .iter()
        .any(|w| matches!(w.as_str(), "ssn" | "security" | "social"));
    for (end, d, g) in &spans {
        if d.len() == 9 && (g.as_slice() == [3, 2, 4] || (spoken && said_ssn)) {
            return Some((*end, Kind::Ssn));
        }
    }
    let plus = run[0].plus;
    for (end, d, g) in spans.iter().rev() {
        let phone = match d.len() {
            10 => true,
            11 => d.starts_with('1') || plus,
            12..=15 => plus,
            7 => g.as_slice() == [3, 4],
            _ => false,
        };
        if phone {
            return Some((*end, Kind::Phone));
        }
    }
    None
}

/// The pieces of `text`: byte range of each whitespace-separated piece, and of its core.
fn pieces(text: &str) -> Vec<(usize, usize, usize, usize)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in text
        .char_indices()
        .chain(std::iter::once((text.len(), ' ')))
    {
        match (c.is_whitespace(), start) {
            (true, Some(s)) => {
                let piece = &text[s..i];
                let (lead, core) = core(piece);
                out.push((s, i, s + lead, s + lead + core.len()));
                start = None;
            }
            (false, None) => start = Some(i),
            _ => {}
        }
    }
    out
}

/// `text` with its personal data replaced by tags; the kinds found, in order.
pub fn redact_text(text: &str) -> (String, Vec<Kind>) {
    let ps = pieces(text);
    let cores: Vec<&str> = ps.iter().map(|&(_, _, a, b)| &text[a..b]).collect();
    let found = find(&cores);
    if found.is_empty() {
        return (text.to_owned(), Vec::new());
    }
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for &(first, last, kind) in &found {
        // A phone's area code may be bracketed, `(555) 123-4567`: the bracket goes with it.
        let start = if kind == Kind::Phone && text[ps[first].0..ps[first].2].ends_with('(') {
            ps[first].0
        } else {
            ps[first].2
        };
        out.push_str(&text[at..start]);
        out.push_str(kind.tag());
        at = ps[last].3;
    }
    out.push_str(&text[at..]);
    (out, found.into_iter().map(|f| f.2).collect())
}

/// `words` with the ones that hold personal data merged into one word per match, holding the
/// tag.
pub fn redact_words(words: &[Word]) -> Vec<Word> {
    // Each word's pieces, and which word each piece belongs to.
    let mut cores = Vec::new();
    let mut owner = Vec::new();
    for (w, word) in words.iter().enumerate() {
        for (_, _, a, b) in pieces(&word.text) {
            cores.push(&word.text[a..b]);
            owner.push(w);
        }
    }
    let found = find(&cores);
    if found.is_empty() {
        return words.to_vec();
    }
    let mut out = Vec::with_capacity(words.len());
    let mut w = 0;
    for &(first, last, kind) in &found {
        let (a, b) = (owner[first], owner[last]);
        if a < w {
            continue;
        }
        out.extend_from_slice(&words[w..a]);
        let tail: String = words[b]
            .text
            .trim_end()
            .chars()
            .rev()
            .take_while(|c| trailing(*c))
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        out.push(Word {
            text: format!("{}{tail}", kind.tag()),
            start: words[a].start,
            end: words[b].end,
            probability: words[a..=b]
                .iter()
                .map(|w| w.probability)
                .fold(1.0, f32::min),
        });
        w = b + 1;
    }
    out.extend_from_slice(&words[w..]);
    out
}

/// Redacts a transcript's text and words.
pub fn redact_transcript(t: &mut Transcript) {
    let (text, found) = redact_text(&t.text);
    if !found.is_empty() {
        t.text = text;
        t.words = redact_words(&t.words);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(text: &str) -> String {
        redact_text(text).0
    }

    #[test]
    fn card_numbers_are_found_however_they_are_written() {
        for said in [
            "my card is 4111 1111 1111 1111 thanks",
            "my card is 4111-1111-1111-1111 thanks",
            "my card is 4111111111111111 thanks",
            "my card is 4111, 1111, 1111, 1111 thanks",
            "my card is four one one one one one one one one one one one one one one one thanks",
            "my card is 4 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 thanks",
        ] {
            assert_eq!(r(said), "my card is [card] thanks", "{said}");
        }
        // An amex (15 digits) with its punctuation kept.
        assert_eq!(r("It's 3782 822463 10005."), "It's [card].");
        // Not Luhn: left as it is (it is no card number).
        assert_eq!(r("order 4111 1111 1111 1112"), "order 4111 1111 1111 1112");
        // Unless said as a card: a digit too many or too few (as heard) is still the card.
        assert_eq!(
            r("My card number is 41111111111111111 The"),
            "My card number is [card] The"
        );
        assert_eq!(r("the visa is 4111 1111 1111 111."), "the visa is [card].");
        // A card word far before, or a short number after one, is not enough.
        assert_eq!(
            r("card declined so I read the order number to her 4111 1111 1111 1112"),
            "card declined so I read the order number to her 4111 1111 1111 1112"
        );
        assert_eq!(r("the card ending 1234"), "the card ending 1234");
        // Followed by the expiry: the card alone goes.
        assert_eq!(
            r("number 4111 1111 1111 1111 expires 12 26"),
            "number [card] expires 12 26"
        );
    }

    #[test]
    fn ssns_phones_and_emails_are_found() {
        assert_eq!(r("SSN is 123-45-6789."), "SSN is [ssn].");
        assert_eq!(r("it's 123 45 6789"), "it's [ssn]");
        assert_eq!(
            r("my social security number is one two three four five six seven eight nine"),
            "my social security number is [ssn]"
        );
        assert_eq!(
            r("call me on 555-123-4567 please"),
            "call me on [phone] please"
        );
        assert_eq!(r("call (555) 123-4567"), "call [phone]");
        assert_eq!(r("+44 20 7946 0958"), "[phone]");
        assert_eq!(r("it's 1 800 555 0199"), "it's [phone]");
        assert_eq!(
            r("five five five one two three four five six seven"),
            "[phone]"
        );
        assert_eq!(r("mail jane.doe@example.com now"), "mail [email] now");
        assert_eq!(
            r("it is jane dot doe at example dot com, thanks"),
            "it is [email], thanks"
        );
        assert_eq!(r("it's jane at example.com"), "it's [email]");
    }

    #[test]
    fn ordinary_numbers_and_words_are_left_alone() {
        for text in [
            "we spent 50,000 dollars in 2024",
            "I have 2 kids and 3 cars",
            "order number 4471 arrived on the 12th",
            "look at the screen",
            "meet at nine",
            "one of them said two things",
            "",
        ] {
            assert_eq!(r(text), text);
        }
    }

    #[test]
    fn words_follow_the_text() {
        let word = |t: &str, s: f64| Word {
            text: t.to_owned(),
            start: s,
            end: s + 0.4,
            probability: 0.9,
        };
        let words: Vec<Word> = ["It", "is", "four", "one", "one", "one"]
            .iter()
            .chain(["one"; 11].iter())
            .chain(["one.", "Thanks"].iter())
            .enumerate()
            .map(|(i, t)| word(t, i as f64 * 0.5))
            .collect();
        let out = redact_words(&words);
        let texts: Vec<&str> = out.iter().map(|w| w.text.as_str()).collect();
        assert_eq!(texts, ["It", "is", "[card].", "Thanks"]);
        assert_eq!(out[2].start, 1.0);
        assert_eq!(out[2].end, words[17].end);
    }
}
