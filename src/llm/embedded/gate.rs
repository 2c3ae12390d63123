//! The text a client is shown: stop strings and tool-call markup held back until they can no
//! longer be the start of one, UTF-8 assembled across tokens, tool calls split from the text.

use super::*;
use crate::llm::ToolCall;

/// Takes the longest valid UTF-8 prefix out of `pending` (a token may end mid-character).
pub(super) fn take_utf8(pending: &mut Vec<u8>) -> String {
    let valid = match std::str::from_utf8(pending) {
        Ok(s) => s.len(),
        Err(e) if e.error_len().is_none() => e.valid_up_to(),
        // Invalid bytes in the middle: replace them rather than stall.
        Err(_) => {
            let s = String::from_utf8_lossy(pending).into_owned();
            pending.clear();
            return s;
        }
    };
    let rest = pending.split_off(valid);
    String::from_utf8(std::mem::replace(pending, rest)).expect("checked valid above")
}

/// Decides what generated text may be shown yet: it stops at stop strings and at the start of
/// a tool call, and holds back any tail that could still become one of them.
#[derive(Debug)]
pub struct StreamGate {
    pub(super) stops: Vec<String>,
    pub(super) markers: Vec<String>,
    pub(super) text: String,
    pub(super) emitted: usize,
    pub(super) closed: bool,
}

impl StreamGate {
    /// A gate for `stops` (generation ends there, the stop string is dropped) and `markers`
    /// (text from there on is kept but not shown).
    pub fn new(stops: &[String], markers: &[&str]) -> Self {
        Self {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            markers: markers.iter().map(|m| m.to_string()).collect(),
            text: String::new(),
            emitted: 0,
            closed: false,
        }
    }

    /// Adds generated text; returns what may be shown now and whether a stop string ended
    /// the generation.
    pub fn push(&mut self, piece: &str) -> (String, bool) {
        let search_from = self
            .emitted
            .saturating_sub(self.longest())
            .min(self.text.len());
        let search_from = floor_char(&self.text, search_from);
        self.text.push_str(piece);
        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|s| {
                self.text[search_from..]
                    .find(s.as_str())
                    .map(|i| i + search_from)
            })
            .min()
        {
            self.text.truncate(at);
            let emit = if self.closed {
                String::new()
            } else {
                self.text[self.emitted.min(at)..].to_owned()
            };
            self.emitted = self.text.len();
            self.closed = true;
            return (emit, true);
        }
        if self.closed {
            return (String::new(), false);
        }
        if let Some(at) = self
            .markers
            .iter()
            .filter_map(|m| {
                self.text[search_from..]
                    .find(m.as_str())
                    .map(|i| i + search_from)
            })
            .min()
        {
            let emit = self.text[self.emitted..at].to_owned();
            self.emitted = at;
            self.closed = true;
            return (emit, false);
        }
        // Hold back the longest tail that is a prefix of a stop string or marker.
        let mut safe = self.text.len();
        for pattern in self.stops.iter().chain(&self.markers) {
            for k in (1..pattern.len()).rev() {
                if pattern.is_char_boundary(k) && self.text.ends_with(&pattern[..k]) {
                    safe = safe.min(self.text.len() - k);
                    break;
                }
            }
        }
        let safe = floor_char(&self.text, safe.max(self.emitted));
        let emit = self.text[self.emitted..safe].to_owned();
        self.emitted = safe;
        (emit, false)
    }

    /// The end of generation: whatever was held back and may be shown.
    pub fn finish(&mut self) -> String {
        if self.closed {
            return String::new();
        }
        let emit = self.text[self.emitted..].to_owned();
        self.emitted = self.text.len();
        emit
    }

    /// Everything generated (up to a stop string).
    pub fn text(&self) -> &str {
        &self.text
    }

    pub(super) fn longest(&self) -> usize {
        self.stops
            .iter()
            .chain(&self.markers)
            .map(String::len)
            .max()
            .unwrap_or(0)
    }
}

