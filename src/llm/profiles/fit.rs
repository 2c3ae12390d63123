//! A transcript fitted to the model's window: shortened from its middle until the prompt and
//! the answer fit.

use super::*;
use crate::llm::{Generation, LlmError, Odds, Provider, Sampling};

/// Most tokens an analysis may answer with: room for the longest record the schemas allow in
/// ordinary text (an answer cut short would not parse). The same for every profile, so that
/// the three analyses of a long transcript leave out the same lines of it.
pub(super) const ANSWER_TOKENS: u32 = 1280;

/// Characters per token of English text, for a first guess at how much of a transcript to
/// leave out (the model then counts again).
pub(super) const CHARS_PER_TOKEN: usize = 4;

/// Times a transcript is shortened to fit the model's window before the analysis gives up.
pub(super) const FIT_ATTEMPTS: usize = 4;

/// Asks the model for analysis `kind` of `transcript`. A transcript too long for the model's
/// window, with room for the answer, is shortened from its middle (the opening, where callers
/// say why they call, and the end, where they agree on next steps, are kept) until it fits.
pub(super) async fn generate_fitted(
    provider: &dyn Provider,
    kind: ProfileKind,
    layout: Layout,
    transcript: &str,
    seller: Option<&str>,
) -> Result<crate::llm::Completion, LlmError> {
    let confidence = Confidence::of(provider);
    let shown = profile_for(kind, confidence);
    let mut fitted = std::borrow::Cow::Borrowed(transcript);
    let mut attempts = 0;
    loop {
        let generation = Generation {
            messages: messages(kind, layout, confidence, &fitted),
            tools: Vec::new(),
            sampling: Sampling {
                max_tokens: ANSWER_TOKENS,
                temperature: 0.0,
                ..Sampling::default()
            },
            json_schema: Some(match kind {
                ProfileKind::Intent => shown.schema.clone(),
                _ if provider.keeps_to_any_schema() => {
                    let (buyer, said) = quotable(&fitted, seller);
                    quoting(&shown.schema, &buyer, &said)
                }
                _ => shown.schema.clone(),
            }),
            response_format: None,
            tenant: None,
            class: crate::llm::fair::Class::default(),
            odds: Some(if kind == ProfileKind::Intent {
                Odds {
                    after: INTENT_AT.to_owned(),
                    words: intent_labels().to_vec(),
                    floor: intent_labels()
                        .iter()
                        .position(|l| l == NO_FIT)
                        .map(|at| (at, NO_FIT_SURE)),
                    only: false,
                }
            } else {
                Odds {
                    after: STATUS_AT.to_owned(),
                    words: STATUSES.iter().map(|s| s.to_string()).collect(),
                    floor: Some((STATUSES.len() - 1, NOT_FOUND_SURE)),
                    only: false,
                }
            }),
        };
        match provider.generate(generation, None).await {
            Err(LlmError::ContextOverflow { prompt, limit }) if attempts < FIT_ATTEMPTS => {
                attempts += 1;
                // Whole steps of 256 tokens: the three analyses' prompts differ by a few
                // tokens, and should still leave out the same lines.
                let excess = (prompt + ANSWER_TOKENS as usize)
                    .saturating_sub(limit)
                    .max(1)
                    .div_ceil(256)
                    * 256;
                match leave_out_middle(&fitted, excess * CHARS_PER_TOKEN) {
                    Some(shorter) => {
                        tracing::debug!(
                            ?kind,
                            prompt,
                            limit,
                            chars = shorter.len(),
                            "transcript shortened to fit the model's window"
                        );
                        fitted = std::borrow::Cow::Owned(shorter);
                    }
                    None => return Err(LlmError::ContextOverflow { prompt, limit }),
                }
            }
            other => return other,
        }
    }
}

/// `transcript` without at least `chars` characters of whole lines from its middle, which a
/// line saying how many were left out replaces; `None` when that would leave out everything.
pub(super) fn leave_out_middle(transcript: &str, chars: usize) -> Option<String> {
    let lines: Vec<&str> = transcript.lines().collect();
    let marker = |n: usize| format!("[{n} lines of the conversation left out]");
    // An earlier cut's marker is where the gap widens from; its count is carried over.
    let earlier = lines
        .iter()
        .position(|l| l.starts_with('[') && l.ends_with("left out]"));
    let carried: usize = earlier
        .and_then(|at| lines[at][1..].split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    let n = lines.len();
    let (mut lo, mut hi) = earlier.map_or((n / 2, n / 2), |at| (at, at + 1));
    let size = |l: &str| l.len() + 1;
    let (mut before, mut after): (usize, usize) = (
        lines[..lo].iter().map(|l| size(l)).sum(),
        lines[hi..].iter().map(|l| size(l)).sum(),
    );
    let mut removed: usize = lines[lo..hi].iter().map(|l| size(l)).sum();
    let wanted = chars + marker(0).len();
    while removed < wanted {
        // Take from the longer side, so the opening and the end stay about as long.
        if lo > 0 && (hi == n || before >= after) {
            lo -= 1;
            before -= size(lines[lo]);
            removed += size(lines[lo]);
        } else if hi < n {
            after -= size(lines[hi]);
            removed += size(lines[hi]);
            hi += 1;
        } else {
            break;
        }
    }
    if lo == 0 && hi == n {
        return None;
    }
    let left_out = hi - lo - usize::from(earlier.is_some()) + carried;
    let mut out = String::with_capacity(transcript.len());
    for line in &lines[..lo] {
        out.push_str(line);
        out.push('\n');
    }
    out.push_str(&marker(left_out));
    out.push('\n');
    for line in &lines[hi..] {
        out.push_str(line);
        out.push('\n');
    }
    Some(out)
}
