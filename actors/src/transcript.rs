//! Transcripts as people and models read them: the `Speaker: text` dialogue given to the
//! analyses (live and file alike), and times and scores rounded to the millisecond for the wire.

/// `x` rounded to three decimals (milliseconds for seconds, 0.001 for scores).
pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The dialogue of `lines` (speaker, text), one `Speaker: text` line each, in the order given.
/// Empty when there are no lines.
pub fn dialogue<'a>(lines: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut out = String::new();
    for (speaker, text) in lines {
        out.push_str(speaker);
        out.push_str(": ");
        out.push_str(text);
        out.push('\n');
    }
    out
}

/// A speaker label with its first letter capitalised (`customer` -> `Customer`).
pub fn speaker_label(name: &str) -> String {
    let mut chars = name.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_to_milliseconds() {
        assert_eq!(round3(1.23456), 1.235);
        assert_eq!(round3(-0.0004), -0.0);
        assert_eq!(round3(2.0), 2.0);
    }

    #[test]
    fn dialogue_lines() {
        assert_eq!(dialogue([]), "");
        assert_eq!(
            dialogue([("Customer", "hello"), ("Agent", "hi there")]),
            "Customer: hello\nAgent: hi there\n"
        );
    }

    #[test]
    fn labels_are_capitalised() {
        assert_eq!(speaker_label("customer"), "Customer");
        assert_eq!(speaker_label("élan"), "Élan");
        assert_eq!(speaker_label(""), "");
    }
}