pub(super) fn floor_char(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Splits `<tool_call>{...}</tool_call>` blocks off the text. Calls whose JSON does not parse
/// are dropped (the text before them still counts as the answer).
pub fn split_tool_calls(text: &str) -> (String, Vec<ToolCall>) {
    let Some(first) = text.find(TOOL_OPEN) else {
        return (text.trim().to_owned(), Vec::new());
    };
    let mut calls = Vec::new();
    let mut rest = &text[first..];
    while let Some(open) = rest.find(TOOL_OPEN) {
        let body_start = open + TOOL_OPEN.len();
        let (body, next) = match rest[body_start..].find(TOOL_CLOSE) {
            Some(close) => (
                &rest[body_start..body_start + close],
                &rest[body_start + close + TOOL_CLOSE.len()..],
            ),
            None => (&rest[body_start..], ""),
        };
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(body.trim()) {
            if let Some(name) = v.get("name").and_then(|n| n.as_str()) {
                calls.push(ToolCall {
                    id: format!("call_{}", calls.len()),
                    name: name.to_owned(),
                    arguments: v
                        .get("arguments")
                        .cloned()
                        .unwrap_or_else(|| serde_json::json!({})),
                });
            }
        }
        rest = next;
    }
    (text[..first].trim().to_owned(), calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(gate: &mut StreamGate, pieces: &[&str]) -> (String, bool) {
        let mut shown = String::new();
        for p in pieces {
            let (emit, stopped) = gate.push(p);
            shown.push_str(&emit);
            if stopped {
                return (shown, true);
            }
        }
        shown.push_str(&gate.finish());
        (shown, false)
    }

    #[test]
    fn stop_strings_end_generation_and_are_not_shown() {
        let mut gate = StreamGate::new(&["END".into()], &[]);
        assert_eq!(
            run(&mut gate, &["Hello E", "N", "D and more"]),
            ("Hello ".into(), true)
        );
        assert_eq!(gate.text(), "Hello ");
        let mut gate = StreamGate::new(&["END".into()], &[]);
        assert_eq!(
            run(&mut gate, &["Hello E", "nd"]),
            ("Hello End".into(), false)
        );
    }

    #[test]
    fn tool_call_markup_is_never_shown() {
        let mut gate = StreamGate::new(&[], &[TOOL_OPEN]);
        let (shown, _) = run(
            &mut gate,
            &[
                "Let me check. <tool",
                "_call>\n{\"name\": \"x\", \"arguments\": {}}\n</tool_call>",
            ],
        );
        assert_eq!(shown, "Let me check. ");
        let (text, calls) = split_tool_calls(gate.text());
        assert_eq!(text, "Let me check.");
        assert_eq!(
            calls,
            vec![ToolCall {
                id: "call_0".into(),
                name: "x".into(),
                arguments: serde_json::json!({})
            }]
        );
    }

    #[test]
    fn split_handles_several_and_broken_calls() {
        let text = "<tool_call>{\"name\":\"a\",\"arguments\":{\"q\":1}}</tool_call>\n<tool_call>{not json}</tool_call><tool_call>{\"name\":\"b\"}";
        let (before, calls) = split_tool_calls(text);
        assert_eq!(before, "");
        assert_eq!(
            calls.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert_eq!(calls[0].arguments, serde_json::json!({"q": 1}));
        assert_eq!(split_tool_calls("plain").0, "plain");
    }

    #[test]
    fn utf8_is_assembled_across_tokens() {
        let mut pending = "é".as_bytes()[..1].to_vec();
        assert_eq!(take_utf8(&mut pending), "");
        pending.push("é".as_bytes()[1]);
        pending.extend_from_slice(b"!");
        assert_eq!(take_utf8(&mut pending), "é!");
        assert!(pending.is_empty());
    }

    #[test]
    fn multibyte_text_near_markers_does_not_panic() {
        let mut gate = StreamGate::new(&["«fin»".into()], &[TOOL_OPEN]);
        let (shown, stopped) = run(&mut gate, &["ça va ", "«", "fi", "n» après"]);
        assert_eq!((shown.as_str(), stopped), ("ça va ", true));
    }
}
