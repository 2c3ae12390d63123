//! Dashboard sign-in: sessions (random 256-bit tokens mapped to the signed-in administrator,
//! their organisation and the CSRF token every form of theirs must carry; they last 12 hours),
//! and what guards the sign-in form ([`SignIn`]): signed single-use form tokens, attempt limits
//! per client address and per account from an address, a growing wait after wrong passwords,
//! and the password threads.
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
/// Wrong passwords in a row (for one account from one address) answered at once.
const FREE_FAILURES: u32 = 3;
/// The longest wait the failures impose.
const MAX_BACKOFF_MS: i64 = 5 * 60 * 1000;
/// How long a run of failures is remembered after its last one.
const FAILURES_KEPT_MS: i64 = 15 * 60 * 1000;

/// Why a sign-in is not even checked.
#[derive(Debug, PartialEq, Eq)]
pub enum SignInRefused {
    /// The form token is not one this service signed, was used, or expired.
    Form,
    /// Too many attempts from this address or for this account; try again after this long.
    TooMany(std::time::Duration),
    /// The shared state could not be read or written.
    Unavailable,
}

/// What guards the sign-in form.
///
/// A form token is signed, not stored: `expiry (16 hex) || random (32 hex) || HMAC (32 hex)`,
/// so showing the sign-in page stores nothing (a flood of page views cannot fill any table).
/// A token is remembered only once it is submitted, until it expires, so it is used once.
pub struct SignIn {
    shared: Arc<dyn SharedState>,
    key: [u8; 32],
    per_address: u32,
    per_account: u32,
    pages_per_address: u32,
    /// The password threads.
    pub passwords: PasswordPool,
}

impl SignIn {
    /// Guards with the limits of `config`, signing forms with `key` and keeping used forms
    /// and attempt counts in `shared`.
    pub fn new(config: &DashboardConfig, shared: Arc<dyn SharedState>, key: [u8; 32]) -> Self {
        Self {
            shared,
            key,
            per_address: config.sign_in_per_minute_per_address,
            per_account: config.sign_in_per_minute_per_account,
            pages_per_address: config.login_page_per_minute_per_address,
            passwords: PasswordPool::new(config.password_workers, config.password_queue),
        }
    }

    fn mac(&self, body: &str) -> String {
        use hmac::Mac;
        let mut m = hmac::Hmac::<sha2::Sha256>::new_from_slice(&self.key)
            .expect("HMAC takes any key length");
        m.update(body.as_bytes());
        crate::auth::keys::hex(&m.finalize().into_bytes()[..16])
    }

    /// A new single-use form token, valid for 30 minutes. Nothing is stored.
    pub fn issue(&self) -> String {
        self.issue_at(clock::now_ms())
    }

    fn issue_at(&self, now_ms: i64) -> String {
        let body = format!(
            "{:016x}{}",
            now_ms.saturating_add(FORM_MS),
            crate::auth::keys::hex(&rand::random::<[u8; 16]>())
        );
        let mac = self.mac(&body);
        format!("{body}{mac}")
    }

    /// Whether `form` is a token signed here and not expired: its expiry, Unix ms.
    fn signed(&self, form: &str) -> Option<i64> {
        if form.len() != 80 || !form.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let (body, mac) = form.split_at(48);
        let expected = self.mac(body);
        let same = expected
            .bytes()
            .zip(mac.bytes())
            .fold(0u8, |d, (a, b)| d | (a ^ b.to_ascii_lowercase()));
        let expires = i64::from_str_radix(&body[..16], 16).ok()?;
        (same == 0 && expires > clock::now_ms()).then_some(expires)
    }

    /// Counts one view of the sign-in page from `address`: refused past
    /// `dashboard.login_page_per_minute_per_address`.
    pub async fn page(&self, address: &str) -> Result<(), SignInRefused> {
        self.shared
            .rate(
                &format!("sign-in-page:{address}"),
                self.pages_per_address,
                Instant::now(),
            )
            .await
            .map_err(unavailable)?
            .map_err(SignInRefused::TooMany)
    }

