//! Dashboard sign-in sessions: random 256-bit tokens mapped to the signed-in administrator,
//! their organisation and the CSRF token every form of theirs must carry. Sessions last 12
//! hours and live in memory (a restart signs everyone out).

use std::collections::HashMap;
use std::sync::Mutex;

use crate::clock;

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
