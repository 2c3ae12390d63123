//! `GET /healthz`: liveness, no authentication.

use warp::{Filter, Rejection, Reply};

/// `GET /healthz` answers `{"status":"ok"}`.
pub fn routes() -> impl Filter<Extract = (impl Reply,), Error = Rejection> + Clone {
    warp::path!("healthz")
        .and(warp::get())
        .map(|| warp::reply::json(&serde_json::json!({"status": "ok"})))
}