    /// Admits one sign-in attempt: `form` must be a token signed here, not expired and not
    /// used yet (it is used now); `address` must be within its attempts per minute, and
    /// `account` from `address` within its own and past any wait its wrong passwords
    /// imposed. An account cannot be locked out from another address.
    pub async fn admit(
        &self,
        form: &str,
        address: &str,
        account: &str,
    ) -> Result<(), SignInRefused> {
        let Some(expires) = self.signed(form) else {
            return Err(SignInRefused::Form);
        };
        let now = Instant::now();
        self.shared
            .rate(&format!("sign-in-address:{address}"), self.per_address, now)
            .await
            .map_err(unavailable)?
            .map_err(SignInRefused::TooMany)?;
        let pair = pair_key(account, address);
        self.shared
            .rate(&format!("sign-in-account:{pair}"), self.per_account, now)
            .await
            .map_err(unavailable)?
            .map_err(SignInRefused::TooMany)?;
        if let Some(wait) = self.backoff(&pair).await? {
            return Err(SignInRefused::TooMany(wait));
        }
        if !self
            .shared
            .insert_new(Space::SignInForm, &form[..48], "", expires)
            .await
            .map_err(unavailable)?
        {
            return Err(SignInRefused::Form);
        }
        Ok(())
    }

    /// The wait the failures of `pair` impose now, if any.
    async fn backoff(&self, pair: &str) -> Result<Option<std::time::Duration>, SignInRefused> {
        let Some(record) = self
            .shared
            .get(Space::SignInFailures, pair)
            .await
            .map_err(unavailable)?
        else {
            return Ok(None);
        };
        let until = Failures::read(&record).until_ms;
        let left = until - clock::now_ms();
        Ok((left > 0).then(|| std::time::Duration::from_millis(left as u64)))
    }

    /// Records a wrong password for `account` from `address`: after the first few, each
    /// further attempt from there waits twice as long as the last (2 s, 4 s, ... 5 min).
    pub async fn failed(&self, address: &str, account: &str) {
        let pair = pair_key(account, address);
        let now = clock::now_ms();
        let before = match self.shared.take(Space::SignInFailures, &pair).await {
            Ok(record) => record.map_or(0, |r| Failures::read(&r).count),
            Err(e) => return tracing::warn!(error = %e, "cannot record a sign-in failure"),
        };
        let count = before.saturating_add(1);
        let wait = match count.checked_sub(FREE_FAILURES) {
            None | Some(0) => 0,
            Some(n) => 1000i64
                .saturating_mul(1i64 << n.min(20))
                .min(MAX_BACKOFF_MS),
        };
        let record = Failures {
            count,
            until_ms: now + wait,
        };
        if let Err(e) = self
            .shared
            .insert_new(
                Space::SignInFailures,
                &pair,
                &record.write(),
                now + wait + FAILURES_KEPT_MS,
            )
            .await
        {
            tracing::warn!(error = %e, "cannot record a sign-in failure");
        }
    }

    /// Forgets the failures of `account` from `address` after it signed in.
    pub async fn succeeded(&self, address: &str, account: &str) {
        let _ = self
            .shared
            .take(Space::SignInFailures, &pair_key(account, address))
            .await;
    }
}

fn unavailable(e: crate::store::StoreError) -> SignInRefused {
    tracing::warn!(error = %e, "sign-in state unavailable");
    SignInRefused::Unavailable
}

/// The key of an account from one address, hashed: e-mail addresses are not kept in the
/// shared state's keys.
fn pair_key(account: &str, address: &str) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(account.as_bytes());
    h.update([0]);
    h.update(address.as_bytes());
    crate::auth::keys::hex(&h.finalize()[..16])
}

/// A run of wrong passwords: `count:until_ms`.
struct Failures {
    count: u32,
    until_ms: i64,
}

impl Failures {
    fn read(record: &str) -> Self {
        let (count, until) = record.split_once(':').unwrap_or(("0", "0"));
        Self {
            count: count.parse().unwrap_or(0),
            until_ms: until.parse().unwrap_or(0),
        }
    }

