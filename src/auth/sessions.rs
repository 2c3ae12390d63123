//! Dashboard sign-in: sessions (random 256-bit tokens mapped to the signed-in administrator,
//! their organisation and the CSRF token every form of theirs must carry; they last 12 hours),
//! and what guards the sign-in form ([`SignIn`]): single-use form tokens, attempt limits per
//! client address and per account, and the password threads.
//!
//! Sessions, form tokens and attempt counts live in [`SharedState`]: in this process with the
//! embedded store, in the database with PostgreSQL, where they survive a restart and any
//! instance serves them.

use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::password::PasswordPool;
use crate::clock;
use crate::config::DashboardConfig;
use crate::store::{SharedState, Space};

/// How long a session lasts.
pub const SESSION_MS: i64 = 12 * 3600 * 1000;

/// A signed-in administrator.
#[derive(Debug, Clone, Serialize, Deserialize)]
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
pub struct Sessions {
    shared: Arc<dyn SharedState>,
}

/// A random 256-bit token, hex.
pub fn token() -> String {
    crate::auth::keys::hex(&rand::random::<[u8; 32]>())
}

impl Sessions {
    /// Sessions kept in `shared`.
    pub fn new(shared: Arc<dyn SharedState>) -> Self {
        Self { shared }
    }

    /// Starts a session for `email` of `org_id`: its id and the session. `None` when the
    /// session could not be stored.
    pub async fn start(&self, email: String, org_id: String) -> Option<(String, Session)> {
        let session = Session {
            email,
            org_id,
            csrf: token(),
            expires_ms: clock::now_ms() + SESSION_MS,
        };
        let id = token();
        let value = serde_json::to_string(&session).expect("a session always serializes");
        match self
            .shared
            .insert_new(Space::Session, &id, &value, session.expires_ms)
            .await
        {
            Ok(true) => Some((id, session)),
            Ok(false) => None,
            Err(e) => {
                tracing::warn!(error = %e, "cannot store a dashboard session");
                None
            }
        }
    }

    /// The live session `id`, if any (none when the state cannot be read).
    pub async fn get(&self, id: Option<&str>) -> Option<Session> {
        let id = id.filter(|id| id.len() == 64)?;
        let value = self
            .shared
            .get(Space::Session, id)
            .await
            .inspect_err(|e| tracing::warn!(error = %e, "cannot read dashboard sessions"))
            .ok()??;
        serde_json::from_str::<Session>(&value)
            .ok()
            .filter(|s| s.expires_ms > clock::now_ms())
    }

    /// Ends session `id`.
    pub async fn end(&self, id: Option<&str>) {
        if let Some(id) = id.filter(|id| id.len() == 64) {
            if let Err(e) = self.shared.take(Space::Session, id).await {
                tracing::warn!(error = %e, "cannot end a dashboard session");
            }
        }
    }
}

/// How long a sign-in form may be sent back.
const FORM_MS: i64 = 30 * 60 * 1000;
/// Why a sign-in is not even checked.
#[derive(Debug, PartialEq, Eq)]
pub enum SignInRefused {
    /// The form token is unknown, used or expired.
    Form,
    /// Too many attempts from this address or for this account; try again after this long.
    TooMany(std::time::Duration),
    /// The shared state could not be read or written.
    Unavailable,
}

/// What guards the sign-in form.
pub struct SignIn {
    shared: Arc<dyn SharedState>,
    per_address: u32,
    per_account: u32,
    /// The password threads.
    pub passwords: PasswordPool,
}

impl SignIn {
    /// Guards with the limits of `config`, keeping form tokens and attempt counts in `shared`.
    pub fn new(config: &DashboardConfig, shared: Arc<dyn SharedState>) -> Self {
        Self {
            shared,
            per_address: config.sign_in_per_minute_per_address,
            per_account: config.sign_in_per_minute_per_account,
            passwords: PasswordPool::new(config.password_workers, config.password_queue),
        }
    }

    /// A new single-use form token (`None` when it could not be stored).
    pub async fn issue(&self) -> Option<String> {
        let t = token();
        match self
            .shared
            .insert_new(Space::SignInForm, &t, "", clock::now_ms() + FORM_MS)
            .await
        {
            Ok(true) => Some(t),
            Ok(false) => None,
            Err(e) => {
                tracing::warn!(error = %e, "cannot store a sign-in form token");
                None
            }
        }
    }

    /// Admits one sign-in attempt: `form` must be a token issued here and not used yet (it is
    /// used now), and neither `address` nor `account` may be over its attempts per minute.
    pub async fn admit(
        &self,
        form: &str,
        address: &str,
        account: &str,
    ) -> Result<(), SignInRefused> {
        if form.len() != 64 {
            return Err(SignInRefused::Form);
        }
        let unavailable = |e: crate::store::StoreError| {
            tracing::warn!(error = %e, "sign-in state unavailable");
            SignInRefused::Unavailable
        };
        if self
            .shared
            .take(Space::SignInForm, form)
            .await
            .map_err(unavailable)?
            .is_none()
        {
            return Err(SignInRefused::Form);
        }
        let now = Instant::now();
        self.shared
            .rate(&format!("sign-in-address:{address}"), self.per_address, now)
            .await
            .map_err(unavailable)?
            .map_err(SignInRefused::TooMany)?;
        self.shared
            .rate(&format!("sign-in-account:{account}"), self.per_account, now)
            .await
            .map_err(unavailable)?
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

    #[tokio::test]
    async fn form_tokens_are_single_use() {
        let guard = SignIn::new(&config(), Arc::new(crate::store::shared::Local::default()));
        let t = guard.issue().await.unwrap();
        assert_eq!(guard.admit(&t, "10.0.0.1", "a@x").await, Ok(()));
        assert_eq!(
            guard.admit(&t, "10.0.0.1", "a@x").await,
            Err(SignInRefused::Form)
        );
        assert_eq!(
            guard.admit(&"0".repeat(64), "10.0.0.1", "b@x").await,
            Err(SignInRefused::Form)
        );
    }

    #[tokio::test]
    async fn attempts_are_limited_per_address_and_per_account() {
        let guard = SignIn::new(&config(), Arc::new(crate::store::shared::Local::default()));
        let attempt = |address: &'static str, account: &'static str| {
            let guard = &guard;
            async move {
                let form = guard.issue().await.unwrap();
                guard.admit(&form, address, account).await
            }
        };
        for _ in 0..2 {
            assert_eq!(attempt("10.0.0.1", "a@x").await, Ok(()));
        }
        // The account's third attempt in a minute, from anywhere.
        assert!(matches!(
            attempt("10.0.0.2", "a@x").await,
            Err(SignInRefused::TooMany(_))
        ));
        // The address's fourth attempt, whatever the account.
        assert_eq!(attempt("10.0.0.1", "b@x").await, Ok(()));
        assert!(matches!(
            attempt("10.0.0.1", "c@x").await,
            Err(SignInRefused::TooMany(_))
        ));
    }
}
