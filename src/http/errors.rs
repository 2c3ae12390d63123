//! The one place where errors become HTTP statuses, JSON bodies and WebSocket close codes.
//!
//! Every REST error body has the shape `{"error": {"code": "<snake_case>", "message": "<text>"}}`;
//! `code` is stable and meant for programs, `message` is for people. Every WebSocket the server
//! closes gets its code and reason from [`close_frame`], whichever route it belongs to.

use std::convert::Infallible;

use serde::Serialize;
use warp::http::{header, HeaderValue, StatusCode};
use warp::reply::Response;
use warp::{Rejection, Reply};

use callstream_actors::call::CallEnd;
use callstream_actors::usage::UsageKind;

use crate::auth::AuthError;
use crate::files::FileError;
use crate::llm::LlmError;

/// Normal closure.
const CLOSE_NORMAL: u16 = 1000;
/// The server is going away (shutting down).
const CLOSE_GOING_AWAY: u16 = 1001;
/// The client's message is larger than the server takes.
const CLOSE_TOO_BIG: u16 = 1009;
/// The server met a condition it did not expect.
const CLOSE_INTERNAL: u16 = 1011;
/// Missing or invalid credentials at the handshake.
const CLOSE_UNAUTHORIZED: u16 = 4401;
/// The organisation's quota is used up.
const CLOSE_QUOTA: u16 = 4402;
/// The organisation no longer exists.
const CLOSE_NOT_FOUND: u16 = 4404;

/// Close reason when a realtime session's key is revoked (fixed by the contract).
pub const REVOKED_REASON: &str = "API key is no longer valid.";

