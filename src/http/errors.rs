//! The one place where errors become HTTP statuses, JSON bodies and WebSocket close codes.
//!
//! Every REST error body has the shape `{"error": {"code": "<snake_case>", "message": "<text>"}}`;
//! `code` is stable and meant for programs, `message` is for people.

use std::convert::Infallible;

use serde::Serialize;
use warp::http::{header, HeaderValue, StatusCode};
use warp::reply::Response;
use warp::{Rejection, Reply};

use crate::auth::AuthError;
use crate::llm::LlmError;

/// An error of a request, as routes raise it.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Authentication, rate limit or quota.
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// The request is malformed.
    #[error("{message}")]
    BadRequest {
        /// Stable machine-readable code.
        code: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The upload is in a format we do not decode.
    #[error("unsupported audio format: {0}")]
    UnsupportedMedia(String),
    /// An error with more to say than its kind.
    #[error("{error}: {detail}")]
    Detailed {
        /// The error.
        error: Box<ApiError>,
        /// What else the caller should know.
        detail: String,
    },
    /// The language model failed or is busy.
    #[error(transparent)]
    Llm(#[from] LlmError),
    /// Billing could not be recorded; the answer is withheld.
    #[error("usage could not be recorded: {0}")]
    Billing(String),
    /// A failure of ours.
    #[error("internal error: {0}")]
    Internal(String),
}

impl warp::reject::Reject for ApiError {}

impl ApiError {
    /// This error, with more for the caller to read in its message.
    pub fn with_detail(self, detail: String) -> Self {
        ApiError::Detailed {
            error: Box::new(self),
            detail,
        }
    }
}

impl From<AuthError> for Rejection {
    fn from(e: AuthError) -> Self {
        warp::reject::custom(ApiError::Auth(e))
    }
}

/// The JSON error body.
#[derive(Debug, Serialize)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// Inside [`ErrorBody`].
#[derive(Debug, Serialize)]
pub struct ErrorDetail {
    /// Stable machine-readable code.
    pub code: &'static str,
    /// Human-readable explanation.
    pub message: String,
}

impl ApiError {
    /// HTTP status and stable code.
    pub fn status(&self) -> (StatusCode, &'static str) {
        match self {
            ApiError::Auth(e) => match e {
                AuthError::MissingKey => (StatusCode::UNAUTHORIZED, "missing_api_key"),
                AuthError::InvalidKey => (StatusCode::UNAUTHORIZED, "invalid_api_key"),
                AuthError::OrgDeleted => (StatusCode::NOT_FOUND, "organisation_not_found"),
                AuthError::RateLimited { .. } => (StatusCode::TOO_MANY_REQUESTS, "rate_limited"),
                AuthError::QuotaExhausted(_) => (StatusCode::PAYMENT_REQUIRED, "quota_exhausted"),
                AuthError::PlanMissing(_) => {
                    (StatusCode::INTERNAL_SERVER_ERROR, "plan_not_configured")
                }
                AuthError::Store(_) => (StatusCode::SERVICE_UNAVAILABLE, "storage_unavailable"),
            },
            ApiError::BadRequest { code, .. } => (StatusCode::BAD_REQUEST, code),
            ApiError::UnsupportedMedia(_) => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
            }
            ApiError::Detailed { error, .. } => error.status(),
            ApiError::Llm(e) => match e {
                LlmError::Busy => (StatusCode::SERVICE_UNAVAILABLE, "model_busy"),
                LlmError::ContextOverflow { .. } => {
                    (StatusCode::BAD_REQUEST, "context_length_exceeded")
                }
                LlmError::Upstream(_) => (StatusCode::BAD_GATEWAY, "upstream_error"),
                LlmError::UpstreamTimeout => (StatusCode::GATEWAY_TIMEOUT, "upstream_timeout"),
                LlmError::Cancelled | LlmError::Engine(_) => {
                    (StatusCode::INTERNAL_SERVER_ERROR, "model_error")
                }
            },
            ApiError::Billing(_) => (StatusCode::SERVICE_UNAVAILABLE, "storage_unavailable"),
            ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal_error"),
        }
    }

    /// WebSocket close code and reason for the same error on a realtime connection.
    pub fn close_code(&self) -> (u16, String) {
        let code = match self {
            ApiError::Auth(AuthError::MissingKey | AuthError::InvalidKey) => 4401,
            ApiError::Auth(AuthError::QuotaExhausted(_)) => 4402,
            ApiError::Auth(AuthError::OrgDeleted) => 4404,
            _ => 1011,
        };
        (code, self.to_string())
    }

    /// The HTTP response for this error.
    pub fn to_response(&self) -> Response {
        let (status, code) = self.status();
        if status.is_server_error() {
            tracing::error!(error = %self, "request failed");
        }
        let retry_after = match self {
            ApiError::Auth(AuthError::RateLimited { retry_after, .. }) => {
                Some(retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0))
            }
            ApiError::Llm(LlmError::Busy) => Some(1),
            _ => None,
        };
        let mut response = json_error(status, code, self.to_string());
        if let Some(secs) = retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
        }
        response
    }
}

