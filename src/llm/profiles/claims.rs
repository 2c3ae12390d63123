//! Whether a field's evidence bears out what its summary claims. A small model reading a whole
//! call writes a summary from one sentence and quotes another: "20,000 dollars a year is set
//! aside for the tool", backed by the buyer's sentence about signing off purchases up to 50,000
//! dollars. That quote is verbatim and even on a money topic, yet it supports neither the claim
//! nor its figure. So the figures a summary names (amounts of money, other amounts of 100 or
//! more, months) are looked for in its quotes, however they are written: "45,000", "$45k",
//! "forty five thousand", and a monthly figure for a yearly one. This module reads the figures
//! of a text and tells whether a summary's are in its quotes; `check` acts on it.

use callstream_actors::asr::wer::{ONES, TENS};

/// A figure a text names.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Figure {
    /// An amount of money (a currency sign or word next to it).
    Money(f64),
    /// Any other number.
    Number(f64),
    /// A month, 1 to 12 (written with a capital letter: "may" is a verb).
    Month(u8),
}

const ORDINALS: [&str; 21] = [
    "first",
    "second",
    "third",
    "fourth",
    "fifth",
    "sixth",
    "seventh",
    "eighth",
    "ninth",
    "tenth",
    "eleventh",
    "twelfth",
    "thirteenth",
    "fourteenth",
    "fifteenth",
    "sixteenth",
    "seventeenth",
    "eighteenth",
    "nineteenth",
    "twentieth",
    "thirtieth",
];
const MONTHS: [&str; 12] = [
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
];
const CURRENCY_WORDS: [&str; 11] = [
    "dollar", "dollars", "pound", "pounds", "euro", "euros", "bucks", "quid", "usd", "gbp", "eur",
];
const CURRENCY_SIGNS: [char; 4] = ['$', '£', '€', '¥'];

/// Words that join the two ends of a range ("ten to fifteen thousand").
const RANGE_WORDS: [&str; 3] = ["to", "or", "and"];

/// One word of a text, as the figure reader sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Word {
    /// Written in digits, with what its suffix multiplies it by applied; `true` for an
    /// ordinal ("15th").
    Digits(f64, bool),
    Unit(f64),
    Tens(f64),
    Ordinal(f64),
    Hundred,
    Scale(f64),
    /// "a" or "an" (one, before "hundred" or a scale).
    A,
    Month(u8),
    Other,
}

/// A word of `raw` (one piece of the text between spaces and hyphens): what it is, whether
/// a currency sign or word marks it, and whether a mark that ends a clause follows it.
fn read(raw: &str) -> (Word, bool, bool) {
    let ends = raw
        .trim_end_matches(['"', '\'', ')', '”', '’'])
        .ends_with([',', '.', ';', ':', '!', '?']);
    let trimmed = raw.trim_matches(|c: char| !c.is_alphanumeric() && !CURRENCY_SIGNS.contains(&c));
    let signed = trimmed.starts_with(CURRENCY_SIGNS);
    let core = trimmed.trim_start_matches(CURRENCY_SIGNS);
    let lower = core.to_lowercase();
    if lower == "grand" {
        // "40 grand": a thousand, of money.
        return (Word::Scale(1e3), true, ends);
    }
    if CURRENCY_WORDS.contains(&lower.as_str()) {
        return (Word::Other, true, ends);
    }
    if let Some(word) = digits(&lower) {
        return (word, signed, ends);
    }
    let word = if let Some(n) = ONES.iter().position(|w| *w == lower) {
        Word::Unit(n as f64)
    } else if let Some(n) = TENS.iter().position(|w| !w.is_empty() && *w == lower) {
        Word::Tens(10.0 * n as f64)
    } else if let Some(n) = ORDINALS.iter().position(|w| *w == lower) {
        Word::Ordinal(match n {
            19 => 20.0,
            20 => 30.0,
            n => n as f64 + 1.0,
        })
    } else if lower == "hundred" {
        Word::Hundred
    } else if let Some(scale) = scale(&lower) {
        Word::Scale(scale)
    } else if lower == "a" || lower == "an" {
        Word::A
    } else if let Some(m) = MONTHS.iter().position(|w| *w == lower) {
        if core.starts_with(|c: char| c.is_uppercase()) {
            Word::Month(m as u8 + 1)
        } else {
            Word::Other
        }
    } else {
        Word::Other
    };
    (word, signed, ends)
}

fn scale(word: &str) -> Option<f64> {
    match word {
        "thousand" => Some(1e3),
        "million" => Some(1e6),
        "billion" => Some(1e9),
        _ => None,
    }
}

