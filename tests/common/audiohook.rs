//! An AudioHook client's building blocks for tests: signed upgrade requests, protocol
//! messages, and the server's metrics.

use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

use callstream::auth::rfc9421::{sign_audiohook, RequestParts};

use super::Server;

/// The AudioHook headers of an upgrade request by `client_id`, signed with `secret` at
/// `created` (Unix seconds), as Genesys sends them.
pub fn signed_headers(
    server: &Server,
    client_id: &str,
    secret: &str,
    created: i64,
) -> Vec<(String, String)> {
    signed_headers_at(&server.addr.to_string(), client_id, secret, created)
}

/// The AudioHook headers of an upgrade request signed over `authority` (the `host[:port]` the
/// client believes it connects to).
pub fn signed_headers_at(
    authority: &str,
    client_id: &str,
    secret: &str,
    created: i64,
) -> Vec<(String, String)> {
    let mut headers = vec![
        (
            "audiohook-organization-id".to_owned(),
            uuid::Uuid::new_v4().to_string(),
        ),
        (
            "audiohook-correlation-id".to_owned(),
            uuid::Uuid::new_v4().to_string(),
        ),
        (
            "audiohook-session-id".to_owned(),
            uuid::Uuid::new_v4().to_string(),
        ),
        ("x-api-key".to_owned(), client_id.to_owned()),
    ];
    let parts = RequestParts {
        method: "GET",
        target: "/api/callstream/ws",
        authority,
        headers: &headers,
    };
    let (input, signature) = sign_audiohook(&parts, client_id, secret, created).unwrap();
    headers.push(("signature-input".to_owned(), input));
    headers.push(("signature".to_owned(), signature));
    headers
}

/// A signed AudioHook upgrade request for the connector `client_id`, signed now.
pub fn audiohook_request(
    server: &Server,
    client_id: &str,
    secret: &str,
) -> tokio_tungstenite::tungstenite::handshake::client::Request {
    let headers = signed_headers(server, client_id, secret, now());
    request(server, &headers)
}

/// Unix seconds now.
pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// An upgrade request to the server's live-call route with `headers`.
pub fn request(
    server: &Server,
    headers: &[(String, String)],
) -> tokio_tungstenite::tungstenite::handshake::client::Request {
    let mut request = format!("ws://{}/api/callstream/ws", server.addr)
        .into_client_request()
        .unwrap();
    for (k, v) in headers {
        request.headers_mut().insert(
            tokio_tungstenite::tungstenite::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    request
}

/// The session id a request was signed with.
pub fn session_id(request: &tokio_tungstenite::tungstenite::handshake::client::Request) -> String {
    request.headers()["audiohook-session-id"]
        .to_str()
        .unwrap()
        .to_owned()
}

/// A client message of session `id` with the whole envelope Genesys sends.
pub fn message(id: &str, seq: u64, kind: &str, parameters: Value) -> Message {
    Message::text(
        json!({"version": "2", "id": id, "type": kind, "seq": seq, "serverseq": 0,
            "position": "PT0S", "parameters": parameters})
        .to_string(),
    )
}

/// `open` parameters offering stereo PCMU; a connection probe when `probe`.
pub fn open(probe: bool) -> Value {
    let nil = "00000000-0000-0000-0000-000000000000";
    let (conversation, participant) = if probe {
        (nil.to_owned(), nil.to_owned())
    } else {
        (
            uuid::Uuid::new_v4().to_string(),
            uuid::Uuid::new_v4().to_string(),
        )
    };
    json!({"organizationId": uuid::Uuid::new_v4().to_string(), "conversationId": conversation,
        "participant": {"id": participant, "ani": "", "aniName": "", "dnis": ""},
        "media": [{"type": "audio", "format": "PCMU", "channels": ["external", "internal"],
            "rate": 8000}], "language": "en-US"})
}

/// A value of `GET /metrics`.
pub async fn metric(server: &Server, name: &str) -> f64 {
    let text = reqwest::get(server.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
}
