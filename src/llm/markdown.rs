//! Markdown to plain prose, with a real CommonMark parser (pulldown-cmark): emphasis, headings,
//! code fences, links and tables lose their markup and keep their words.

use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};

/// Strips Markdown from `text`, keeping its words and its paragraph and line structure.
pub fn to_plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut list_depth = 0usize;
    for event in Parser::new_ext(text, Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH) {
        match event {
            Event::Text(t) | Event::Code(t) => out.push_str(&t),
            Event::SoftBreak => out.push(' '),
            Event::HardBreak | Event::Rule => out.push('\n'),
            Event::Start(Tag::Item) if !out.is_empty() && !out.ends_with('\n') => out.push('\n'),
            Event::Start(Tag::List(_)) => list_depth += 1,
            Event::End(TagEnd::List(_)) => {
                list_depth = list_depth.saturating_sub(1);
                if list_depth == 0 {
                    out.push_str("\n\n");
                }
            }
            Event::End(TagEnd::Item) => out.push('\n'),
            Event::End(TagEnd::TableCell) => out.push(' '),
            Event::End(TagEnd::TableRow | TagEnd::TableHead) => out.push('\n'),
            Event::End(
                TagEnd::Paragraph
                | TagEnd::Heading(_)
                | TagEnd::CodeBlock
                | TagEnd::BlockQuote(_)
                | TagEnd::Table,
            ) if list_depth == 0 => out.push_str("\n\n"),
            _ => {}
        }
    }
    // Collapse the blank lines the block ends left behind.
    let mut plain = String::with_capacity(out.len());
    let mut blank_run = 0;
    for line in out.lines() {
        let line = line.trim_end();
        if line.is_empty() {
            blank_run += 1;
            if blank_run == 1 && !plain.is_empty() {
                plain.push('\n');
            }
        } else {
            blank_run = 0;
            plain.push_str(line);
            plain.push('\n');
        }
    }
    plain.trim().to_owned()
}

/// Markdown removal for a streamed answer, one delta at a time: block markers at the start
/// of a line (headings, bullets, numbers, quotes, code fences), emphasis, inline code and
/// links are removed as the text flows, holding back only the few characters that are not yet
/// decidable. [`to_plain`] (a full parser) is used where the whole answer is at hand.
#[derive(Debug, Default)]
pub struct PlainStream {
    pending: String,
    mid_line: bool,
    in_fence: bool,
    prev: Option<char>,
}

/// Longest bracketed text held back waiting to see whether it is a link.
const MAX_LINK: usize = 300;

enum Step {
    /// Emit this and consume `n` bytes.
    Emit(String, usize),
    /// Need more input.
    Wait,
}

impl PlainStream {
    /// Adds a delta; returns the plain text that can be sent now.
    pub fn push(&mut self, delta: &str) -> String {
        self.pending.push_str(delta);
        self.drain(false)
    }

    /// Ends the stream; returns whatever was held back, cleaned.
    pub fn finish(&mut self) -> String {
        self.drain(true)
    }

    fn drain(&mut self, end: bool) -> String {
        let mut out = String::new();
        loop {
            if self.pending.is_empty() {
                break;
            }
            let step = if !self.mid_line {
                self.line_start(end)
            } else {
                self.inline(end)
            };
            match step {
                Step::Emit(text, n) => {
                    if let Some(c) = text.chars().last() {
                        self.prev = Some(c);
                    }
                    out.push_str(&text);
                    self.pending.drain(..n);
                }
                Step::Wait => break,
            }
        }
        out
    }

    /// At the start of a line: drop a block marker, or a whole fence line.
    fn line_start(&mut self, end: bool) -> Step {
        let p = &self.pending;
        let Some(nl) = p.find('\n').or(if end { Some(p.len()) } else { None }) else {
            // Undecided while the line so far could still be a marker.
            let head = p.trim_start_matches(' ');
            let could_be_marker = head.is_empty()
                || head.chars().all(|c| c == '#')
                || head.chars().all(|c| c == '`')
                || {
                    // "12", "12." and "12)" may still become a numbered item.
                    let digits = head.trim_end_matches(['.', ')']);
                    digits.chars().all(|c| c.is_ascii_digit()) && head.len() - digits.len() <= 1
                }
                || matches!(head, "-" | "*" | "+" | ">");
            if could_be_marker && p.len() < 16 {
                return Step::Wait;
            }
            return self.strip_marker(p.len());
        };
        let line = &p[..nl];
        if line.trim_start().starts_with("```") {
            self.in_fence = !self.in_fence;
            // The fence line goes, its newline too.
            return Step::Emit(String::new(), (nl + 1).min(p.len()));
        }
        self.strip_marker(nl)
    }

    fn strip_marker(&mut self, available: usize) -> Step {
        self.mid_line = true;
        if self.in_fence {
            return Step::Emit(String::new(), 0);
        }
        let p = &self.pending[..available];
        let indent = p.len() - p.trim_start_matches(' ').len();
        let head = &p[indent..];
        let marker = if let Some(rest) = head.strip_prefix('#') {
            let hashes = 1 + rest.len() - rest.trim_start_matches('#').len();
            let after = &head[hashes..];
            (hashes <= 6 && after.starts_with(' ')).then_some(hashes + 1)
        } else if head.starts_with("- ")
            || head.starts_with("* ")
            || head.starts_with("+ ")
            || head.starts_with("> ")
        {
            Some(2)
        } else {
            let digits = head.len() - head.trim_start_matches(|c: char| c.is_ascii_digit()).len();
            let after = &head[digits..];
            (digits > 0 && digits <= 9 && (after.starts_with(". ") || after.starts_with(") ")))
                .then_some(digits + 2)
        };
        match marker {
            Some(n) => Step::Emit(String::new(), indent + n),
            None => Step::Emit(String::new(), 0),
        }
    }