/// A number written in digits: "45,000", "1.5", "20k", "2m", "15th", "12%".
fn digits(word: &str) -> Option<Word> {
    let split = word
        .find(|c: char| !(c.is_ascii_digit() || c == ',' || c == '.'))
        .unwrap_or(word.len());
    let (number, suffix) = word.split_at(split);
    if !number.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    let value: f64 = number.replace(',', "").parse().ok()?;
    let (times, ordinal) = match suffix {
        "" | "%" => (1.0, false),
        "k" => (1e3, false),
        "m" | "mn" => (1e6, false),
        "bn" | "b" => (1e9, false),
        "st" | "nd" | "rd" | "th" => (1.0, true),
        // "1990s", "3pm": not an amount.
        _ => return None,
    };
    Some(Word::Digits(value * times, ordinal))
}

/// The figures `text` names, in order: numbers however written (digits, words, ordinals,
/// ranges such as "ten to fifteen thousand", which give 10,000 too), as money when a currency
/// sign or word is next to them, and months written with a capital letter. A figure the
/// speaker took back ("eight thousand, no, sorry, six thousand") is among them; [`settled`]
/// leaves it out.
pub fn figures(text: &str) -> Vec<Figure> {
    placed(text).into_iter().map(|p| p.figure).collect()
}

/// The figures `text` names ([`figures`]) but those the speaker took back: the figure a
/// self-correction replaces.
pub fn settled(text: &str) -> Vec<Figure> {
    placed(text)
        .into_iter()
        .filter(|p| !p.retracted)
        .map(|p| p.figure)
        .collect()
}

/// Whether a figure of `text` before byte `boundary` is taken back by the next figure, after
/// it: "Our budget is eight thousand." and "No, sorry, six thousand pounds a year." with the
/// boundary between them.
pub fn taken_back_across(text: &str, boundary: usize) -> bool {
    placed(text)
        .windows(2)
        .any(|w| w[0].retracted && w[0].at.end <= boundary && w[1].at.start >= boundary)
}

/// A figure of a text, with where it is written.
#[derive(Debug, Clone, PartialEq)]
struct Placed {
    figure: Figure,
    /// The bytes of the words that write it (a leading currency sign included).
    at: std::ops::Range<usize>,
    /// Taken back by a self-correction: the figure after it replaces it.
    retracted: bool,
}

/// One piece of a text between spaces and hyphens: where its letters, digits and leading
/// currency sign are, and the piece itself.
struct Piece<'a> {
    core: std::ops::Range<usize>,
    raw: &'a str,
}

fn pieces(text: &str) -> Vec<Piece<'_>> {
    let mut out = Vec::new();
    let mut start = None;
    let split = |c: char| c.is_whitespace() || c == '-' || c == '–';
    for (i, c) in text
        .char_indices()
        .chain(std::iter::once((text.len(), ' ')))
    {
        match (start, split(c)) {
            (None, false) => start = Some(i),
            (Some(s), true) => {
                let raw = &text[s..i];
                let lead = raw
                    .find(|c: char| c.is_alphanumeric() || CURRENCY_SIGNS.contains(&c))
                    .unwrap_or(raw.len());
                let tail = raw.rfind(|c: char| c.is_alphanumeric()).map_or(lead, |j| {
                    j + raw[j..].chars().next().map_or(1, char::len_utf8)
                });
                out.push(Piece {
                    core: s + lead..s + tail.max(lead),
                    raw,
                });
                start = None;
            }
            _ => {}
        }
    }
    out
}