fn json_error(status: StatusCode, code: &'static str, message: String) -> Response {
    let body = ErrorBody {
        error: ErrorDetail { code, message },
    };
    warp::reply::with_status(warp::reply::json(&body), status).into_response()
}

/// Turns any rejection into a JSON error response.
pub async fn recover(rejection: Rejection) -> Result<Response, Infallible> {
    if let Some(e) = rejection.find::<ApiError>() {
        return Ok(e.to_response());
    }
    let (status, code, message) = if rejection.is_not_found() {
        (
            StatusCode::NOT_FOUND,
            "not_found",
            "no such route".to_owned(),
        )
    } else if let Some(e) = rejection.find::<warp::filters::body::BodyDeserializeError>() {
        (StatusCode::BAD_REQUEST, "invalid_json", e.to_string())
    } else if rejection.find::<warp::reject::PayloadTooLarge>().is_some() {
        (
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            "request body too large".to_owned(),
        )
    } else if let Some(e) = rejection.find::<warp::reject::UnsupportedMediaType>() {
        (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            e.to_string(),
        )
    } else if let Some(e) = rejection.find::<warp::reject::InvalidHeader>() {
        (StatusCode::BAD_REQUEST, "invalid_header", e.to_string())
    } else if let Some(e) = rejection.find::<warp::reject::MissingHeader>() {
        (StatusCode::BAD_REQUEST, "missing_header", e.to_string())
    } else if let Some(e) = rejection.find::<warp::reject::InvalidQuery>() {
        (StatusCode::BAD_REQUEST, "invalid_query", e.to_string())
    } else if let Some(e) = rejection.find::<warp::reject::LengthRequired>() {
        (
            StatusCode::LENGTH_REQUIRED,
            "length_required",
            e.to_string(),
        )
    } else if let Some(e) = rejection.find::<warp::reject::MethodNotAllowed>() {
        (
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            e.to_string(),
        )
    } else {
        tracing::error!(?rejection, "unhandled rejection");
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            "internal error".to_owned(),
        )
    };
    Ok(json_error(status, code, message))
}

#[cfg(test)]
mod tests {
    use super::*;
    use callstream_actors::usage::UsageKind;
    use std::time::Duration;

    #[test]
    fn statuses_and_close_codes() {
        let cases: Vec<(ApiError, u16, u16)> = vec![
            (AuthError::MissingKey.into(), 401, 4401),
            (AuthError::InvalidKey.into(), 401, 4401),
            (AuthError::OrgDeleted.into(), 404, 4404),
            (
                AuthError::QuotaExhausted(UsageKind::Tokens).into(),
                402,
                4402,
            ),
            (
                AuthError::RateLimited {
                    rpm: 1,
                    retry_after: Duration::from_millis(1500),
                }
                .into(),
                429,
                1011,
            ),
            (ApiError::Internal("x".into()), 500, 1011),
        ];
        for (err, status, close) in cases {
            assert_eq!(err.status().0.as_u16(), status, "{err}");
            assert_eq!(err.close_code().0, close, "{err}");
        }
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        let response = ApiError::Auth(AuthError::RateLimited {
            rpm: 1,
            retry_after: Duration::from_millis(1500),
        })
        .to_response();
        assert_eq!(response.headers()[header::RETRY_AFTER], "2");
    }
}
