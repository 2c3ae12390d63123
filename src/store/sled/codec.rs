//! Encoding of the sled store's values and keys shared by its trees.

use serde::{Deserialize, Serialize};

use crate::store::StoreError;

pub(super) fn backend(e: sled::Error) -> StoreError {
    StoreError::Backend(e.to_string())
}

pub(super) fn decode<T: for<'de> Deserialize<'de>>(
    what: &str,
    bytes: &[u8],
) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt(what.to_owned(), e.to_string()))
}

pub(super) fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("store records are plain data and always serialize")
}

/// `org id /` — the prefix of an organisation's ledger and daily keys.
pub(super) fn org_prefix(org_id: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(org_id.len() + 1);
    key.extend_from_slice(org_id.as_bytes());
    key.push(b'/');
    key
}
