//! Caps on what one caller holds open at once (realtime sessions per API key, live calls per
//! connector and per organisation): a count per name, and a [`Slot`] guard that gives its place
//! back when dropped, however the session or call ends.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

/// Counts of open things by name.
#[derive(Debug, Default)]
pub struct Slots {
    // A parking_lot Mutex: a map update per open and close, never held across an await.
    counts: Mutex<HashMap<String, usize>>,
}

/// A place taken in [`Slots`]; dropping it frees the place.
#[derive(Debug)]
pub struct Slot {
    slots: Arc<Slots>,
    name: String,
}

impl Slots {
    /// Takes a place under `name` if fewer than `max` are taken.
    pub fn try_acquire(self: &Arc<Self>, name: &str, max: usize) -> Option<Slot> {
        let mut counts = self.counts.lock();
        let count = counts.entry(name.to_owned()).or_default();
        if *count >= max {
            return None;
        }
        *count += 1;
        Some(Slot {
            slots: self.clone(),
            name: name.to_owned(),
        })
    }

    /// Places taken under `name`.
    pub fn taken(&self, name: &str) -> usize {
        self.counts.lock().get(name).copied().unwrap_or(0)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = self.slots.counts.lock();
        if let Some(count) = counts.get_mut(&self.name) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.name);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_capped_and_given_back() {
        let slots = Arc::new(Slots::default());
        let a = slots.try_acquire("k", 2).unwrap();
        let b = slots.try_acquire("k", 2).unwrap();
        assert!(slots.try_acquire("k", 2).is_none());
        assert!(slots.try_acquire("other", 2).is_some());
        drop(a);
        assert_eq!(slots.taken("k"), 1);
        let _c = slots.try_acquire("k", 2).unwrap();
        drop(b);
        assert_eq!(slots.taken("k"), 1);
    }
}
