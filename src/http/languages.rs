//! `GET /api/languages`: the languages the loaded speech model accepts, no authentication.
//!
//! Response: `{"languages": [{"code": "en", "name": "English", "tags": ["en-US", "en-GB", ...]}]}`.
//! A request may name a language by its code or by any of its tags.

use serde::Serialize;
use warp::{Filter, Rejection, Reply};

use callstream_actors::asr::Language;

use crate::app::App;

#[derive(Serialize)]
struct Languages<'a> {
    languages: &'a [Language],
}

/// `GET /api/languages`.
pub fn routes(app: App) -> impl Filter<Extract = (impl Reply,), Error = Rejection> + Clone {
    warp::path!("api" / "languages")
        .and(warp::get())
        .map(move || {
            warp::reply::json(&Languages {
                languages: &app.languages,
            })
        })
}