/// The figures of `text` ([`figures`]), each with where it is written and whether it was
/// taken back.
fn placed(text: &str) -> Vec<Placed> {
    let pieces = pieces(text);
    let words: Vec<(Word, bool, bool, String)> = pieces
        .iter()
        .map(|piece| {
            let raw = piece.raw;
            let (word, signed, ends) = read(raw);
            let lower = raw
                .trim_matches(|c: char| !c.is_alphanumeric())
                .to_lowercase();
            (word, signed, ends, lower)
        })
        .collect();
    let mut reader = Reader::default();
    for (i, (word, signed, ends, lower)) in words.iter().enumerate() {
        reader.at = pieces[i].core.clone();
        let next = words.get(i + 1).map(|w| w.0);
        // A currency word after a number ("forty thousand dollars") marks it.
        let currency_next = words
            .get(i + 1)
            .is_some_and(|w| CURRENCY_WORDS.contains(&w.3.as_str()));
        match *word {
            Word::Digits(value, ordinal) => {
                reader.flush();
                reader.start(value);
                if ordinal {
                    reader.flush();
                }
            }
            Word::Unit(value) => {
                if matches!(
                    reader.last,
                    Some(Word::Unit(_) | Word::Digits(..) | Word::Tens(_))
                ) && !(matches!(reader.last, Some(Word::Tens(_))) && value < 10.0)
                {
                    reader.flush();
                }
                reader.add(value);
            }
            Word::Tens(value) => {
                if matches!(
                    reader.last,
                    Some(Word::Unit(_) | Word::Digits(..) | Word::Tens(_))
                ) {
                    reader.flush();
                }
                reader.add(value);
            }
            Word::Ordinal(value) => {
                if matches!(reader.last, Some(Word::Tens(_))) && value < 10.0 {
                    reader.add(value);
                } else {
                    reader.flush();
                    reader.start(value);
                }
                reader.flush();
            }
            Word::Hundred => {
                if reader.active {
                    reader.group = reader.group.max(1.0) * 100.0;
                    reader.end = reader.at.end;
                } else {
                    reader.start(100.0);
                }
            }
            Word::Scale(scale) => {
                let group = if reader.active {
                    reader.group.max(1.0)
                } else {
                    1.0
                };
                reader.total += group * scale;
                reader.group = 0.0;
                if !reader.active {
                    reader.begun = reader.at.start;
                }
                reader.end = reader.at.end;
                reader.active = true;
                reader.scale = reader.scale.max(scale);
            }
            Word::A => {
                reader.flush();
                if matches!(next, Some(Word::Hundred | Word::Scale(_))) {
                    reader.start(1.0);
                }
            }
            Word::Month(m) => {
                reader.flush();
                reader.out.push(Placed {
                    figure: Figure::Month(m),
                    at: reader.at.clone(),
                    retracted: false,
                });
            }
            Word::Other => {
                if lower == "and"
                    && matches!(reader.last, Some(Word::Hundred | Word::Scale(_)))
                    && matches!(next, Some(Word::Unit(_) | Word::Tens(_)))
                {
                    // "one hundred and fifty": one number.
                    continue;
                }
                let joins = RANGE_WORDS.contains(&lower.as_str())
                    && matches!(next, Some(Word::Unit(_) | Word::Tens(_) | Word::Digits(..)));
                if reader.active && joins && !*ends {
                    // "ten to fifteen thousand": the first end takes the second's scale.
                    let low = reader.value();
                    reader.flush();
                    reader.range_from = Some(low);
                    reader.last = Some(Word::Other);
                    continue;
                }
                if *signed {
                    reader.money = true;
                }
                reader.flush();
            }
        }
        if !matches!(word, Word::Other | Word::A) {
            reader.last = Some(*word);
        }
        if *signed && reader.active && !matches!(word, Word::Other) {
            reader.money = true;
        }
        if currency_next {
            reader.money = true;
        }
        if *ends {
            reader.flush();
        }
    }
    reader.flush();
    let mut out = reader.out;
    for k in 1..out.len() {
        let (before, after) = (&out[k - 1], &out[k]);
        let kinds_match =
            matches!(before.figure, Figure::Month(_)) == matches!(after.figure, Figure::Month(_));
        if kinds_match && corrects(&pieces, before.at.end, after.at.start) {
            out[k - 1].retracted = true;
        }
    }
    out
}

/// Most words between a figure and the one that corrects it ("nine thousand dollars a month,
/// no, I tell a lie, nineteen thousand").
const CORRECTION_SPAN: usize = 8;

