//! What the evidence check (`profiles::check`) did to a record, counted for `bench analysis`.

use crate::llm::Usage;

/// What the evidence check did to a record.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Checked {
    /// Quotes the model sorted by topic (each quote once).
    pub sorted: usize,
    /// Quotes dropped as not about their field.
    pub dropped: usize,
    /// Fields whose quotes were all dropped and that got a sentence closer to their summary.
    pub repaired: usize,
    /// Fields whose quotes were all weak, or shared no word with their summary, and that got a
    /// sentence closer to their summary clearly on their topic in their place.
    pub replaced: usize,
    /// Fields left without evidence, so `not_found`.
    pub cleared: usize,
    /// Fields in doubt (see `profiles::check`): reported only because the model was held back
    /// from calling them `not_found`, or summarised in a worked example's words.
    pub doubted: usize,
    /// Of those, the fields whose evidence passed the check.
    pub doubted_kept: usize,
    /// Times a clause of a quote, sorted alone, was likelier on the field's topic than the
    /// whole quote.
    pub by_clause: usize,
    /// Quotes dropped as about other figures than their field's summary claims.
    pub other_figures: usize,
    /// Fields given the buyer's sentence that names the figures their summary claims.
    pub figures_found: usize,
    /// Fields whose summary claims a figure no sentence of the buyer's on the field's topic
    /// names (identified ones step down to partial).
    pub figures_unsaid: usize,
    /// Fields of an amount whose summary claims one the buyer never said on the field's topic,
    /// given the buyer's sentence that names an amount and is clearly on it.
    pub amounts_found: usize,
    /// Quotes dropped from one field that back another the record had left `not_found`.
    pub moved: usize,
    /// Summaries that gave a figure the buyer took back, given the one they settled on.
    pub restated: usize,
    /// Needs whose quotes, and the sentences closest to their summary, were all off the
    /// topic, given the buyer's sentence about a problem (see `stated_need`).
    pub needs_found: usize,
    /// Fields given their quote as their summary: their summary spoke of another sentence off
    /// the topic, or claimed a figure the quotes do not name.
    pub resummarised: usize,
    /// Timelines called partial whose quotes name a date, so identified (see `settle_stated`).
    pub dated: usize,
    /// Budgets called identified whose quotes name no amount, so partial.
    pub amountless: usize,
    /// Budgets called partial whose quotes name the amount their summary claims, so
    /// identified.
    pub amounted: usize,
    /// Quotes dropped from a field because another field quoting the same sentence fits it
    /// better.
    pub unshared: usize,
    /// Tokens the check spent (also counted in the analysis's usage).
    pub usage: Usage,
}

impl std::ops::AddAssign for Checked {
    fn add_assign(&mut self, other: Self) {
        self.sorted += other.sorted;
        self.dropped += other.dropped;
        self.repaired += other.repaired;
        self.replaced += other.replaced;
        self.cleared += other.cleared;
        self.doubted += other.doubted;
        self.doubted_kept += other.doubted_kept;
        self.by_clause += other.by_clause;
        self.other_figures += other.other_figures;
        self.figures_found += other.figures_found;
        self.figures_unsaid += other.figures_unsaid;
        self.amounts_found += other.amounts_found;
        self.moved += other.moved;
        self.restated += other.restated;
        self.needs_found += other.needs_found;
        self.resummarised += other.resummarised;
        self.dated += other.dated;
        self.amountless += other.amountless;
        self.amounted += other.amounted;
        self.unshared += other.unshared;
        self.usage += other.usage;
    }
}