    /// Inside a line: emphasis, inline code and links.
    fn inline(&mut self, end: bool) -> Step {
        let p = &self.pending;
        let c = p.chars().next().expect("drain checks pending is not empty");
        if c == '\n' {
            self.mid_line = false;
            return Step::Emit("\n".into(), 1);
        }
        if self.in_fence {
            let n = p.find('\n').unwrap_or(p.len());
            return Step::Emit(p[..n].to_owned(), n);
        }
        match c {
            '`' => Step::Emit(String::new(), 1),
            '*' | '_' => {
                let run = p.len() - p.trim_start_matches(c).len();
                let next = p[run..].chars().next();
                if next.is_none() && !end {
                    return Step::Wait;
                }
                let prev_word = self.prev.is_some_and(char::is_alphanumeric);
                let next_word = next.is_some_and(char::is_alphanumeric);
                let prev_space = self.prev.is_none_or(char::is_whitespace);
                let next_space = next.is_none_or(char::is_whitespace);
                let literal = (c == '_' && prev_word && next_word) || (prev_space && next_space);
                if literal {
                    Step::Emit(p[..run].to_owned(), run)
                } else {
                    Step::Emit(String::new(), run)
                }
            }
            '!' if p.len() == 1 && !end => Step::Wait,
            '!' if p[1..].starts_with('[') => Step::Emit(String::new(), 1),
            '[' => {
                let Some(close) = p.find(']') else {
                    return if !end && p.len() < MAX_LINK && !p.contains('\n') {
                        Step::Wait
                    } else {
                        Step::Emit("[".into(), 1)
                    };
                };
                let after = &p[close + 1..];
                if after.is_empty() && !end {
                    return Step::Wait;
                }
                if !after.starts_with('(') {
                    return Step::Emit(p[..close + 1].to_owned(), close + 1);
                }
                match after.find(')') {
                    Some(paren) => {
                        let text = p[1..close].to_owned();
                        Step::Emit(text, close + 1 + paren + 1)
                    }
                    None if !end && p.len() < MAX_LINK && !after.contains('\n') => Step::Wait,
                    None => Step::Emit(p[..close + 1].to_owned(), close + 1),
                }
            }
            _ => {
                let n = p
                    .find(['\n', '`', '*', '_', '[', '!'])
                    .unwrap_or(p.len())
                    .max(c.len_utf8());
                Step::Emit(p[..n].to_owned(), n)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(pieces: &[&str]) -> String {
        let mut s = PlainStream::default();
        let mut out: String = pieces.iter().map(|p| s.push(p)).collect();
        out.push_str(&s.finish());
        out
    }

    #[test]
    fn streaming_strips_like_the_parser_for_common_markup() {
        let md = "## Order status\nYour order **ships today** via *Singapore Post*.\n- Track it [here](https://x.test).\n1. Call `support`.\n```\nraw code\n```\nsnake_case and 5 * 3 stay.";
        let expected = "Order status\nYour order ships today via Singapore Post.\nTrack it here.\nCall support.\nraw code\nsnake_case and 5 * 3 stay.";
        assert_eq!(stream(&[md]), expected);
        // Any split into deltas gives the same text.
        for size in 1..8 {
            let pieces: Vec<String> = md
                .chars()
                .collect::<Vec<_>>()
                .chunks(size)
                .map(|c| c.iter().collect())
                .collect();
            let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
            assert_eq!(stream(&refs), expected, "pieces of {size}");
        }
    }

    #[test]
    fn streaming_leaves_prose_alone() {
        assert_eq!(
            stream(&["Hello", " there. ", "How can I help?"]),
            "Hello there. How can I help?"
        );
        assert_eq!(
            stream(&["Costs [about] $5", " - roughly"]),
            "Costs [about] $5 - roughly"
        );
        assert_eq!(stream(&["42 is the answer"]), "42 is the answer");
    }

    #[test]
    fn strips_inline_and_block_markup() {
        let md = "# Your order\n\nIt ships **today** via *Singapore Post*; see [tracking](https://x.test).\n\n- one\n- two `code`\n\n```\nlet x = 1;\n```\n";
        assert_eq!(
            to_plain(md),
            "Your order\n\nIt ships today via Singapore Post; see tracking.\n\none\ntwo code\n\nlet x = 1;"
        );
    }

    #[test]
    fn plain_text_is_unchanged() {
        assert_eq!(
            to_plain("Hello there. How can I help?"),
            "Hello there. How can I help?"
        );
        assert_eq!(to_plain("Line one\n\nLine two"), "Line one\n\nLine two");
    }

    #[test]
    fn tables_keep_their_cells() {
        assert_eq!(to_plain("| a | b |\n|---|---|\n| 1 | 2 |\n"), "a b\n1 2");
    }
}
