//! The hallucination guard: Whisper writes fluent text over silence, noise, tones and music
//! ("Thank you.", "[MUSIC]", a phrase repeated to the end of the window). A transcript the
//! guard rejects keeps its scores but loses its text and words, so nothing is emitted for it.
//!
//! A decoding loop (a phrase of two or more words said three times or more back to back, or
//! one word four times or more) is rejected when it is all the transcript says, and cut back
//! to one saying when there is other speech around it. A long passage said twice back to back
//! is a loop too: Whisper sometimes reads a window to its end and then again from its start.
//! Its first saying is the speech, so it is only ever cut back, never rejected.

use super::Transcript;

/// Whisper's own no-speech rule: the model thinks there is no speech and the decode is unsure.
/// Whisper uses 0.6 on whole 30 s windows; here the VAD has already found speech, and clear
/// non-English speech (whose first decoding step is less sure) scored 0.61-0.68, so the bar
/// is higher.
const NO_SPEECH_PROB: f32 = 0.75;
const NO_SPEECH_LOGPROB: f32 = -1.0;
/// Below this mean log-probability a decode is noise whatever the no-speech head says.
const MIN_LOGPROB: f32 = -1.6;
/// A phrase of two or more words repeated this many times in a row is a decoding loop.
const LOOP_REPEATS: usize = 3;
/// A single word repeated this many times in a row is a decoding loop ("no, no, no" is not).
const WORD_LOOP_REPEATS: usize = 4;
/// Longest looping phrase looked for, in words.
const MAX_LOOP_WORDS: usize = 8;
/// A passage of this many words or more said twice back to back is a decoding loop: nobody
/// says ten words again word for word without a pause, and a packed window's utterances are
/// separate turns.
const LONG_LOOP_WORDS: usize = 10;

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

/// Clears the text and words of a transcript the guard rejects, and cuts a loop inside a
/// longer transcript back to one saying.
pub fn apply(t: &mut Transcript) {
    if let Some(why) = judge(t) {
        if !t.text.is_empty() {
            tracing::debug!(?why, text = %t.text, avg_logprob = t.avg_logprob,
                no_speech_prob = t.no_speech_prob, "guard dropped a transcript");
        }
        t.text.clear();
        t.words.clear();
        return;
    }
    collapse_loops(t);
}

/// Words compared for repetition: lower case, without punctuation.
fn normalised(text: &str) -> Vec<String> {
    text.split_whitespace()
        .map(|w| {
            w.trim_matches(|c: char| !c.is_alphanumeric())
                .to_lowercase()
        })
        .filter(|w| !w.is_empty())
        .collect()
}

/// The first loop in `words`: (start, phrase length, repeats). Short phrases are looked
/// for first, then, with `long`, passages said twice.
fn find_loop(words: &[String], long: bool) -> Option<(usize, usize, usize)> {
    let longest = if long { words.len() / 2 } else { 0 };
    let lengths = (1..=MAX_LOOP_WORDS).chain(LONG_LOOP_WORDS..=longest);
    for n in lengths {
        let needed = match n {
            1 => WORD_LOOP_REPEATS,
            n if n <= MAX_LOOP_WORDS => LOOP_REPEATS,
            _ => 2,
        };
        for start in 0..words.len() {
            let mut repeats = 1;
            while start + (repeats + 1) * n <= words.len()
                && words[start..start + n] == words[start + repeats * n..start + (repeats + 1) * n]
            {
                repeats += 1;
            }
            if repeats >= needed {
                return Some((start, n, repeats));
            }
        }
    }
    None
}

