//! `GET /api/languages`: the languages the loaded speech model accepts, no authentication.
//!
//! Response: `{"languages": [{"code": "en", "name": "English", "tags": ["en-US", "en-GB", ...]}]}`.
//! A request may name a language by its code or by any of its tags.

use serde::Serialize;
use warp::{Filter, Rejection, Reply};

use callstream_actors::asr::Language;

use crate::app::App;

/// `GET /api/languages`.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Languages {
    /// Every language of the loaded speech model.
    pub languages: Vec<Language>,
}

/// `GET /api/languages`.
pub fn routes(app: App) -> impl Filter<Extract = (impl Reply,), Error = Rejection> + Clone {
    warp::path!("api" / "languages")
        .and(warp::get())
        .map(move || {
            warp::reply::json(&Languages {
                languages: app.languages.to_vec(),
            })
        })
}
