//! The HTTP and WebSocket edge: warp filters, one file per route family, and
//! [`errors`], the one place that maps errors to statuses and close codes.

pub mod account;
pub mod callstream;
pub mod chat;
pub mod chat_request;
pub mod chat_stream;
pub mod errors;
pub mod filters;
pub mod health;
pub mod history;
pub mod languages;
pub mod metrics;
pub mod openapi;
pub mod realtime;
pub mod transcribe;

use std::convert::Infallible;

use warp::{Filter, Rejection, Reply};

use crate::app::App;

/// Every route of the service, with errors recovered into JSON bodies.
pub fn routes(app: App) -> impl Filter<Extract = (impl Reply,), Error = Infallible> + Clone {
    api(app)
        .recover(errors::recover)
        .with(warp::log("callstream::http"))
}

/// Every route, errors still as rejections (compose before [`errors::recover`]).
pub fn api(app: App) -> impl Filter<Extract = (impl Reply,), Error = Rejection> + Clone {
    health::routes(app.clone())
        .or(metrics::routes(app.clone()))
        .or(openapi::routes(app.clone()))
        .or(callstream::routes(app.clone()))
        .or(crate::dashboard::routes(app.clone()))
        .or(languages::routes(app.clone()))
        .or(account::routes(app.clone()))
        .or(chat::routes(app.clone()))
        .or(realtime::routes(app.clone()))
        .or(history::routes(app.clone()))
        .or(transcribe::routes(app))
}