/// Why the server closes a WebSocket.
#[derive(Debug, Clone, Copy)]
pub enum SocketClose<'a> {
    /// A live call ended.
    Call(&'a CallEnd),
    /// A live-call upgrade request was refused: missing key, unknown or revoked connector, or
    /// a signature that does not verify. Which one is only logged.
    CallRefused,
    /// A realtime chat handshake was refused.
    ChatRefused(&'a AuthError),
    /// A realtime chat session found its key, organisation or quota no longer good.
    ChatEnded(&'a AuthError),
    /// A realtime chat session was idle for `realtime.idle_timeout_ms`.
    ChatIdle,
    /// The client sent a frame larger than the route takes.
    TooBig,
    /// The server is shutting down.
    ServerStopping,
}

/// True when a WebSocket read failed because the client's message was over the size limit.
/// The WebSocket library reports it only as an error whose text names the capacity limit.
pub fn is_too_big(e: &warp::Error) -> bool {
    let text = e.to_string();
    text.contains("Space limit exceeded") || text.contains("Message too long")
}

/// The close code and reason for `why`: the only place close codes are chosen.
pub fn close_frame(why: SocketClose<'_>) -> (u16, String) {
    match why {
        SocketClose::Call(end) => match end {
            CallEnd::Closed | CallEnd::ClientGone | CallEnd::Disconnected(_) => {
                (CLOSE_NORMAL, String::new())
            }
            CallEnd::IdleTimeout => (CLOSE_NORMAL, "idle timeout".to_owned()),
            CallEnd::ProbeOver => (CLOSE_NORMAL, "probe answered".to_owned()),
            CallEnd::FrameTooLarge => (CLOSE_TOO_BIG, "message too big".to_owned()),
            CallEnd::ChildFailed(_) | CallEnd::Failed => {
                (CLOSE_INTERNAL, "internal error".to_owned())
            }
        },
        SocketClose::CallRefused => (CLOSE_UNAUTHORIZED, "unauthorized".to_owned()),
        SocketClose::ChatRefused(e) => (auth_close_code(e), e.to_string()),
        // Mid-session an invalid key is a revoked one.
        SocketClose::ChatEnded(AuthError::MissingKey | AuthError::InvalidKey) => {
            (CLOSE_INTERNAL, REVOKED_REASON.to_owned())
        }
        SocketClose::ChatEnded(e) => (auth_close_code(e), e.to_string()),
        SocketClose::ChatIdle => (CLOSE_NORMAL, "idle timeout".to_owned()),
        SocketClose::TooBig => (CLOSE_TOO_BIG, "message too big".to_owned()),
        SocketClose::ServerStopping => (CLOSE_GOING_AWAY, "server shutting down".to_owned()),
    }
}

fn auth_close_code(e: &AuthError) -> u16 {
    match e {
        AuthError::MissingKey | AuthError::InvalidKey => CLOSE_UNAUTHORIZED,
        AuthError::QuotaExhausted(_) => CLOSE_QUOTA,
        AuthError::OrgDeleted => CLOSE_NOT_FOUND,
        AuthError::RateLimited { .. } | AuthError::PlanMissing(_) | AuthError::Store(_) => {
            CLOSE_INTERNAL
        }
    }
}

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
    /// No such record for this organisation.
    #[error("{message}")]
    NotFound {
        /// Stable machine-readable code.
        code: &'static str,
        /// What was not found.
        message: String,
    },
    /// The upload is in a format we do not decode.
    #[error("unsupported audio format: {0}")]
    UnsupportedMedia(String),
    /// The caller already holds as many sessions or calls as it may.
    #[error("{message}")]
    TooMany {
        /// Stable machine-readable code.
        code: &'static str,
        /// What is at its cap.
        message: String,
    },
    /// The request is larger than we take.
    #[error("{message}")]
    TooLarge {
        /// Stable machine-readable code.
        code: &'static str,
        /// What is too large.
        message: String,
    },
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
    /// This instance is draining before a restart: it takes no new calls or sessions.
    #[error("this instance is draining")]
    Draining,
    /// This instance takes no new live call now: the calls it serves would miss their latency
    /// budget.
    #[error(transparent)]
    AtCapacity(#[from] crate::capacity::Full),
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

impl From<FileError> for ApiError {
    fn from(e: FileError) -> Self {
        match e {
            FileError::Language { .. } => ApiError::BadRequest {
                code: "invalid_language",
                message: e.to_string(),
            },
            FileError::Unsupported(m) => ApiError::UnsupportedMedia(m),
            FileError::InvalidAudio(message) => ApiError::BadRequest {
                code: "invalid_audio",
                message,
            },
            FileError::TooLong { .. } => ApiError::TooLarge {
                code: "audio_too_long",
                message: e.to_string(),
            },
            FileError::QuotaTooSmall { .. } => {
                let detail = e.to_string();
                ApiError::Auth(AuthError::QuotaExhausted(UsageKind::AudioMs)).with_detail(detail)
            }
            FileError::Auth(e) => ApiError::Auth(e),
            FileError::Llm(e) => ApiError::Llm(e),
            FileError::Billing(e) => ApiError::Billing(e.to_string()),
            FileError::Speech(_) | FileError::NoModel | FileError::Internal(_) => {
                ApiError::Internal(e.to_string())
            }
        }
    }
}

impl From<AuthError> for Rejection {
    fn from(e: AuthError) -> Self {
        warp::reject::custom(ApiError::Auth(e))
    }
}

/// The JSON error body.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// Inside [`ErrorBody`].
#[derive(Debug, Serialize, utoipa::ToSchema)]
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
            ApiError::NotFound { code, .. } => (StatusCode::NOT_FOUND, code),
            ApiError::UnsupportedMedia(_) => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
            }
            ApiError::TooLarge { code, .. } => (StatusCode::PAYLOAD_TOO_LARGE, code),
            ApiError::TooMany { code, .. } => (StatusCode::TOO_MANY_REQUESTS, code),
            ApiError::Draining => (StatusCode::SERVICE_UNAVAILABLE, "draining"),
            ApiError::AtCapacity(_) => (StatusCode::SERVICE_UNAVAILABLE, "at_capacity"),
            ApiError::Detailed { error, .. } => error.status(),
            ApiError::Llm(e) => match e {
                LlmError::Busy => (StatusCode::SERVICE_UNAVAILABLE, "model_busy"),
                LlmError::OrgBusy { .. } => (StatusCode::TOO_MANY_REQUESTS, "model_busy"),
                LlmError::ContextOverflow { .. } => {
                    (StatusCode::BAD_REQUEST, "context_length_exceeded")
                }
                LlmError::Schema(_) => (StatusCode::BAD_REQUEST, "invalid_response_format"),
                LlmError::Upstream(_) => (StatusCode::BAD_GATEWAY, "upstream_error"),
                LlmError::UpstreamTimeout => (StatusCode::GATEWAY_TIMEOUT, "upstream_timeout"),
                LlmError::Cancelled { .. } | LlmError::Engine(_) => {
                    (StatusCode::INTERNAL_SERVER_ERROR, "model_error")
                }
            },
            ApiError::Billing(_) => (StatusCode::SERVICE_UNAVAILABLE, "storage_unavailable"),
            ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal_error"),
        }
    }

    /// What the client is told. A server-side failure says only what kind of failure it was
    /// and a request id; the details (which may name paths, peers or a panic) are logged under
    /// that id.
    pub fn public_message(&self) -> (String, Option<String>) {
        let (status, code) = self.status();
        if !status.is_server_error() {
            return (self.to_string(), None);
        }
        let id = request_id();
        if let ApiError::AtCapacity(full) = self {
            // Load shedding, not a failure.
            tracing::info!(request_id = %id, reason = full.reason(), error = %self, "live call refused at capacity");
        } else {
            tracing::error!(request_id = %id, code, error = %self, "request failed");
        }
        (
            format!("{} (request id {id})", server_error_text(code)),
            Some(id),
        )
    }

    /// The HTTP response for this error.
    pub fn to_response(&self) -> Response {
        let (status, code) = self.status();
        let (message, id) = self.public_message();
        let retry_after = match self {
            ApiError::Auth(AuthError::RateLimited { retry_after, .. }) => {
                Some(retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0))
            }
            ApiError::Llm(LlmError::OrgBusy { retry_after, .. }) => Some(retry_after.as_secs()),
            ApiError::AtCapacity(full) => Some(full.retry_after_secs()),
            ApiError::Llm(LlmError::Busy) | ApiError::TooMany { .. } | ApiError::Draining => {
                Some(1)
            }
            _ => None,
        };
        let mut response = json_error(status, code, message);
        if let Some(id) = id.and_then(|id| HeaderValue::from_str(&id).ok()) {
            response.headers_mut().insert("x-request-id", id);
        }
        if let Some(secs) = retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
        }
        response
    }
}

