//! Transcripts as people and models read them: the `Speaker: text` dialogue given to the
//! analyses (live and file alike), and times and scores rounded to the millisecond for the wire.

/// `x` rounded to three decimals (milliseconds for seconds, 0.001 for scores).
pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The dialogue of `lines` (speaker, text), one `Speaker: text` line each, in the order given.
/// A line that stops mid-sentence (it does not end with `.`, `?`, `!` or `…`, closing quotes
/// aside) is continued by the same speaker's next line, joined with a space: the speech engine
/// cuts a sentence where the speaker pauses, and a reader (or a model quoting it) sees the
/// sentence whole. Empty when there are no lines.
pub fn dialogue<'a>(lines: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut out = String::new();
    let mut open: Option<&str> = None;
    for (speaker, text) in lines {
        let text = text.trim();
        if text.is_empty() {
            continue;
        }
        if open == Some(speaker) {
            out.pop();
            out.push(' ');
        } else {
            out.push_str(speaker);
            out.push_str(": ");
        }
        out.push_str(text);
        out.push('\n');
        open = (!ends_sentence(text)).then_some(speaker);
    }
    out
}

/// The marks that end a sentence.
pub const SENTENCE_ENDS: [char; 7] = ['.', '?', '!', '…', '。', '？', '！'];
/// Closing quotes and brackets, which may follow a sentence's last mark.
pub const CLOSERS: [char; 7] = ['"', '\'', '”', '’', '»', ')', ']'];

/// `text` ends with a sentence's last mark, closing quotes and brackets aside.
fn ends_sentence(text: &str) -> bool {
    text.trim_end_matches(|c: char| c.is_whitespace() || CLOSERS.contains(&c))
        .ends_with(SENTENCE_ENDS)
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
    fn a_sentence_cut_at_a_pause_is_read_whole() {
        assert_eq!(
            dialogue([
                ("Customer", "We need it before April,"),
                ("Customer", "because our contract ends"),
                ("Customer", "in March."),
                ("Customer", "It is our top priority."),
                ("Agent", "Noted"),
                ("Customer", "Thanks \"a lot.\""),
                ("Agent", "bye"),
            ]),
            "Customer: We need it before April, because our contract ends in March.\n\
             Customer: It is our top priority.\n\
             Agent: Noted\n\
             Customer: Thanks \"a lot.\"\n\
             Agent: bye\n"
        );
        // Another speaker's line in between ends the sentence; blank lines are left out.
        assert_eq!(
            dialogue([
                ("Customer", "so the"),
                ("Agent", "yes"),
                ("Customer", "  "),
                ("Customer", "price")
            ]),
            "Customer: so the\nAgent: yes\nCustomer: price\n"
        );
    }

    #[test]
    fn labels_are_capitalised() {
        assert_eq!(speaker_label("customer"), "Customer");
        assert_eq!(speaker_label("élan"), "Élan");
        assert_eq!(speaker_label(""), "");
    }
}
