//! Dashboard sign-in: sessions (random 256-bit tokens mapped to the signed-in administrator,
//! their organisation and the CSRF token every form of theirs must carry; they last 12 hours
//! and live in memory, so a restart signs everyone out), and what guards the sign-in form
//! ([`SignIn`]): single-use form tokens, attempt limits per client address and per account,
//! and the password threads.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use super::password::PasswordPool;
use super::ratelimit::RateLimiter;
use crate::clock;
use crate::config::DashboardConfig;

/// How long a session lasts.
pub const SESSION_MS: i64 = 12 * 3600 * 1000;

/// A signed-in administrator.
#[derive(Debug, Clone)]
pub struct Session {
    /// Sign-in name.
    pub email: String,
    /// The organisation they administer.
    pub org_id: String,
    /// The token every form must carry.
    pub csrf: String,
    expires_ms: i64,
}

/// Sessions in progress.
#[derive(Debug, Default)]
pub struct Sessions {
    // A std Mutex: a map lookup per request, never held across an await.
    map: Mutex<HashMap<String, Session>>,
}

/// A random 256-bit token, hex.
pub fn token() -> String {
    crate::auth::keys::hex(&rand::random::<[u8; 32]>())
}

impl Sessions {
    /// Starts a session for `email` of `org_id`: its id and the session.
    pub fn start(&self, email: String, org_id: String) -> (String, Session) {
        let session = Session {
            email,
            org_id,
            csrf: token(),
            expires_ms: clock::now_ms() + SESSION_MS,
        };
        let id = token();
        let mut map = self.map.lock().expect("session lock is never poisoned");
        let now = clock::now_ms();
        map.retain(|_, s| s.expires_ms > now);
        map.insert(id.clone(), session.clone());
        (id, session)
    }

    /// The live session `id`, if any.
    pub fn get(&self, id: Option<&str>) -> Option<Session> {
        let id = id?;
        let map = self.map.lock().expect("session lock is never poisoned");
        map.get(id)
            .filter(|s| s.expires_ms > clock::now_ms())
            .cloned()
    }

    /// Ends session `id`.
    pub fn end(&self, id: Option<&str>) {
        if let Some(id) = id {
            self.map
                .lock()
                .expect("session lock is never poisoned")
                .remove(id);
        }
    }
}

/// How long a sign-in form may be sent back.
const FORM_MS: i64 = 30 * 60 * 1000;
/// Most sign-in forms outstanding at once; past this the oldest are forgotten.
const MAX_FORMS: usize = 10_000;

/// Why a sign-in is not even checked.
#[derive(Debug, PartialEq, Eq)]
pub enum SignInRefused {
    /// The form token is unknown, used or expired.
    Form,
    /// Too many attempts from this address or for this account; try again after this long.
    TooMany(std::time::Duration),
}

/// What guards the sign-in form.
#[derive(Debug)]
pub struct SignIn {
    forms: Mutex<HashMap<String, i64>>,
    attempts: RateLimiter,
    per_address: u32,
    per_account: u32,
    /// The password threads.
    pub passwords: PasswordPool,
}

impl SignIn {
    /// Guards with the limits of `config`.
    pub fn new(config: &DashboardConfig) -> Self {
        Self {
            forms: Mutex::default(),
            attempts: RateLimiter::default(),
            per_address: config.sign_in_per_minute_per_address,
            per_account: config.sign_in_per_minute_per_account,
            passwords: PasswordPool::new(config.password_workers, config.password_queue),
        }
    }

    /// A new single-use form token.
    pub fn issue(&self) -> String {
        let t = token();
        let now = clock::now_ms();
        let mut forms = self.forms.lock().expect("form lock is never poisoned");
        forms.retain(|_, expires| *expires > now);
        if forms.len() >= MAX_FORMS {
            if let Some(oldest) = forms
                .iter()
                .min_by_key(|(_, expires)| **expires)
                .map(|(k, _)| k.clone())
            {
                forms.remove(&oldest);
            }
        }
        forms.insert(t.clone(), now + FORM_MS);
        t
    }

    /// Admits one sign-in attempt: `form` must be a token issued here and not used yet (it is
    /// used now), and neither `address` nor `account` may be over its attempts per minute.
    pub fn admit(&self, form: &str, address: &str, account: &str) -> Result<(), SignInRefused> {
        let issued = self
            .forms
            .lock()
            .expect("form lock is never poisoned")
            .remove(form);
        if issued.is_none_or(|expires| expires <= clock::now_ms()) {
            return Err(SignInRefused::Form);
        }
        let now = Instant::now();
        self.attempts
            .check(&format!("address:{address}"), self.per_address, now)
            .map_err(SignInRefused::TooMany)?;
        self.attempts
            .check(&format!("account:{account}"), self.per_account, now)
            .map_err(SignInRefused::TooMany)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> DashboardConfig {
        DashboardConfig {
            sign_in_per_minute_per_address: 3,
            sign_in_per_minute_per_account: 2,
            password_workers: 1,
            password_queue: 1,
        }
    }

    #[test]
    fn form_tokens_are_single_use() {
        let guard = SignIn::new(&config());
        let t = guard.issue();
        assert_eq!(guard.admit(&t, "10.0.0.1", "a@x"), Ok(()));
        assert_eq!(guard.admit(&t, "10.0.0.1", "a@x"), Err(SignInRefused::Form));
        assert_eq!(
            guard.admit("made up", "10.0.0.1", "b@x"),
            Err(SignInRefused::Form)
        );
    }

    #[test]
    fn attempts_are_limited_per_address_and_per_account() {
        let guard = SignIn::new(&config());
        for _ in 0..2 {
            assert_eq!(guard.admit(&guard.issue(), "10.0.0.1", "a@x"), Ok(()));
        }
        // The account's third attempt in a minute, from anywhere.
        assert!(matches!(
            guard.admit(&guard.issue(), "10.0.0.2", "a@x"),
            Err(SignInRefused::TooMany(_))
        ));
        // The address's fourth attempt, whatever the account.
        assert_eq!(guard.admit(&guard.issue(), "10.0.0.1", "b@x"), Ok(()));
        assert!(matches!(
            guard.admit(&guard.issue(), "10.0.0.1", "c@x"),
            Err(SignInRefused::TooMany(_))
        ));
    }
}
