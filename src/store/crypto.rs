//! Sealing secrets at rest with XChaCha20-Poly1305.
//!
//! A sealed value is `nonce (24 bytes) || ciphertext+tag`, with a fresh random nonce each time
//! (192-bit nonces make random choice safe). The record's id is the associated data, so a
//! sealed secret copied onto another record does not open.

use std::io::Write;
use std::path::Path;

use base64::Engine as _;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use rand::RngCore;

use super::StoreError;

const NONCE_LEN: usize = 24;

fn mac(key: &[u8], data: &[u8]) -> [u8; 32] {
    use hmac::Mac;
    let mut m =
        <hmac::Hmac<sha2::Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    m.update(data);
    m.finalize().into_bytes().into()
}
/// Length of the key in bytes.
pub const KEY_LEN: usize = 32;
/// File in the data directory holding a generated key.
pub const KEY_FILE: &str = "secret.key";

/// Seals and opens secrets with one key.
#[derive(Clone)]
pub struct SecretBox {
    cipher: XChaCha20Poly1305,
    /// HMAC-SHA256 of a fixed label under the key: the root of [`SecretBox::derive`], so the
    /// key itself is used for sealing only.
    derive_root: [u8; 32],
}

impl std::fmt::Debug for SecretBox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretBox(..)")
    }
}

/// Why a key could not be had.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The configured key is not base64 of 32 bytes.
    #[error("storage.secret_key must be base64 of 32 bytes: {0}")]
    Malformed(String),
    /// The key file could not be read or written.
    #[error("key file {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
}

impl SecretBox {
    /// A box with the given raw key.
    pub fn new(key: &[u8; KEY_LEN]) -> Self {
        Self {
            cipher: XChaCha20Poly1305::new(key.into()),
            derive_root: mac(key, b"callstream derived keys"),
        }
    }

    /// A 32-byte key for `purpose`, the same wherever the same storage key is configured
    /// (every instance sharing PostgreSQL), and unrelated to keys for other purposes.
    pub fn derive(&self, purpose: &str) -> [u8; 32] {
        mac(&self.derive_root, purpose.as_bytes())
    }

    /// The configured key (base64) if there is one, else the key in `data_dir/secret.key`,
    /// generated there (mode 0600) the first time.
    pub fn from_config(configured: &str, data_dir: &Path) -> Result<Self, KeyError> {
        let configured = configured.trim();
        if !configured.is_empty() {
            return Ok(Self::new(&decode_key(configured)?));
        }
        let path = data_dir.join(KEY_FILE);
        let io = |source| KeyError::Io {
            path: path.display().to_string(),
            source,
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => Ok(Self::new(&decode_key(text.trim())?)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir_all(data_dir).map_err(io)?;
                let mut key = [0u8; KEY_LEN];
                rand::rngs::OsRng.fill_bytes(&mut key);
                let mut options = std::fs::OpenOptions::new();
                options.write(true).create_new(true);
                #[cfg(unix)]
                std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
                let mut file = options.open(&path).map_err(io)?;
                let text = base64::engine::general_purpose::STANDARD.encode(key);
                file.write_all(text.as_bytes()).map_err(io)?;
                file.sync_all().map_err(io)?;
                Ok(Self::new(&key))
            }
            Err(e) => Err(io(e)),
        }
    }

    /// Seals `plaintext`, bound to `record_id`.
    pub fn seal(&self, record_id: &str, plaintext: &[u8]) -> Vec<u8> {
        let mut nonce = [0u8; NONCE_LEN];
        rand::rngs::OsRng.fill_bytes(&mut nonce);
        let payload = Payload {
            msg: plaintext,
            aad: record_id.as_bytes(),
        };
        let ciphertext = self
            .cipher
            .encrypt(XNonce::from_slice(&nonce), payload)
            .expect("XChaCha20-Poly1305 encryption fails only past 256 GiB per message");
        let mut sealed = Vec::with_capacity(NONCE_LEN + ciphertext.len());
        sealed.extend_from_slice(&nonce);
        sealed.extend_from_slice(&ciphertext);
        sealed
    }

    /// Opens what [`SecretBox::seal`] made for the same `record_id`.
    pub fn open(&self, record_id: &str, sealed: &[u8]) -> Result<Vec<u8>, StoreError> {
        if sealed.len() < NONCE_LEN {
            return Err(StoreError::Decrypt);
        }
        let (nonce, ciphertext) = sealed.split_at(NONCE_LEN);
        let payload = Payload {
            msg: ciphertext,
            aad: record_id.as_bytes(),
        };
        self.cipher
            .decrypt(XNonce::from_slice(nonce), payload)
            .map_err(|_| StoreError::Decrypt)
    }
}

fn decode_key(text: &str) -> Result<[u8; KEY_LEN], KeyError> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| KeyError::Malformed(e.to_string()))?;
    bytes
        .try_into()
        .map_err(|b: Vec<u8>| KeyError::Malformed(format!("{} bytes", b.len())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seal_open_round_trip_and_binding() {
        let sb = SecretBox::new(&[7; KEY_LEN]);
        let sealed = sb.seal("cc_1", b"top secret");
        assert!(!sealed.windows(10).any(|w| w == b"top secret"));
        assert_eq!(sb.open("cc_1", &sealed).unwrap(), b"top secret");
        assert!(matches!(sb.open("cc_2", &sealed), Err(StoreError::Decrypt)));
        let other = SecretBox::new(&[8; KEY_LEN]);
        assert!(matches!(
            other.open("cc_1", &sealed),
            Err(StoreError::Decrypt)
        ));
        assert!(matches!(
            sb.open("cc_1", &sealed[..5]),
            Err(StoreError::Decrypt)
        ));
    }

    #[test]
    fn generated_key_is_kept_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let first = SecretBox::from_config("", dir.path()).unwrap();
        let sealed = first.seal("id", b"x");
        let again = SecretBox::from_config("", dir.path()).unwrap();
        assert_eq!(again.open("id", &sealed).unwrap(), b"x");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join(KEY_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn configured_key_must_be_32_bytes() {
        let dir = tempfile::tempdir().unwrap();
        assert!(SecretBox::from_config("c2hvcnQ=", dir.path()).is_err());
        let key = base64::engine::general_purpose::STANDARD.encode([1u8; 32]);
        assert!(SecretBox::from_config(&key, dir.path()).is_ok());
        assert!(!dir.path().join(KEY_FILE).exists());
    }
}
