//! The hallucination guard: Whisper writes fluent text over silence, noise, tones and music
//! ("Thank you.", "[MUSIC]", a phrase repeated to the end of the window). A transcript the
//! guard rejects keeps its scores but loses its text and words, so nothing is emitted for it.

use super::Transcript;

/// Whisper's own no-speech rule: the model thinks there is no speech and the decode is unsure.
const NO_SPEECH_PROB: f32 = 0.6;
const NO_SPEECH_LOGPROB: f32 = -1.0;
/// Below this mean log-probability a decode is noise whatever the no-speech head says.
const MIN_LOGPROB: f32 = -1.6;
/// A phrase repeated this many times in a row is a decoding loop.
const LOOP_REPEATS: usize = 4;

/// Why a transcript was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// The no-speech rule, or a very unsure decode.
    NoSpeech,
    /// Only punctuation, symbols or a bracketed sound annotation.
    NotWords,
    /// A phrase repeated over and over.
    Loop,
}

/// Judges a transcript; `None` keeps it.
pub fn judge(t: &Transcript) -> Option<Rejection> {
    if (t.no_speech_prob > NO_SPEECH_PROB && t.avg_logprob < NO_SPEECH_LOGPROB)
        || t.avg_logprob < MIN_LOGPROB
    {
        return Some(Rejection::NoSpeech);
    }
    if !has_words(&t.text) {
        return Some(Rejection::NotWords);
    }
    if is_loop(&t.text) {
        return Some(Rejection::Loop);
    }
    None
}

/// Clears the text and words of a transcript the guard rejects.
pub fn apply(t: &mut Transcript) {
    if let Some(why) = judge(t) {
        if !t.text.is_empty() {
            tracing::debug!(?why, text = %t.text, "guard dropped a transcript");
        }
        t.text.clear();
        t.words.clear();
    }
}

/// True when something outside bracketed annotations is alphanumeric.
fn has_words(text: &str) -> bool {
    let mut depth = 0i32;
    let mut starred = false;
    for c in text.chars() {
        match c {
            '[' | '(' => depth += 1,
            ']' | ')' => depth = (depth - 1).max(0),
            '*' => starred = !starred,
            c if depth == 0 && !starred && c.is_alphanumeric() => return true,
            _ => {}
        }
    }
    false
}

/// True when some run of 1 to 6 words repeats `LOOP_REPEATS` times back to back.
fn is_loop(text: &str) -> bool {
    let words: Vec<String> = text
        .split_whitespace()
        .map(|w| {
            w.trim_matches(|c: char| !c.is_alphanumeric())
                .to_lowercase()
        })
        .filter(|w| !w.is_empty())
        .collect();
    for n in 1..=6 {
        for start in 0..words.len() {
            let mut repeats = 1;
            while start + (repeats + 1) * n <= words.len()
                && words[start..start + n] == words[start + repeats * n..start + (repeats + 1) * n]
            {
                repeats += 1;
            }
            if repeats >= LOOP_REPEATS {
                return true;
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(text: &str, avg_logprob: f32, no_speech_prob: f32) -> Transcript {
        Transcript {
            text: text.into(),
            start: 0.0,
            end: 1.0,
            confidence: avg_logprob.exp(),
            avg_logprob,
            no_speech_prob,
            words: Vec::new(),
        }
    }

    #[test]
    fn keeps_ordinary_speech() {
        assert_eq!(
            judge(&t("I'd like to check my order status.", -0.3, 0.01)),
            None
        );
        assert_eq!(judge(&t("No, no, no.", -0.4, 0.1)), None);
        assert_eq!(judge(&t("It's 42.", -0.5, 0.2)), None);
    }

    #[test]
    fn rejects_no_speech_and_unsure_decodes() {
        assert_eq!(
            judge(&t("Thank you.", -1.2, 0.8)),
            Some(Rejection::NoSpeech)
        );
        assert_eq!(judge(&t("you", -1.9, 0.1)), Some(Rejection::NoSpeech));
    }

    #[test]
    fn rejects_annotations_and_symbols() {
        for text in [
            "",
            "...",
            "♪ ♪",
            "[MUSIC]",
            "(phone ringing)",
            "*beep*",
            "[BLANK_AUDIO]",
        ] {
            assert_eq!(
                judge(&t(text, -0.2, 0.0)),
                Some(Rejection::NotWords),
                "{text:?}"
            );
        }
        assert_eq!(judge(&t("[music] Hello there", -0.2, 0.0)), None);
    }

    #[test]
    fn rejects_loops() {
        assert_eq!(
            judge(&t("Thank you. Thank you. Thank you. Thank you.", -0.2, 0.0)),
            Some(Rejection::Loop)
        );
        assert_eq!(judge(&t("so so so so", -0.2, 0.0)), Some(Rejection::Loop));
        assert_eq!(
            judge(&t("one two three, one two three, one two three", -0.2, 0.0)),
            None
        );
    }

    #[test]
    fn apply_clears_rejected_text() {
        let mut rejected = t("[MUSIC]", -0.2, 0.0);
        apply(&mut rejected);
        assert!(rejected.text.is_empty());
    }
}