/// Whether the words between bytes `from` and `to` of the text of `pieces` (from the end of
/// one figure to the start of the next) take the first figure back: a few words with a
/// self-correction among them ("no," "sorry", "wait", "I mean", "actually", "or rather", "I
/// tell a lie", "make that", "scratch that").
fn corrects(pieces: &[Piece<'_>], from: usize, to: usize) -> bool {
    let between: Vec<usize> = (0..pieces.len())
        .filter(|&i| pieces[i].core.start >= from && pieces[i].core.end <= to)
        .filter(|&i| !pieces[i].core.is_empty())
        .collect();
    if between.is_empty() || between.len() > CORRECTION_SPAN {
        return false;
    }
    let word = |i: usize| {
        pieces[i]
            .raw
            .trim_matches(|c: char| !c.is_alphanumeric())
            .to_lowercase()
    };
    let pause = |i: usize| {
        pieces[i]
            .raw
            .trim_end_matches(['"', '\'', ')', '”', '’'])
            .ends_with([',', '.', ';', ':', '!', '?', '…'])
    };
    between.iter().any(|&i| {
        let before = i.checked_sub(1).map(word).unwrap_or_default();
        let after = pieces.get(i + 1).map(|_| word(i + 1)).unwrap_or_default();
        match word(i).as_str() {
            // "no" alone between pauses, not "no more than".
            "no" | "nope" => pause(i) || i.checked_sub(1).is_some_and(pause),
            "sorry" | "wait" | "actually" | "correction" | "oops" => true,
            "rather" => before == "or",
            "mean" => before == "i",
            "lie" => before == "a",
            "make" | "scratch" => after == "that",
            _ => false,
        }
    })
}

/// The same figure: the same month, or the same amount within rounding.
fn exact(a: Figure, b: Figure) -> bool {
    match (a, b) {
        (Figure::Month(a), Figure::Month(b)) => a == b,
        (Figure::Money(a) | Figure::Number(a), Figure::Money(b) | Figure::Number(b)) => same(a, b),
        _ => false,
    }
}

/// `summary` with each figure its `quotes` took back ("eight thousand, no, sorry, six
/// thousand pounds") written as the figure that replaced it, in the summary's own style
/// (digits, with its currency sign, or the quote's words); `None` when it names none. A
/// figure the quotes also state as settled stays.
pub fn restate(summary: &str, quotes: &[String]) -> Option<String> {
    // (what was taken back, what replaced it, the words of the quote that write it)
    let mut corrections: Vec<(Figure, Figure, &str)> = Vec::new();
    let mut stated: Vec<Figure> = Vec::new();
    for quote in quotes {
        let placed = placed(quote);
        for (k, p) in placed.iter().enumerate() {
            if !p.retracted {
                stated.push(p.figure);
            } else if let Some(next) = placed.get(k + 1) {
                corrections.push((p.figure, next.figure, &quote[next.at.clone()]));
            }
        }
    }
    if corrections.is_empty() {
        return None;
    }
    let mut out = summary.to_owned();
    let mut changed = false;
    let own = placed(summary);
    // From the end, so that the earlier ranges still hold.
    for p in own.iter().rev() {
        if p.retracted || stated.iter().any(|s| exact(*s, p.figure)) {
            continue;
        }
        let Some(&(_, with, words)) = corrections.iter().find(|c| exact(c.0, p.figure)) else {
            continue;
        };
        if own.iter().any(|o| exact(o.figure, with)) {
            // Both named ("March or February"): the one taken back goes, with its joining word.
            if let Some(gone) = joined(summary, p.at.clone()) {
                out.replace_range(gone, "");
                changed = true;
                continue;
            }
        }
        let old = &summary[p.at.clone()];
        let new = match with {
            Figure::Month(m) => {
                let name = MONTHS[usize::from(m) - 1];
                name[..1].to_uppercase() + &name[1..]
            }
            Figure::Money(n) | Figure::Number(n)
                if old.starts_with(|c: char| c.is_ascii_digit() || CURRENCY_SIGNS.contains(&c)) =>
            {
                let sign: String = old
                    .chars()
                    .take_while(|c| CURRENCY_SIGNS.contains(c))
                    .collect();
                sign + &written(n)
            }
            _ => words.to_owned(),
        };
        let new = if old.starts_with(char::is_uppercase) {
            let mut chars = new.chars();
            chars
                .next()
                .map_or(String::new(), |c| c.to_uppercase().chain(chars).collect())
        } else {
            new
        };
        out.replace_range(p.at.clone(), &new);
        changed = true;
    }
    changed.then_some(out)
}

/// The bytes of `summary` to take out with the figure at `at` when it names another: the
/// figure and the word that joins it to the next ("March or February") or to the one before
/// ("February or March"); `None` when no such word is next to it.
fn joined(summary: &str, at: std::ops::Range<usize>) -> Option<std::ops::Range<usize>> {
    const JOINS: [&str; 3] = [" or ", " and ", ", "];
    let after = &summary[at.end..];
    if let Some(join) = JOINS.iter().find(|j| after.starts_with(**j)) {
        return Some(at.start..at.end + join.len());
    }
    let before = &summary[..at.start];
    JOINS
        .iter()
        .find(|j| before.ends_with(**j))
        .map(|j| at.start - j.len()..at.end)
}

/// An amount in digits, its thousands grouped: "6,000", "1,500.5".
fn written(n: f64) -> String {
    let whole = n.trunc() as u64;
    let digits = whole.to_string();
    let mut grouped = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(c);
    }
    let cents = ((n - n.trunc()) * 100.0).round() as u64;
    if cents > 0 {
        grouped + format!(".{cents:02}").trim_end_matches('0')
    } else {
        grouped
    }
}

