//! A record's transcript as text for people and tools: `txt` (a speaker-labelled line per
//! utterance, with its time), SubRip (`srt`) and WebVTT (`vtt`) with a cue per utterance.
//! JSON is the record itself.

use super::Record;

/// An export format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The record as JSON.
    Json,
    /// `[mm:ss] Speaker: text` lines.
    Txt,
    /// SubRip.
    Srt,
    /// WebVTT.
    Vtt,
}

impl Format {
    /// The format a `format` query value names.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name.to_ascii_lowercase().as_str() {
            "json" => Format::Json,
            "txt" | "text" => Format::Txt,
            "srt" => Format::Srt,
            "vtt" | "webvtt" => Format::Vtt,
            _ => return None,
        })
    }

    /// Its media type.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Json => "application/json",
            Format::Txt => "text/plain; charset=utf-8",
            Format::Srt => "application/x-subrip; charset=utf-8",
            Format::Vtt => "text/vtt; charset=utf-8",
        }
    }

    /// Its file name extension.
    pub fn extension(self) -> &'static str {
        match self {
            Format::Json => "json",
            Format::Txt => "txt",
            Format::Srt => "srt",
            Format::Vtt => "vtt",
        }
    }
}

fn speaker(record: &Record, channel: usize) -> String {
    record
        .head
        .channels
        .get(channel)
        .cloned()
        .unwrap_or_else(|| format!("Channel {channel}"))
}

/// `h:mm:ss` parts and milliseconds of `secs`.
fn parts(secs: f64) -> (u64, u64, u64, u64) {
    let ms = (secs.max(0.0) * 1000.0).round() as u64;
    (ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000)
}

fn cue_time(secs: f64, separator: char) -> String {
    let (h, m, s, ms) = parts(secs);
    format!("{h:02}:{m:02}:{s:02}{separator}{ms:03}")
}

/// Cue text: one line, without the characters that would end a cue or open a tag.
fn cue_text(text: &str, vtt: bool) -> String {
    let one_line: String = text
        .chars()
        .map(|c| if c == '\n' || c == '\r' { ' ' } else { c })
        .collect();
    let one_line = one_line.replace("-->", "->");
    if vtt {
        one_line
            .replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    } else {
        one_line
    }
}

/// The record's transcript in `format`.
pub fn render(record: &Record, format: Format) -> String {
    match format {
        Format::Json => {
            serde_json::to_string_pretty(record).expect("a record is plain data and serializes")
        }
        Format::Txt => {
            let mut out = String::new();
            for line in &record.transcript {
                let (h, m, s, _) = parts(line.offset);
                let time = if h > 0 {
                    format!("{h}:{m:02}:{s:02}")
                } else {
                    format!("{m:02}:{s:02}")
                };
                out.push_str(&format!(
                    "[{time}] {}: {}\n",
                    speaker(record, line.channel),
                    cue_text(&line.text, false)
                ));
            }
            out
        }
        Format::Srt => {
            let mut out = String::new();
            for (i, line) in record.transcript.iter().enumerate() {
                out.push_str(&format!(
                    "{}\n{} --> {}\n{}: {}\n\n",
                    i + 1,
                    cue_time(line.offset, ','),
                    cue_time(line.offset + line.duration.max(0.0), ','),
                    speaker(record, line.channel),
                    cue_text(&line.text, false)
                ));
            }
            out
        }
        Format::Vtt => {
            let mut out = String::from("WEBVTT\n\n");
            for line in &record.transcript {
                out.push_str(&format!(
                    "{} --> {}\n<v {}>{}\n\n",
                    cue_time(line.offset, '.'),
                    cue_time(line.offset + line.duration.max(0.0), '.'),
                    cue_text(&speaker(record, line.channel), true),
                    cue_text(&line.text, true)
                ));
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{Line, RecordHead, RecordKind};

    fn record() -> Record {
        Record {
            head: RecordHead {
                id: "call_000000000000000000000001".into(),
                org_id: "org_a".into(),
                kind: RecordKind::Call,
                started_ms: 0,
                ended_ms: None,
                connector: "cc_a".into(),
                conversation_id: None,
                ani: None,
                dnis: None,
                close_reason: None,
                language: None,
                channels: vec!["Customer".into(), "Agent".into()],
                billed_ms: 0,
                file_name: None,
                duration: None,
                intent: None,
                analyses: None,
            },
            transcript: vec![
                Line {
                    channel: 1,
                    offset: 1.25,
                    duration: 2.0,
                    confidence: 0.9,
                    text: "Thanks for calling.".into(),
                },
                Line {
                    channel: 0,
                    offset: 3661.5,
                    duration: 1.0,
                    confidence: 0.8,
                    text: "I want <b>a refund</b>\n--> now".into(),
                },
            ],
            intents: Vec::new(),
        }
    }

    #[test]
    fn txt_srt_and_vtt_carry_speakers_and_cue_times() {
        let r = record();
        assert_eq!(
            render(&r, Format::Txt),
            "[00:01] Agent: Thanks for calling.\n\
             [1:01:01] Customer: I want <b>a refund</b> -> now\n"
        );
        assert_eq!(
            render(&r, Format::Srt),
            "1\n00:00:01,250 --> 00:00:03,250\nAgent: Thanks for calling.\n\n\
             2\n01:01:01,500 --> 01:01:02,500\nCustomer: I want <b>a refund</b> -> now\n\n"
        );
        assert_eq!(
            render(&r, Format::Vtt),
            "WEBVTT\n\n00:00:01.250 --> 00:00:03.250\n<v Agent>Thanks for calling.\n\n\
             01:01:01.500 --> 01:01:02.500\n<v Customer>I want &lt;b&gt;a refund&lt;/b&gt; -&gt; now\n\n"
        );
        let json: serde_json::Value = serde_json::from_str(&render(&r, Format::Json)).unwrap();
        assert_eq!(json["transcript"][1]["channel"], 0);
        assert_eq!(Format::parse("WebVTT"), Some(Format::Vtt));
        assert_eq!(Format::parse("doc"), None);
    }
}
