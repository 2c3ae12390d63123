//! Filters shared by the authenticated routes: key resolution, the per-key RPM budget, and
//! quota gates for routes that bill.

use std::time::Instant;

use callstream_actors::usage::UsageKind;
use warp::{Filter, Rejection};

use crate::app::App;
use crate::auth::Caller;
use crate::clock;

/// The API key of a request: `X-API-Key`, or else `Authorization: Bearer <key>` (what the
/// OpenAI SDKs send with `api_key=`).
pub fn api_key() -> impl Filter<Extract = (Option<String>,), Error = Rejection> + Clone {
    warp::header::optional::<String>("x-api-key")
        .and(warp::header::optional::<String>("authorization"))
        .map(|key: Option<String>, authorization: Option<String>| {
            key.or_else(|| {
                let authorization = authorization?;
                let (scheme, token) = authorization.trim().split_once(' ')?;
                scheme
                    .eq_ignore_ascii_case("bearer")
                    .then(|| token.trim().to_owned())
            })
        })
}

/// Resolves the request's API key ([`api_key`]) to a [`Caller`] and counts the request against
/// the key's RPM budget.
pub fn caller(app: App) -> impl Filter<Extract = (Caller,), Error = Rejection> + Clone {
    api_key().and_then(move |key: Option<String>| {
        let app = app.clone();
        async move {
            let caller = app.auth.authenticate(key.as_deref()).await?;
            app.auth.check_rate(&caller, Instant::now()).await?;
            Ok::<_, Rejection>(caller)
        }
    })
}

/// [`caller`], then refuses with 402 when the organisation's `kind` quota is used up.
pub fn billed(
    app: App,
    kind: UsageKind,
) -> impl Filter<Extract = (Caller,), Error = Rejection> + Clone {
    caller(app.clone()).and_then(move |caller: Caller| {
        let app = app.clone();
        async move {
            app.auth.check_quota(&caller, kind, clock::now_ms()).await?;
            Ok::<_, Rejection>(caller)
        }
    })
}