/// The number being read by [`figures`].
#[derive(Default)]
struct Reader {
    out: Vec<Placed>,
    /// The bytes of the word being read.
    at: std::ops::Range<usize>,
    /// Where the number being read starts and ends.
    begun: usize,
    end: usize,
    total: f64,
    group: f64,
    active: bool,
    money: bool,
    /// The largest scale word of the number ("thousand": 1,000).
    scale: f64,
    last: Option<Word>,
    /// The low end of a range, waiting for the high end's scale.
    range_from: Option<(f64, bool, f64)>,
}

impl Reader {
    fn start(&mut self, value: f64) {
        if !self.active {
            self.begun = self.at.start;
        }
        self.end = self.at.end;
        self.active = true;
        self.group = value;
    }

    fn add(&mut self, value: f64) {
        if !self.active {
            self.begun = self.at.start;
        }
        self.end = self.at.end;
        self.active = true;
        self.group += value;
    }

    fn push(&mut self, figure: Figure) {
        self.out.push(Placed {
            figure,
            at: self.begun..self.end.max(self.begun),
            retracted: false,
        });
    }

    /// The number so far: value, money, scale.
    fn value(&self) -> (f64, bool, f64) {
        (self.total + self.group, self.money, self.scale)
    }

    fn flush(&mut self) {
        if self.active {
            let (value, money, scale) = self.value();
            if let Some((low, low_money, low_scale)) = self.range_from.take() {
                if scale > 1.0 && low_scale < scale && low < 1000.0 && low * scale < value {
                    let figure = low * scale;
                    self.push(if money || low_money {
                        Figure::Money(figure)
                    } else {
                        Figure::Number(figure)
                    });
                }
            }
            self.push(if money {
                Figure::Money(value)
            } else {
                Figure::Number(value)
            });
        }
        self.range_from = None;
        self.total = 0.0;
        self.group = 0.0;
        self.active = false;
        self.money = false;
        self.scale = 0.0;
        self.last = None;
    }
}

/// Least number, not money, that a summary's claim is held to ("40,000 pages a month"); a
/// smaller count ("3 locations", "12 months") may be said in many ways ("within the first
/// year").
const LEAST_CLAIMED: f64 = 100.0;

/// The figures of `summary` it must be held to: amounts of money, other numbers of
/// [`LEAST_CLAIMED`] or more, and months, none it takes back ([`settled`]).
pub fn claimed(summary: &str) -> Vec<Figure> {
    settled(summary)
        .into_iter()
        .filter(|f| match f {
            Figure::Money(_) | Figure::Month(_) => true,
            Figure::Number(n) => *n >= LEAST_CLAIMED,
        })
        .collect()
}

/// The same amount within rounding.
fn same(a: f64, b: f64) -> bool {
    (a - b).abs() <= 0.02 * a.abs().max(b.abs())
}

/// Whether the figure `said` bears out the `claim`: the same amount (a monthly or weekly one
/// for a yearly one, and the other way round), or the same month or the one next to it ("by
/// the end of March" for "before April").
fn bears(claim: Figure, said: Figure) -> bool {
    let amount = |f: Figure| match f {
        Figure::Money(n) | Figure::Number(n) => Some(n),
        Figure::Month(_) => None,
    };
    match (claim, said) {
        (Figure::Month(a), Figure::Month(b)) => {
            let (a, b) = (i16::from(a), i16::from(b));
            (a - b).rem_euclid(12) <= 1 || (b - a).rem_euclid(12) <= 1
        }
        _ => match (amount(claim), amount(said)) {
            (Some(a), Some(b)) => [1.0, 12.0, 1.0 / 12.0, 52.0, 1.0 / 52.0]
                .iter()
                .any(|times| same(a, b * times)),
            _ => false,
        },
    }
}

/// Whether the figures `said` bear out the claimed figure `claim`.
pub fn borne(claim: Figure, said: &[Figure]) -> bool {
    said.iter().any(|s| bears(claim, *s))
}

