//! `GET /healthz` (liveness) and `GET /readyz` (readiness), no authentication.
//!
//! A draining instance (SIGTERM with `server.drain_timeout_ms`) is alive but not ready: load
//! balancers stop sending it new calls and sessions while the ones it runs finish. An instance
//! that would refuse a new live call now ([`crate::capacity`]) answers `full`: alive, serving
//! its calls, but a new call belongs on another instance.

use warp::http::StatusCode;
use warp::{Filter, Rejection, Reply};

use crate::app::App;
use crate::capacity::LiveLag;

/// The body of `GET /healthz` and `GET /readyz`.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct Status {
    /// `ok` or `draining` (`/healthz`); `ready`, `full` or `draining` (`/readyz`).
    pub status: &'static str,
    /// `/readyz`: live calls in progress on this instance.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub live_calls: Option<usize>,
    /// `/readyz`: live calls this instance takes at most now (see `capacity::LiveCapacity::ceiling`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub live_capacity: Option<usize>,
}

/// `GET /healthz` answers 200 `{"status":"ok"}` (or `"draining"`) while the process serves;
/// `GET /readyz` answers 200 `{"status":"ready"}`, or 503 `{"status":"full"}` (a new live call
/// would be refused) or `{"status":"draining"}`, each with the instance's live calls and
/// capacity.
pub fn routes(app: App) -> impl Filter<Extract = (impl Reply,), Error = Rejection> + Clone {
    let live_app = app.clone();
    let healthz = warp::path!("healthz").and(warp::get()).map(move || {
        let status = if live_app.lifecycle.is_draining() {
            "draining"
        } else {
            "ok"
        };
        warp::reply::json(&Status {
            status,
            live_calls: None,
            live_capacity: None,
        })
    });
    let readyz = warp::path!("readyz").and(warp::get()).map(move || {
        let lag = LiveLag::of(&app.asr);
        let (status, code) = if app.lifecycle.is_draining() {
            ("draining", StatusCode::SERVICE_UNAVAILABLE)
        } else if app.capacity.check(&lag).is_err() {
            ("full", StatusCode::SERVICE_UNAVAILABLE)
        } else {
            ("ready", StatusCode::OK)
        };
        let body = Status {
            status,
            live_calls: Some(app.capacity.taken()),
            live_capacity: Some(app.capacity.ceiling(&lag)),
        };
        warp::reply::with_status(warp::reply::json(&body), code)
    });
    healthz.or(readyz)
}
