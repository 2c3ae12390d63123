//! Drafted tokens: what may come next, looked up in the prompt and the answer so far.

use llama_cpp_2::token::LlamaToken;

/// Longest run of the latest tokens looked up, and shortest.
pub(super) const DRAFT_MATCH: (usize, usize) = (4, 2);

/// Up to `most` tokens that may come next in `seen` (the prompt and the answer so far), looked
/// up in `seen` itself: what followed the latest earlier occurrence of its last 4 tokens (or
/// 3, or 2). A structured answer repeats much of its prompt: quotes of the transcript, the
/// field names and layout of the worked examples. Empty when nothing matches.
pub(super) fn draft(seen: &[LlamaToken], most: usize) -> Vec<LlamaToken> {
    let (longest, shortest) = DRAFT_MATCH;
    if most == 0 {
        return Vec::new();
    }
    for n in (shortest..=longest.min(seen.len().saturating_sub(1))).rev() {
        let tail = &seen[seen.len() - n..];
        // Latest occurrence that is not the tail itself.
        if let Some(start) = (0..seen.len() - n).rev().find(|&i| &seen[i..i + n] == tail) {
            let from = start + n;
            let until = (from + most).min(seen.len());
            if from < until {
                return seen[from..until].to_vec();
            }
        }
    }
    Vec::new()
}

/// How many leading tokens `a` and `b` share.
pub(super) fn common_prefix(a: &[LlamaToken], b: &[LlamaToken]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drafts_follow_the_latest_earlier_occurrence_of_the_last_tokens() {
        let t = |v: &[i32]| v.iter().map(|&x| LlamaToken(x)).collect::<Vec<_>>();
        // The last four tokens seen before: what followed them, up to `most`.
        let seen = t(&[9, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4]);
        assert_eq!(draft(&seen, 3), t(&[5, 6, 7]));
        // Only the last two were seen before: the latest of their occurrences counts.
        let seen = t(&[1, 2, 7, 1, 2, 8, 5, 1, 2]);
        assert_eq!(draft(&seen, 2), t(&[8, 5]));
        // A draft stops where what is seen ends.
        let seen = t(&[1, 2, 3, 1, 2]);
        assert_eq!(draft(&seen, 8), t(&[3, 1, 2]));
        // Nothing seen before, too little seen, or no room: no draft.
        assert!(draft(&t(&[1, 2, 3, 4]), 8).is_empty());
        assert!(draft(&t(&[1, 1]), 8).is_empty());
        assert!(draft(&t(&[1, 2, 1, 2]), 0).is_empty());
        assert_eq!(draft(&t(&[1, 2, 1, 2]), 8), t(&[1, 2]));
    }
}
