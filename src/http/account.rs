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

#[derive(Serialize)]
struct Account<'a> {
    organisation: OrgInfo<'a>,
    plan: PlanInfo<'a>,
    key: KeyInfo<'a>,
}

#[derive(Serialize)]
struct OrgInfo<'a> {
    id: &'a str,
    name: &'a str,
}

#[derive(Serialize)]
struct PlanInfo<'a> {
    name: &'a str,
    #[serde(flatten)]
    limits: &'a Plan,
}

#[derive(Serialize)]
struct KeyInfo<'a> {
    id: &'a str,
    name: Option<&'a str>,
    last4: &'a str,
}

/// `GET /api/account` and `GET /api/usage`.
pub fn routes(app: App) -> impl Filter<Extract = (impl Reply,), Error = Rejection> + Clone {
    let account = warp::path!("api" / "account")
        .and(warp::get())
        .and(crate::http::filters::caller(app.clone()))
        .map(|caller: Caller| {
            warp::reply::json(&Account {
                organisation: OrgInfo {
                    id: &caller.org.id,
                    name: &caller.org.name,
                },
                plan: PlanInfo {
                    name: &caller.org.plan,
                    limits: &caller.plan,
                },
                key: KeyInfo {
                    id: &caller.key.id,
                    name: caller.key.name.as_deref(),
                    last4: &caller.key.last4,
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
                    .map_err(|e| ApiError::Internal(e.to_string()))?;
                Ok::<_, Rejection>(warp::reply::json(&report))
            }
        });
    account.or(usage)
}