/// A new request id for a failure's log line and answer.
fn request_id() -> String {
    format!("req_{}", uuid::Uuid::new_v4().simple())
}

/// What a server-side failure of `code` says to the client.
fn server_error_text(code: &str) -> &'static str {
    match code {
        "model_busy" => "the language model is busy; try again shortly",
        "draining" => {
            "this instance is restarting and takes no new calls or sessions; connect again"
        }
        "at_capacity" => {
            "this instance takes no more live calls now; connect again later or to another instance"
        }
        "storage_unavailable" => "storage is unavailable; try again shortly",
        "upstream_error" => "the language model provider failed",
        "upstream_timeout" => "the language model provider did not answer in time",
        "plan_not_configured" => "this organisation's plan is not configured on the server",
        "model_error" => "the language model failed",
        _ => "internal error",
    }
}

/// A JSON error body with `status`.
pub fn json_error(status: StatusCode, code: &'static str, message: String) -> Response {
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
        let id = request_id();
        tracing::error!(request_id = %id, ?rejection, "unhandled rejection");
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            format!("internal error (request id {id})"),
        )
    };
    Ok(json_error(status, code, message))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn rate_limited() -> AuthError {
        AuthError::RateLimited {
            rpm: 1,
            retry_after: Duration::from_millis(1500),
        }
    }

    #[test]
    fn statuses_of_auth_errors() {
        let cases: Vec<(ApiError, u16)> = vec![
            (AuthError::MissingKey.into(), 401),
            (AuthError::InvalidKey.into(), 401),
            (AuthError::OrgDeleted.into(), 404),
            (AuthError::QuotaExhausted(UsageKind::Tokens).into(), 402),
            (rate_limited().into(), 429),
            (ApiError::Internal("x".into()), 500),
        ];
        for (err, status) in cases {
            assert_eq!(err.status().0.as_u16(), status, "{err}");
        }
    }

    #[test]
    fn realtime_close_codes() {
        let refused = |e: AuthError| close_frame(SocketClose::ChatRefused(&e));
        let ended = |e: AuthError| close_frame(SocketClose::ChatEnded(&e));
        assert_eq!(refused(AuthError::MissingKey).0, 4401);
        assert_eq!(refused(AuthError::InvalidKey).0, 4401);
        assert_eq!(refused(AuthError::OrgDeleted).0, 4404);
        // Mid-session, an invalid key is a revoked one: 1011 with the contract's reason.
        assert_eq!(
            ended(AuthError::InvalidKey),
            (1011, REVOKED_REASON.to_owned())
        );
        assert_eq!(ended(AuthError::OrgDeleted).0, 4404);
        assert_eq!(ended(AuthError::QuotaExhausted(UsageKind::Tokens)).0, 4402);
        assert_eq!(ended(rate_limited()).0, 1011);
    }

    #[test]
    fn live_call_close_codes() {
        use callstream_actors::call::{Child, DisconnectReason};
        let call = |end: CallEnd| close_frame(SocketClose::Call(&end));
        assert_eq!(call(CallEnd::Closed), (1000, String::new()));
        assert_eq!(call(CallEnd::ClientGone), (1000, String::new()));
        for reason in [
            DisconnectReason::UnsupportedMedia,
            DisconnectReason::QuotaExhausted,
            DisconnectReason::ProtocolError,
        ] {
            assert_eq!(call(CallEnd::Disconnected(reason)), (1000, String::new()));
        }
        assert_eq!(call(CallEnd::IdleTimeout), (1000, "idle timeout".into()));
        for end in [
            CallEnd::ChildFailed(Child::Transcriber(1)),
            CallEnd::ChildFailed(Child::Deinterleaver),
            CallEnd::Failed,
        ] {
            assert_eq!(call(end), (1011, "internal error".into()));
        }
        assert_eq!(
            close_frame(SocketClose::CallRefused),
            (4401, "unauthorized".into())
        );
    }

    #[test]
    fn server_errors_say_no_more_than_their_kind_and_a_request_id() {
        let panic = ApiError::Internal(
            "task 17 panicked with message \"TimeBase cannot have 0\" at /root/src/x.rs".into(),
        );
        let response = panic.to_response();
        assert_eq!(response.status(), 500);
        let id = response.headers()["x-request-id"]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(id.starts_with("req_"));
        let (message, _) = panic.public_message();
        assert!(
            message.starts_with("internal error (request id req_"),
            "{message}"
        );
        assert!(!message.contains("panicked") && !message.contains("/root"));
        let upstream = ApiError::Llm(LlmError::Upstream("HTTP 500: secret body".into()));
        let (message, id) = upstream.public_message();
        assert!(
            message.starts_with("the language model provider failed"),
            "{message}"
        );
        assert!(id.is_some() && !message.contains("secret"));
        // Client errors keep their full message and have no id.
        let bad = ApiError::BadRequest {
            code: "invalid_audio",
            message: "sample rate 0 Hz is outside 2000-192000 Hz".into(),
        };
        assert_eq!(bad.public_message(), (bad.to_string(), None));
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