/// Whether `quotes` bear out every figure `summary` claims (see [`claimed`]) with a figure
/// they settle on (a figure a speaker took back bears out nothing): true when the summary
/// claims none.
pub fn bears_out(summary: &str, quotes: &[String]) -> bool {
    let said: Vec<Figure> = quotes.iter().flat_map(|q| settled(q)).collect();
    claimed(summary).into_iter().all(|c| borne(c, &said))
}

/// Whether `text` names an amount: of money, or another number of [`LEAST_CLAIMED`] or more
/// ("around eight thousand for hardware"). "The price would have to be modest" names none.
pub fn names_an_amount(text: &str) -> bool {
    figures(text).into_iter().any(|f| match f {
        Figure::Money(_) => true,
        Figure::Number(n) => n >= LEAST_CLAIMED,
        Figure::Month(_) => false,
    })
}

/// Words that name a day or a span of the calendar, besides the months.
const CALENDAR_WORDS: [&str; 13] = [
    "monday",
    "tuesday",
    "wednesday",
    "thursday",
    "friday",
    "saturday",
    "sunday",
    "tomorrow",
    "quarter",
    "q1",
    "q2",
    "q3",
    "q4",
];

/// Spans of the calendar shorter than a year that "this" or "next" make a point in it.
const SPANS: [&str; 7] = [
    "week", "month", "spring", "summer", "autumn", "fall", "winter",
];

/// Whether `text` names a point in the calendar: a month ([`figures`]: "by the end of June",
/// "on the thirtieth of April"), a weekday, a quarter ("Q3", "before the quarter ends"),
/// tomorrow, this or next week, month or season ("before next summer"), or the end of the
/// year. "Sometime after the summer", "next year" (too wide to buy by) and "soon" name none.
pub fn names_a_date(text: &str) -> bool {
    if figures(text).iter().any(|f| matches!(f, Figure::Month(_))) {
        return true;
    }
    let words: Vec<String> = text
        .split(|c: char| c.is_whitespace() || c == '-')
        .map(|w| {
            w.trim_matches(|c: char| !c.is_alphanumeric())
                .to_lowercase()
        })
        .filter(|w| !w.is_empty())
        .collect();
    let at = |i: usize| words.get(i).map_or("", String::as_str);
    (0..words.len()).any(|i| {
        // "A quarter of our calls" is a share, not a quarter of the year.
        (CALENDAR_WORDS.contains(&at(i)) && !(at(i) == "quarter" && at(i + 1) == "of"))
            || (matches!(at(i), "this" | "next") && SPANS.contains(&at(i + 1)))
            || (at(i) == "year" && at(i + 1) == "end")
            || (at(i) == "end" && at(i + 1) == "of" && at(i + 2) == "the" && at(i + 3) == "year")
    })
}

