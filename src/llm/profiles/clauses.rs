//! The clauses of a quote: the pieces of one sentence that each say something, for the
//! evidence check (`check`) to sort apart.

/// Fewest words each clause of a quote must have for the clauses to be sorted apart (see
/// [`clauses`]).
pub(super) const CLAUSE_WORDS: usize = 4;

/// Most clauses of one quote sorted apart.
const MOST_CLAUSES: usize = 3;

/// The clauses of `quote`, for sorting apart: its pieces between commas, semicolons and
/// colons, when at least two have [`CLAUSE_WORDS`] words or more (at most [`MOST_CLAUSES`]);
/// else none. A mark counts where white space follows it. A shorter piece is no clause of its
/// own but part of the one after it (the last, of the one before): a greeting or a "well," does
/// not keep the rest of a sentence from being sorted apart ("Hello, I'm the IT lead, and I
/// decide on software here."). One sentence often says two things ("I'm the operations
/// director, and I sign off purchases up to 50,000 dollars myself."), and sorted whole it is
/// given to the one its words lean to: the authority's own sentence then looks like a budget.
/// Clauses only choose between sentences for a field that is kept anyway, but for the check's
/// `BY_CLAUSE` topics: sorted alone, a clause such as "but it's behind opening our fourth
/// clinic," passes for a timing where nobody named one.
pub(super) fn clauses(quote: &str) -> Vec<&str> {
    let at = |piece: &str| piece.as_ptr() as usize - quote.as_ptr() as usize;
    let mut spans: Vec<(usize, usize)> = Vec::new();
    // Short pieces not yet part of a clause: where the first starts, where the last ends.
    let mut short: Option<(usize, usize)> = None;
    for piece in super::cut_after(quote, &[',', ';', ':']) {
        let (from, to) = (at(piece), at(piece) + piece.len());
        let from = short.take().map_or(from, |(start, _)| start);
        if super::words(&quote[from..to]).len() >= CLAUSE_WORDS {
            spans.push((from, to));
        } else {
            short = Some((from, to));
        }
    }
    if let (Some((_, to)), Some(last)) = (short, spans.last_mut()) {
        last.1 = to;
    }
    if spans.len() < 2 {
        return Vec::new();
    }
    spans
        .into_iter()
        .take(MOST_CLAUSES)
        .map(|(from, to)| &quote[from..to])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quote_has_clauses_only_when_two_of_its_pieces_say_something() {
        assert_eq!(
            clauses("Our records take ten hours a week, which costs us 2,000 dollars a month."),
            [
                "Our records take ten hours a week,",
                "which costs us 2,000 dollars a month."
            ]
        );
        // A short piece ("Yes,") is no clause of its own but part of the next (the last, of
        // the one before); one sentence is none either.
        assert!(clauses("Yes, we have around eight thousand pounds for the vans.").is_empty());
        assert_eq!(
            clauses("Hello, I'm the IT lead, and I decide on software here, mostly."),
            [
                "Hello, I'm the IT lead,",
                "and I decide on software here, mostly."
            ]
        );
        assert!(clauses("Well, fine, we need it before June.").is_empty());
        assert!(clauses("We need it before June.").is_empty());
        assert_eq!(
            clauses("One two three four, five six seven eight; nine ten eleven twelve: a b c d, e f g h").len(),
            MOST_CLAUSES
        );
    }
}
