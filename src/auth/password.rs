//! Dashboard passwords: argon2id with a random salt per password, stored as a PHC string.

use argon2::password_hash::rand_core::OsRng;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;

/// The PHC string of `password` (argon2id, default parameters, random salt).
pub fn hash(password: &str) -> String {
    let salt = SaltString::generate(&mut OsRng);
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .expect("argon2 hashes any password with a generated salt")
        .to_string()
}

/// True when `password` matches the PHC string `stored`.
pub fn verify(password: &str, stored: &str) -> bool {
    PasswordHash::new(stored).is_ok_and(|h| {
        Argon2::default()
            .verify_password(password.as_bytes(), &h)
            .is_ok()
    })
}

/// Spends about the time of a real verification, for unknown users.
pub fn verify_nothing(password: &str) {
    static DECOY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let decoy = DECOY.get_or_init(|| hash("decoy password that matches nothing"));
    let _ = verify(password, decoy);
}

#[cfg(test)]
mod tests {
    #[test]
    fn hashes_verify_and_are_salted() {
        let a = super::hash("correct horse battery");
        let b = super::hash("correct horse battery");
        assert_ne!(a, b);
        assert!(a.starts_with("$argon2id$"));
        assert!(super::verify("correct horse battery", &a));
        assert!(!super::verify("correct horse battery!", &a));
        assert!(!super::verify("x", "not a hash"));
    }
}
