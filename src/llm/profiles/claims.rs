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
/// sign or word is next to them, and months written with a capital letter.
pub fn figures(text: &str) -> Vec<Figure> {
    let words: Vec<(Word, bool, bool, String)> = text
        .split(|c: char| c.is_whitespace() || c == '-' || c == '–')
        .filter(|w| !w.is_empty())
        .map(|raw| {
            let (word, signed, ends) = read(raw);
            let lower = raw
                .trim_matches(|c: char| !c.is_alphanumeric())
                .to_lowercase();
            (word, signed, ends, lower)
        })
        .collect();
    let mut reader = Reader::default();
    for (i, (word, signed, ends, lower)) in words.iter().enumerate() {
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
                reader.out.push(Figure::Month(m));
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
    reader.out
}

/// The number being read by [`figures`].
#[derive(Default)]
struct Reader {
    out: Vec<Figure>,
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
        self.active = true;
        self.group = value;
    }

    fn add(&mut self, value: f64) {
        self.active = true;
        self.group += value;
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
                    self.out.push(if money || low_money {
                        Figure::Money(figure)
                    } else {
                        Figure::Number(figure)
                    });
                }
            }
            self.out.push(if money {
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
/// [`LEAST_CLAIMED`] or more, and months.
pub fn claimed(summary: &str) -> Vec<Figure> {
    figures(summary)
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

/// Whether `quotes` bear out every figure `summary` claims (see [`claimed`]): true when the
/// summary claims none.
pub fn bears_out(summary: &str, quotes: &[String]) -> bool {
    let said: Vec<Figure> = quotes.iter().flat_map(|q| figures(q)).collect();
    claimed(summary).into_iter().all(|c| borne(c, &said))
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
        // A correction: both amounts, each on its own.
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
}
