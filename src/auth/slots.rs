//! Places under caps: an organisation's concurrent live calls, realtime sessions and file
//! transcriptions, a connector's calls, a key's realtime sessions. A place is held for as long
//! as its [`Slot`] lives. They are counted in the shared state ([`SharedState::take_place`]),
//! so with several instances on one PostgreSQL a cap holds in total, not per instance.

use std::sync::Arc;

use crate::store::{SharedState, StoreError};

/// Takes places in the shared state.
pub struct Slots {
    shared: Arc<dyn SharedState>,
}

/// A place taken in [`Slots`]; dropping it frees the place.
pub struct Slot {
    shared: Arc<dyn SharedState>,
    name: String,
    holder: String,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot").field("name", &self.name).finish()
    }
}

impl Slots {
    /// Places kept in `shared`.
    pub fn new(shared: Arc<dyn SharedState>) -> Self {
        Self { shared }
    }

    /// Takes a place under `name` if fewer than `max` are taken; `None` when all are.
    pub async fn try_acquire(&self, name: &str, max: usize) -> Result<Option<Slot>, StoreError> {
        let holder = uuid::Uuid::new_v4().simple().to_string();
        if !self.shared.take_place(name, &holder, max).await? {
            return Ok(None);
        }
        Ok(Some(Slot {
            shared: self.shared.clone(),
            name: name.to_owned(),
            holder,
        }))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.shared.leave_place(&self.name, &self.holder);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn places_are_capped_and_given_back() {
        let slots = Slots::new(Arc::new(crate::store::shared::Local::default()));
        let a = slots.try_acquire("k", 2).await.unwrap().unwrap();
        let b = slots.try_acquire("k", 2).await.unwrap().unwrap();
        assert!(slots.try_acquire("k", 2).await.unwrap().is_none());
        assert!(slots.try_acquire("other", 2).await.unwrap().is_some());
        drop(a);
        let _c = slots.try_acquire("k", 2).await.unwrap().unwrap();
        assert!(slots.try_acquire("k", 2).await.unwrap().is_none());
        drop(b);
        assert!(slots.try_acquire("k", 2).await.unwrap().is_some());
    }
}
