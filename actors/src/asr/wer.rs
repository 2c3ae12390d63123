//! Word error rate, with the text normalisation that makes it fair to a model that writes
//! "$50,000" for "fifty thousand dollars".

/// Edits between a reference and a hypothesis, in words.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WerCount {
    /// Substitutions + deletions + insertions.
    pub edits: usize,
    /// Words in the reference.
    pub reference_words: usize,
}

impl WerCount {
    /// The rate: edits per reference word.
    pub fn rate(self) -> f64 {
        if self.reference_words == 0 {
            return if self.edits == 0 { 0.0 } else { 1.0 };
        }
        self.edits as f64 / self.reference_words as f64
    }
}

impl std::ops::Add for WerCount {
    type Output = Self;
    fn add(self, o: Self) -> Self {
        Self {
            edits: self.edits + o.edits,
            reference_words: self.reference_words + o.reference_words,
        }
    }
}

/// Counts the word edits between `reference` and `hypothesis` after normalising both.
pub fn wer(reference: &str, hypothesis: &str) -> WerCount {
    let r = normalise(reference);
    let h = normalise(hypothesis);
    WerCount {
        edits: edit_distance(&r, &h),
        reference_words: r.len(),
    }
}

/// Words of `hypothesis` that are words of `reference` in the same order: the length of the
/// longest common subsequence of the normalised word lists (the correct words of an alignment).
pub fn correct_words(reference: &str, hypothesis: &str) -> usize {
    words_in_order(&normalise(reference), &normalise(hypothesis))
}

/// [`correct_words`] of word lists already normalised: how many words of `b` are words of `a`
/// in the same order.
pub fn words_in_order(a: &[String], b: &[String]) -> usize {
    let mut prev = vec![0usize; b.len() + 1];
    let mut cur = vec![0usize; b.len() + 1];
    for x in a {
        for (j, y) in b.iter().enumerate() {
            cur[j + 1] = if x == y {
                prev[j] + 1
            } else {
                prev[j + 1].max(cur[j])
            };
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

fn edit_distance(a: &[String], b: &[String]) -> usize {
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, x) in a.iter().enumerate() {
        cur[0] = i + 1;
        for (j, y) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(x != y))
                .min(prev[j + 1] + 1)
                .min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// Lower-case words: numbers spelled out (bare strings of five or more digits digit by digit,
/// as account and phone numbers are read), `$N` read as "N dollars", `%` as "percent",
/// punctuation and hyphens removed.
pub fn normalise(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for raw in text.split(|c: char| c.is_whitespace() || c == '-' || c == '/') {
        let lower = raw.to_lowercase();
        let dollars = lower.starts_with('$');
        let percent = lower.ends_with('%');
        let word: String = lower
            .chars()
            .filter(|c| c.is_alphanumeric() || *c == '\'')
            .collect();
        let word = word.trim_matches('\'');
        if word.is_empty() {
            continue;
        }
        let digits_only = raw.chars().filter(|c| c.is_ascii_digit()).count() == word.len();
        if word.chars().all(|c| c.is_ascii_digit())
            && digits_only
            && word.len() >= 5
            && !raw.contains(',')
        {
            // Long bare digit strings are account or phone numbers: read digit by digit.
            out.extend(
                word.chars()
                    .map(|d| spell(u64::from(d.to_digit(10).unwrap_or(0)))),
            );
        } else if word.chars().all(|c| c.is_ascii_digit()) {
            match word.parse::<u64>() {
                Ok(n) if n < 1_000_000_000 => out.extend(spell(n).split(' ').map(str::to_owned)),
                _ => out.push(word.to_owned()),
            }
        } else {
            out.push(word.to_owned());
        }
        if dollars {
            out.push("dollars".into());
        }
        if percent {
            out.push("percent".into());
        }
    }
    out
}

/// The English words of the numbers below twenty, by value.
pub const ONES: [&str; 20] = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
];
/// The English words of the tens, by value divided by ten ("" below twenty).
pub const TENS: [&str; 10] = [
    "", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety",
];

/// An English cardinal number.
fn spell(n: u64) -> String {
    fn below_thousand(n: u64, out: &mut Vec<String>) {
        if n >= 100 {
            out.push(ONES[(n / 100) as usize].into());
            out.push("hundred".into());
        }
        let rest = n % 100;
        if rest >= 20 {
            out.push(TENS[(rest / 10) as usize].into());
            if !rest.is_multiple_of(10) {
                out.push(ONES[(rest % 10) as usize].into());
            }
        } else if rest > 0 || n == 0 {
            out.push(ONES[rest as usize].into());
        }
    }
    let mut out = Vec::new();
    let (millions, thousands, units) = (n / 1_000_000, (n / 1000) % 1000, n % 1000);
    if millions > 0 {
        below_thousand(millions, &mut out);
        out.push("million".into());
    }
    if thousands > 0 {
        below_thousand(thousands, &mut out);
        out.push("thousand".into());
    }
    if units > 0 || out.is_empty() {
        below_thousand(units, &mut out);
    }
    out.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_substitutions_deletions_insertions() {
        assert_eq!(
            wer("the cat sat", "the cat sat"),
            WerCount {
                edits: 0,
                reference_words: 3
            }
        );
        assert_eq!(wer("the cat sat", "the bat sat down").edits, 2);
        assert_eq!(wer("the cat sat", "cat").edits, 2);
        assert_eq!(wer("", "").rate(), 0.0);
        assert_eq!(wer("", "noise").rate(), 1.0);
    }

    #[test]
    fn normalises_numbers_money_and_punctuation() {
        assert_eq!(
            wer(
                "a budget of around fifty thousand dollars",
                "A budget of around $50,000."
            )
            .edits,
            0
        );
        assert_eq!(wer("four five seven two nine one", "4-5-7-2-9-1").edits, 0);
        assert_eq!(wer("twenty people", "20 people").edits, 0);
        assert_eq!(
            wer(
                "my account number is four five seven two nine one",
                "My account number is 457291."
            )
            .edits,
            0
        );
        assert_eq!(wer("fifty thousand", "50,000").edits, 0);
        assert_eq!(wer("I'm the person", "i'm the person!").edits, 0);
        assert_eq!(
            spell(1_234_567),
            "one million two hundred thirty four thousand five hundred sixty seven"
        );
        assert_eq!(spell(0), "zero");
    }

    #[test]
    fn correct_words_are_the_common_subsequence() {
        assert_eq!(
            correct_words("the cat sat on the mat", "the cat sat on the mat"),
            6
        );
        assert_eq!(
            correct_words("the cat sat on the mat", "a cat sat down on mat"),
            4
        );
        assert_eq!(correct_words("one two three", ""), 0);
        assert_eq!(correct_words("Hello, world!", "hello world"), 2);
    }
}