/// Whether `quote` is about other figures than `claims`: it names figures of the kinds a claim
/// is held to, and none of them bears out any of `claims` (which are not empty).
pub fn about_other_figures(quote: &str, claims: &[Figure]) -> bool {
    let own = claimed(quote);
    !claims.is_empty()
        && !own.is_empty()
        && !own.iter().any(|o| claims.iter().any(|c| bears(*c, *o)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numbers(text: &str) -> Vec<f64> {
        figures(text)
            .into_iter()
            .filter_map(|f| match f {
                Figure::Money(n) | Figure::Number(n) => Some(n),
                Figure::Month(_) => None,
            })
            .collect()
    }

    #[test]
    fn numbers_are_read_however_they_are_written() {
        assert_eq!(
            numbers("We've approved forty thousand dollars for this."),
            [40e3]
        );
        assert_eq!(numbers("about $45,000 a year"), [45e3]);
        assert_eq!(numbers("a budget of 45k"), [45e3]);
        assert_eq!(numbers("up to twenty five thousand pounds"), [25e3]);
        assert_eq!(numbers("twenty-five thousand"), [25e3]);
        assert_eq!(numbers("one thousand five hundred pounds"), [1500.0]);
        assert_eq!(numbers("a hundred thousand dollars"), [100e3]);
        assert_eq!(numbers("one hundred and fifty euros"), [150.0]);
        assert_eq!(numbers("1.5 million"), [1.5e6]);
        assert_eq!(numbers("€2m"), [2e6]);
        assert_eq!(numbers("nineteen thousand dollars a month"), [19e3]);
        assert_eq!(numbers("on the 15th"), [15.0]);
        assert_eq!(numbers("by the fifteenth of June"), [15.0]);
        assert_eq!(numbers("the twenty first"), [21.0]);
        assert_eq!(numbers("in 2027"), [2027.0]);
        // A correction: both amounts, each on its own (see `settled`).
        assert_eq!(
            numbers("eight thousand, no, sorry, six thousand pounds a year"),
            [8e3, 6e3]
        );
        assert_eq!(
            numbers("forty, actually, forty five thousand dollars"),
            [40.0, 45e3]
        );
        // A range: its low end takes the high end's scale.
        assert_eq!(numbers("ten to fifteen thousand euros"), [10.0, 10e3, 15e3]);
        // Two numbers side by side stay two.
        assert_eq!(numbers("five twenty"), [5.0, 20.0]);
        assert_eq!(numbers("the 1990s at 3pm"), Vec::<f64>::new());
        assert_eq!(numbers("a third of calls"), [3.0]);
        assert_eq!(numbers(""), Vec::<f64>::new());
    }

    #[test]
    fn a_figure_the_speaker_takes_back_is_not_settled() {
        use Figure::{Money, Month, Number};
        assert_eq!(
            settled("Our budget is eight thousand, no, sorry, six thousand pounds a year."),
            [Money(6e3)]
        );
        assert_eq!(
            settled("about nine thousand dollars a month, no, I tell a lie, nineteen thousand dollars a month"),
            [Money(19e3)]
        );
        assert_eq!(
            settled("We want it by March, no, wait, by the end of February."),
            [Month(2)]
        );
        assert_eq!(
            settled("forty, actually, forty five thousand dollars"),
            [Money(45e3)]
        );
        assert_eq!(settled("€5,000, or rather €5,500"), [Money(5500.0)]);
        assert_eq!(settled("$300, I mean $350"), [Money(350.0)]);
        assert_eq!(
            settled("make that 12,000 not 10,000"),
            [Number(12e3), Number(10e3)]
        );
        // No correction: "no" inside a phrase, a range, figures far apart, a month and an
        // amount.
        assert_eq!(
            settled("no more than 20,000 dollars, and 5,000 for training"),
            [Money(20e3), Number(5e3)]
        );
        assert_eq!(
            settled("ten to fifteen thousand euros"),
            [Number(10.0), Money(10e3), Money(15e3)]
        );
        assert_eq!(
            settled(
                "It costs 3,000 a month. Sorry, the line is bad here, but we have about 400 staff."
            ),
            [Number(3e3), Number(400.0)]
        );
        assert_eq!(
            settled("3,000 dollars, no, by June"),
            [Money(3e3), Month(6)]
        );
        // `figures` still reads both.
        assert_eq!(
            figures("eight thousand, no, six thousand"),
            [Number(8e3), Number(6e3)]
        );
    }

    #[test]
    fn a_summary_of_a_figure_taken_back_is_restated_with_the_settled_one() {
        let q =
            vec!["Our budget is eight thousand, no, sorry, six thousand pounds a year.".to_owned()];
        // Held to the settled figure, the summary of the first is not borne out...
        assert!(!bears_out("A budget of 8,000 pounds a year.", &q));
        assert!(bears_out("A budget of 6,000 pounds a year.", &q));
        // ...and is restated in its own style.
        assert_eq!(
            restate("A budget of eight thousand pounds a year.", &q).as_deref(),
            Some("A budget of six thousand pounds a year.")
        );
        assert_eq!(
            restate("A budget of £8,000 a year for payroll.", &q).as_deref(),
            Some("A budget of £6,000 a year for payroll.")
        );
        assert_eq!(
            restate("Budget: 8k a year.", &q).as_deref(),
            Some("Budget: 6,000 a year.")
        );
        assert_eq!(restate("A budget of £6,000 a year.", &q), None);
        assert_eq!(restate("No figure at all.", &q), None);
        assert_eq!(
            restate(
                "Wants it by March.",
                &["We want it by March, no, wait, by the end of February.".to_owned()]
            )
            .as_deref(),
            Some("Wants it by February.")
        );
        // Both named: the one taken back goes.
        let feb = ["We want it by March, no, wait, by the end of February.".to_owned()];
        assert_eq!(
            restate("March or February before the busy season.", &feb).as_deref(),
            Some("February before the busy season.")
        );
        assert_eq!(
            restate("By the end of February or March.", &feb).as_deref(),
            Some("By the end of February.")
        );
        // A summary's first word keeps its capital.
        assert_eq!(
            restate("Eight thousand pounds is the budget.", &q).as_deref(),
            Some("Six thousand pounds is the budget.")
        );
        // A figure the quotes also state without taking it back stays.
        let both = vec![q[0].clone(), "We spend 8,000 a year today.".to_owned()];
        assert_eq!(restate("8,000 a year.", &both), None);
        // Without a correction, nothing to restate.
        assert_eq!(
            restate("8,000 a year.", &["We have 6,000 a year.".to_owned()]),
            None
        );
    }

    #[test]
    fn money_and_months_are_told_apart_from_other_numbers() {
        assert_eq!(figures("$3,000"), [Figure::Money(3000.0)]);
        assert_eq!(figures("3,000 dollars"), [Figure::Money(3000.0)]);
        assert_eq!(figures("3,000 pages"), [Figure::Number(3000.0)]);
        assert_eq!(figures("about 40 grand"), [Figure::Money(40e3)]);
        assert_eq!(
            figures("before April, when the contract ends in March."),
            [Figure::Month(4), Figure::Month(3)]
        );
        // "may" is a verb unless written as the month's name.
        assert_eq!(figures("we may need it in May"), [Figure::Month(5)]);
    }

    #[test]
    fn a_summary_is_held_to_its_money_large_numbers_and_months() {
        assert_eq!(
            claimed("About 200 pounds a month for 3 shops, by June."),
            [Figure::Money(200.0), Figure::Month(6)]
        );
        assert_eq!(claimed("Needs it within 12 months."), []);
        assert_eq!(
            claimed("Prints 40,000 pages a month."),
            [Figure::Number(40e3)]
        );
    }

    #[test]
    fn quotes_bear_out_a_summary_when_they_name_its_figures() {
        let q = |s: &str| vec![s.to_owned()];
        assert!(bears_out(
            "20,000 dollars a year is set aside for the tool.",
            &q("We have twenty thousand dollars a year for this tool.")
        ));
        // The case: the authority's sentence under a budget.
        assert!(!bears_out(
            "20,000 dollars a year is set aside for the tool.",
            &q("I sign off on purchases up to 50,000 dollars.")
        ));
        // A monthly figure bears out a yearly one; the month next to a claimed one counts.
        assert!(bears_out(
            "Roughly $24,000 a year in wages.",
            &q("which costs us roughly two thousand dollars a month in wages.")
        ));
        assert!(bears_out(
            "Needs it before April.",
            &q("Our contract expires at the end of March.")
        ));
        assert!(!bears_out(
            "Needs it before April.",
            &q("Sometime in the autumn.")
        ));
        // Nothing claimed: nothing to bear out.
        assert!(bears_out("Spreadsheets cause overtime.", &q("Anything.")));
        assert!(bears_out("Needs it within 12 months.", &[]));
        // A range bears out either end.
        assert!(bears_out(
            "Between 10,000 and 15,000 euros.",
            &q("We could do ten to fifteen thousand euros.")
        ));
    }

    #[test]
    fn a_quote_about_other_figures_is_told() {
        let claims = claimed("20,000 dollars a year is set aside.");
        assert!(about_other_figures(
            "I sign off up to 50,000 dollars.",
            &claims
        ));
        assert!(!about_other_figures(
            "We set aside twenty thousand.",
            &claims
        ));
        // A quote without figures, or a summary without claims: not about other figures.
        assert!(!about_other_figures("We have money set aside.", &claims));
        assert!(!about_other_figures(
            "I sign off up to 50,000 dollars.",
            &[]
        ));
    }

    #[test]
    fn an_amount_is_money_or_a_large_number() {
        assert!(names_an_amount(
            "We have around eight thousand pounds for hardware."
        ));
        assert!(names_an_amount("We approve $40k for this."));
        assert!(names_an_amount(
            "Somewhere between ten and fifteen thousand."
        ));
        assert!(!names_an_amount(
            "We're small, so the price would have to be modest."
        ));
        assert!(!names_an_amount(
            "We have 12 vans and it must be done by March."
        ));
    }

    #[test]
    fn a_date_is_a_point_in_the_calendar() {
        for dated in [
            "Our printer lease runs out on the thirtieth of April.",
            "We want it by March, no, wait, by the end of February.",
            "It has to be live before Q3.",
            "We decide at the end of the quarter.",
            "The board meets next week.",
            "Can it be installed by Friday?",
            "We need it before the year-end close.",
            "We need it by the end of the year.",
            "We want the installation finished before next summer.",
        ] {
            assert!(names_a_date(dated), "{dated}");
        }
        for undated in [
            "Probably sometime after the summer.",
            "We'd like it soon, nothing fixed.",
            "A quarter of our calls are dropped.",
            "We may look again next year.",
        ] {
            assert!(!names_a_date(undated), "{undated}");
        }
    }
}
