//! `GET /healthz` (liveness) and `GET /readyz` (readiness), no authentication.
//!
//! A draining instance (SIGTERM with `server.drain_timeout_ms`) is alive but not ready: load
//! balancers stop sending it new calls and sessions while the ones it runs finish.

use warp::http::StatusCode;
use warp::{Filter, Rejection, Reply};

use crate::app::App;

/// The body of `GET /healthz` and `GET /readyz`.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct Status {
    /// `ok` or `draining` (`/healthz`); `ready` or `draining` (`/readyz`).
    pub status: &'static str,
}

/// `GET /healthz` answers 200 `{"status":"ok"}` (or `"draining"`) while the process serves;
/// `GET /readyz` answers 200 `{"status":"ready"}`, or 503 `{"status":"draining"}`.
pub fn routes(app: App) -> impl Filter<Extract = (impl Reply,), Error = Rejection> + Clone {
    let live_app = app.clone();
    let healthz = warp::path!("healthz").and(warp::get()).map(move || {
        let status = if live_app.lifecycle.is_draining() {
            "draining"
        } else {
            "ok"
        };
        warp::reply::json(&Status { status })
    });
    let readyz = warp::path!("readyz").and(warp::get()).map(move || {
        let (status, code) = if app.lifecycle.is_draining() {
            ("draining", StatusCode::SERVICE_UNAVAILABLE)
        } else {
            ("ready", StatusCode::OK)
        };
        warp::reply::with_status(warp::reply::json(&Status { status }), code)
    });
    healthz.or(readyz)
}
