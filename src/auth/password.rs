//! Dashboard passwords: argon2id with a random salt per password, stored as a PHC string,
//! checked on a small pool of threads of their own ([`PasswordPool`]) so that a flood of
//! sign-ins cannot take the threads other work (billing writes, file decoding) runs on.

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

/// Password checks waiting or running exceed what the pool takes.
#[derive(Debug, thiserror::Error)]
#[error("too many sign-ins are being checked; try again in a moment")]
pub struct Busy;

type Check = (Option<String>, String, tokio::sync::oneshot::Sender<bool>);

/// A bounded pool of threads that check passwords: `workers` at once, `queue` more waiting;
/// past that a check is refused at once with [`Busy`].
#[derive(Debug, Clone)]
pub struct PasswordPool {
    jobs: crossbeam_channel::Sender<Check>,
}

impl PasswordPool {
    /// Starts `workers` threads with room for `queue` waiting checks.
    pub fn new(workers: usize, queue: usize) -> Self {
        let (jobs, rx) = crossbeam_channel::bounded::<Check>(queue);
        for i in 0..workers.max(1) {
            let rx = rx.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("password-{i}"))
                .spawn(move || {
                    for (stored, password, done) in rx.iter() {
                        let ok = match stored {
                            Some(stored) => verify(&password, &stored),
                            None => {
                                verify_nothing(&password);
                                false
                            }
                        };
                        let _ = done.send(ok);
                    }
                });
            if let Err(e) = spawned {
                tracing::error!(error = %e, "cannot start a password thread");
            }
        }
        Self { jobs }
    }

    /// True when `password` matches `stored`; with no stored hash (an unknown user) it spends
    /// the same time and answers false.
    pub async fn check(&self, stored: Option<String>, password: String) -> Result<bool, Busy> {
        let (done, answer) = tokio::sync::oneshot::channel();
        self.jobs
            .try_send((stored, password, done))
            .map_err(|_| Busy)?;
        answer.await.map_err(|_| Busy)
    }
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

    #[tokio::test]
    async fn the_pool_checks_and_refuses_past_its_queue() {
        let stored = super::hash("secret");
        let pool = super::PasswordPool::new(1, 1);
        assert!(pool
            .check(Some(stored.clone()), "secret".into())
            .await
            .unwrap());
        assert!(!pool
            .check(Some(stored.clone()), "wrong".into())
            .await
            .unwrap());
        assert!(!pool.check(None, "anything".into()).await.unwrap());
        // One running, one waiting: the rest are refused at once.
        let checks: Vec<_> = (0..6)
            .map(|_| {
                let pool = pool.clone();
                let stored = stored.clone();
                tokio::spawn(async move { pool.check(Some(stored), "secret".into()).await })
            })
            .collect();
        let mut refused = 0;
        for c in checks {
            if c.await.unwrap().is_err() {
                refused += 1;
            }
        }
        assert!(refused >= 1, "{refused} refused");
    }
}
