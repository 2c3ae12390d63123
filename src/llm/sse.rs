//! A server-sent-events parser (sans-IO): bytes in, complete events out.

/// One event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// `event:` field, if any.
    pub event: Option<String>,
    /// `data:` lines joined with `\n`.
    pub data: String,
}

/// Accumulates a stream and yields events as they complete.
#[derive(Debug, Default)]
pub struct SseParser {
    buffer: Vec<u8>,
    event: Option<String>,
    data: Vec<String>,
}

/// Longest line accepted; a peer sending more without a newline is broken.
const MAX_LINE: usize = 1 << 20;

impl SseParser {
    /// Feeds bytes; returns the events completed by them.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<SseEvent>, String> {
        self.buffer.extend_from_slice(bytes);
        let mut events = Vec::new();
        while let Some(nl) = self.buffer.iter().position(|&b| b == b'\n') {
            let mut line: Vec<u8> = self.buffer.drain(..=nl).collect();
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            let line =
                String::from_utf8(line).map_err(|_| "event stream is not UTF-8".to_owned())?;
            if line.is_empty() {
                if !self.data.is_empty() || self.event.is_some() {
                    events.push(SseEvent {
                        event: self.event.take(),
                        data: std::mem::take(&mut self.data).join("\n"),
                    });
                }
                continue;
            }
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((line.as_str(), ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "data" => self.data.push(value.to_owned()),
                "event" => self.event = Some(value.to_owned()),
                _ => {}
            }
        }
        if self.buffer.len() > MAX_LINE {
            return Err("event stream line too long".into());
        }
        Ok(events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_across_arbitrary_chunks() {
        let stream = b": comment\r\ndata: {\"a\":1}\r\n\r\nevent: x\ndata: line1\ndata: line2\n\ndata: [DONE]\n\n";
        for split in 1..stream.len() {
            let mut p = SseParser::default();
            let mut got = p.push(&stream[..split]).unwrap();
            got.extend(p.push(&stream[split..]).unwrap());
            assert_eq!(
                got,
                vec![
                    SseEvent {
                        event: None,
                        data: "{\"a\":1}".into()
                    },
                    SseEvent {
                        event: Some("x".into()),
                        data: "line1\nline2".into()
                    },
                    SseEvent {
                        event: None,
                        data: "[DONE]".into()
                    },
                ],
                "split at {split}"
            );
        }
    }
}
