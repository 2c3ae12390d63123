//! Secrets handed to customers: API keys and connector client secrets.

use base64::Engine as _;
use rand::{Rng, RngCore};
use sha2::{Digest, Sha256};

/// Prefix of every API key secret, so a leaked one is recognisable in logs and scanners.
pub const API_KEY_PREFIX: &str = "cs_";
const API_KEY_RANDOM_CHARS: usize = 40;
const BASE62: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
/// Bytes of a connector client secret (the HMAC-SHA256 key).
pub const CLIENT_SECRET_BYTES: usize = 32;

/// A new API key secret: `cs_` and 40 base62 characters (about 238 random bits).
pub fn new_api_key_secret() -> String {
    let mut rng = rand::rngs::OsRng;
    let mut secret = String::with_capacity(API_KEY_PREFIX.len() + API_KEY_RANDOM_CHARS);
    secret.push_str(API_KEY_PREFIX);
    for _ in 0..API_KEY_RANDOM_CHARS {
        secret.push(char::from(BASE62[rng.gen_range(0..BASE62.len())]));
    }
    secret
}

/// SHA-256 of a secret as presented on the wire.
pub fn hash_secret(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// Lower-case hex of a hash.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The last four characters of a secret, the part that may be shown again.
pub fn last4(secret: &str) -> String {
    let start = secret.char_indices().rev().nth(3).map_or(0, |(i, _)| i);
    secret[start..].to_owned()
}

/// A new connector client secret: the raw key, and its base64 form that the customer pastes
/// into the platform (AudioHook signs with the base64-decoded secret).
pub fn new_client_secret() -> ([u8; CLIENT_SECRET_BYTES], String) {
    let mut key = [0u8; CLIENT_SECRET_BYTES];
    rand::rngs::OsRng.fill_bytes(&mut key);
    let text = base64::engine::general_purpose::STANDARD.encode(key);
    (key, text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_key_shape() {
        let a = new_api_key_secret();
        let b = new_api_key_secret();
        assert_ne!(a, b);
        assert_eq!(a.len(), 43);
        assert!(a.starts_with("cs_"));
        assert!(a[3..].bytes().all(|c| c.is_ascii_alphanumeric()));
        assert_eq!(last4(&a), &a[39..]);
        assert_eq!(last4("ab"), "ab");
    }

    #[test]
    fn hash_is_sha256() {
        assert_eq!(
            hex(&hash_secret("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn client_secret_text_decodes_to_key() {
        let (key, text) = new_client_secret();
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(&text)
            .unwrap();
        assert_eq!(decoded, key);
    }
}