    fn write(&self) -> String {
        format!("{}:{}", self.count, self.until_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> DashboardConfig {
        DashboardConfig {
            sign_in_per_minute_per_address: 3,
            sign_in_per_minute_per_account: 2,
            login_page_per_minute_per_address: 2,
            max_feeds_per_session: 1,
            password_workers: 1,
            password_queue: 1,
        }
    }

    fn guard() -> SignIn {
        SignIn::new(
            &config(),
            Arc::new(crate::store::shared::Local::default()),
            [7; 32],
        )
    }

    #[tokio::test]
    async fn form_tokens_are_signed_and_single_use() {
        let guard = guard();
        let t = guard.issue();
        assert_eq!(t.len(), 80);
        assert_eq!(guard.admit(&t, "10.0.0.1", "a@x").await, Ok(()));
        assert_eq!(
            guard.admit(&t, "10.0.0.1", "a@x").await,
            Err(SignInRefused::Form)
        );
        // Not signed with this key; tampered with; expired; malformed.
        let other = SignIn::new(
            &config(),
            Arc::new(crate::store::shared::Local::default()),
            [8; 32],
        );
        let foreign = other.issue();
        assert_eq!(
            guard.admit(&foreign, "10.0.0.2", "b@x").await,
            Err(SignInRefused::Form)
        );
        let fresh = guard.issue();
        let tampered = format!("{}{}", "f".repeat(16), &fresh[16..]);
        assert_eq!(
            guard.admit(&tampered, "10.0.0.2", "b@x").await,
            Err(SignInRefused::Form)
        );
        let expired = guard.issue_at(clock::now_ms() - FORM_MS - 1);
        assert_eq!(
            guard.admit(&expired, "10.0.0.2", "b@x").await,
            Err(SignInRefused::Form)
        );
        assert_eq!(
            guard.admit(&"0".repeat(80), "10.0.0.2", "b@x").await,
            Err(SignInRefused::Form)
        );
    }

    #[tokio::test]
    async fn attempts_are_limited_per_address_and_per_account_from_an_address() {
        let guard = guard();
        let attempt = |address: &'static str, account: &'static str| {
            let guard = &guard;
            async move { guard.admit(&guard.issue(), address, account).await }
        };
        for _ in 0..2 {
            assert_eq!(attempt("10.0.0.1", "a@x").await, Ok(()));
        }
        // The account's third attempt in a minute from that address.
        assert!(matches!(
            attempt("10.0.0.1", "a@x").await,
            Err(SignInRefused::TooMany(_))
        ));
        // Nobody elsewhere is locked out of the account.
        assert_eq!(attempt("10.0.0.2", "a@x").await, Ok(()));
        // The first address's fourth attempt, whatever the account.
        assert!(matches!(
            attempt("10.0.0.1", "c@x").await,
            Err(SignInRefused::TooMany(_))
        ));
    }

    #[tokio::test]
    async fn wrong_passwords_make_the_next_attempt_wait_longer_each_time() {
        let guard = guard();
        for _ in 0..FREE_FAILURES {
            guard.failed("10.0.0.1", "a@x").await;
            assert_eq!(guard.backoff(&pair_key("a@x", "10.0.0.1")).await, Ok(None));
        }
        let mut waits = Vec::new();
        for _ in 0..3 {
            guard.failed("10.0.0.1", "a@x").await;
            let wait = guard.backoff(&pair_key("a@x", "10.0.0.1")).await.unwrap();
            waits.push(wait.unwrap().as_secs_f64().round() as u64);
        }
        assert_eq!(waits, [2, 4, 8]);
        assert!(matches!(
            guard.admit(&guard.issue(), "10.0.0.1", "a@x").await,
            Err(SignInRefused::TooMany(_))
        ));
        // Another address is not held back; a success clears the record.
        assert_eq!(guard.admit(&guard.issue(), "10.0.0.2", "a@x").await, Ok(()));
        guard.succeeded("10.0.0.1", "a@x").await;
        assert_eq!(guard.backoff(&pair_key("a@x", "10.0.0.1")).await, Ok(None));
    }

    #[tokio::test]
    async fn the_sign_in_page_is_rate_limited_per_address() {
        let guard = guard();
        assert_eq!(guard.page("10.0.0.1").await, Ok(()));
        assert_eq!(guard.page("10.0.0.1").await, Ok(()));
        assert!(matches!(
            guard.page("10.0.0.1").await,
            Err(SignInRefused::TooMany(_))
        ));
        assert_eq!(guard.page("10.0.0.2").await, Ok(()));
    }
}