/// Cuts each loop back to its first saying, in the words (keeping their timings) and the text.
fn collapse_loops(t: &mut Transcript) {
    let before = t.text.clone();
    if t.words.is_empty() {
        let mut pieces: Vec<&str> = t.text.split_whitespace().collect();
        loop {
            let keys: Vec<String> = pieces.iter().map(|p| normalised(p).join(" ")).collect();
            // Pieces that are only punctuation would break the phrase alignment; they are rare
            // in a decode and a loop through them is left alone.
            if keys.iter().any(String::is_empty) {
                break;
            }
            let Some((start, n, repeats)) = find_loop(&keys, true) else {
                break;
            };
            pieces.drain(start + n..start + n * repeats);
        }
        t.text = pieces.join(" ");
    } else {
        loop {
            let keys: Vec<String> = t
                .words
                .iter()
                .map(|w| normalised(&w.text).join(" "))
                .collect();
            if keys.iter().any(String::is_empty) {
                break;
            }
            let Some((start, n, repeats)) = find_loop(&keys, true) else {
                break;
            };
            t.words.drain(start + n..start + n * repeats);
        }
        let text: Vec<&str> = t.words.iter().map(|w| w.text.as_str()).collect();
        let rebuilt = text.join(" ");
        if normalised(&rebuilt) != normalised(&t.text) {
            t.text = rebuilt;
        }
    }
    if t.text != before {
        tracing::debug!(before = %before, after = %t.text, "guard cut a decoding loop");
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

/// True when the text holds a short phrase looping anywhere: the decode is worth repeating
/// with repetition held back, as the loop usually ate the words after it. A passage said
/// twice lost nothing (its first saying is whole) and is only cut back: decoded again with
/// repeats held back, a window of several turns came out worse than its first reading.
pub fn has_loop(text: &str) -> bool {
    find_loop(&normalised(text), false).is_some()
}

/// True when the whole text is one short phrase said over and over (with at most a word
/// around it). A long passage said twice is not: its first saying is the speech.
fn is_loop(text: &str) -> bool {
    let words = normalised(text);
    find_loop(&words, false).is_some_and(|(_, n, repeats)| n * repeats + 1 >= words.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::asr::Word;

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
            judge(&t(
                "and I'm out to this, and I'm out to this, and I'm out to this",
                -0.3,
                0.0
            )),
            Some(Rejection::Loop)
        );
        assert_eq!(judge(&t("No, no, no.", -0.3, 0.0)), None);
    }

    #[test]
    fn a_loop_inside_speech_is_cut_to_one_saying() {
        let mut looped = t(
            "I'd like to pay my bill, pay my bill, pay my bill, pay my bill please.",
            -0.3,
            0.0,
        );
        apply(&mut looped);
        assert_eq!(looped.text, "I'd like to pay my bill, please.");

        let word = |text: &str, start: f64| Word {
            text: text.into(),
            start,
            end: start + 0.2,
            probability: 0.9,
        };
        let mut timed = t("Yes it is it is it is here", -0.3, 0.0);
        timed.words = ["Yes", "it", "is", "it", "is", "it", "is", "here"]
            .iter()
            .enumerate()
            .map(|(i, w)| word(w, i as f64 * 0.3))
            .collect();
        apply(&mut timed);
        assert_eq!(timed.text, "Yes it is here");
        let starts: Vec<f64> = timed.words.iter().map(|w| w.start).collect();
        assert_eq!(starts.len(), 4);
        assert_eq!(starts[3], 7.0 * 0.3);

        let mut fine = t("No, no, no. I said two, two tickets.", -0.3, 0.0);
        apply(&mut fine);
        assert_eq!(fine.text, "No, no, no. I said two, two tickets.");
    }

    #[test]
    fn a_window_read_twice_is_cut_to_its_first_reading() {
        // A packed window's turns, then the decoder starting over from the first of them.
        let turns = "Hello, can I book a call with a mortgage advisor for some time next week? \
                     And afternoon, ideally Monday or Tuesday after 3. Hello,";
        let mut twice = t(&format!("{turns} {turns}"), -0.3, 0.0);
        assert!(!has_loop(&twice.text), "nothing was lost: no second decode");
        assert_eq!(judge(&twice), None, "the first reading is speech");
        apply(&mut twice);
        assert_eq!(twice.text, turns);

        // Said twice with other speech after it, and with word timings.
        let said = "I need the email address for the events team please";
        let text = format!("{said} {said} Lovely, thank you.");
        let mut timed = t(&text, -0.3, 0.0);
        timed.words = text
            .split_whitespace()
            .enumerate()
            .map(|(i, w)| Word {
                text: w.into(),
                start: i as f64 * 0.3,
                end: i as f64 * 0.3 + 0.2,
                probability: 0.9,
            })
            .collect();
        apply(&mut timed);
        assert_eq!(timed.text, format!("{said} Lovely, thank you."));
        assert_eq!(timed.words.len(), 13);
        assert_eq!(timed.words[10].start, 20.0 * 0.3);

        // Shorter repeats and a phrase said again after other words are speech.
        for fine in [
            "Can you hear me now? Can you hear me now?",
            "I want to cancel my order. Yes. I want to cancel my order.",
            "Is there anything else I can help you with? No, is there anything else I can do?",
        ] {
            let mut kept = t(fine, -0.3, 0.0);
            apply(&mut kept);
            assert_eq!(kept.text, fine);
        }
    }

    #[test]
    fn apply_clears_rejected_text() {
        let mut rejected = t("[MUSIC]", -0.2, 0.0);
        apply(&mut rejected);
        assert!(rejected.text.is_empty());
    }
}
