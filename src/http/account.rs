//! Routes about the caller's own account: `GET /api/account` (who this key is) and
//! `GET /api/usage` (this month's usage and quotas). Both count against the key's RPM budget
//! and stay available when a quota is exhausted, so a client can see why it is refused.

use serde::Serialize;
use warp::{Filter, Rejection, Reply};

use crate::app::App;
use crate::auth::Caller;
use crate::clock;
use crate::config::Plan;
use crate::http::errors::ApiError;

/// `GET /api/account`: who the key is.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Account {
    /// The key's organisation.
    pub organisation: OrgInfo,
    /// Its plan.
    pub plan: PlanInfo,
    /// The key itself.
    pub key: KeyInfo,
}

/// An organisation as its own keys see it.
#[derive(Serialize, utoipa::ToSchema)]
pub struct OrgInfo {
    /// `org_...`.
    pub id: String,
    /// Display name.
    pub name: String,
}

/// A plan's name and terms.
#[derive(Serialize, utoipa::ToSchema)]
pub struct PlanInfo {
    /// Plan name.
    pub name: String,
    /// Its rate and quotas.
    #[serde(flatten)]
    pub limits: Plan,
}

/// An API key as it is shown after creation: never its secret.
#[derive(Serialize, utoipa::ToSchema)]
pub struct KeyInfo {
    /// Key id.
    pub id: String,
    /// Free text given at creation.
    pub name: Option<String>,
    /// The secret's last four characters.
    pub last4: String,
}

/// `GET /api/account` and `GET /api/usage`.
pub fn routes(app: App) -> impl Filter<Extract = (impl Reply,), Error = Rejection> + Clone {
    let account = warp::path!("api" / "account")
        .and(warp::get())
        .and(crate::http::filters::caller(app.clone()))
        .map(|caller: Caller| {
            warp::reply::json(&Account {
                organisation: OrgInfo {
                    id: caller.org.id,
                    name: caller.org.name,
                },
                plan: PlanInfo {
                    name: caller.org.plan,
                    limits: caller.plan,
                },
                key: KeyInfo {
                    id: caller.key.id,
                    name: caller.key.name,
                    last4: caller.key.last4,
                },
            })
        });
    let usage = warp::path!("api" / "usage")
        .and(warp::get())
        .and(crate::http::filters::caller(app.clone()))
        .and_then(move |caller: Caller| {
            let app = app.clone();
            async move {
                let report = app
                    .auth
                    .quotas()
                    .report(&caller.org.id, clock::now_ms())
                    .await
                    .map_err(|e| ApiError::Internal(e.to_string()))?;
                Ok::<_, Rejection>(warp::reply::json(&report))
            }
        });
    account.or(usage)
}
