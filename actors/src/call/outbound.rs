//! What a call sends to its socket, and why a call ends.
//!
//! The engine says *why* a call ended ([`CallEnd`]); the edge alone decides which WebSocket
//! close code and reason that becomes (`src/http/errors.rs` in the service), so the numbers live
//! in one place.

/// What the call sends to its socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outbound {
    /// A JSON text frame.
    Text(String),
    /// Close the socket for this reason; nothing follows.
    Close(CallEnd),
}

/// How a live call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallEnd {
    /// The client sent `close` and was answered with `closed`.
    Closed,
    /// The socket closed or failed on the client's side.
    ClientGone,
    /// The server sent `disconnect` for this reason; the client answered with `close`, or did
    /// not answer within the grace period.
    Disconnected(DisconnectReason),
    /// The client sent nothing, not even a ping, for the idle timeout.
    IdleTimeout,
    /// A connection probe was answered and the client did not close it in time.
    ProbeOver,
    /// The client sent a frame larger than the server takes.
    FrameTooLarge,
    /// One of the call's actors failed.
    ChildFailed(Child),
    /// The call could not start, or its supervisor failed without closing the socket.
    Failed,
}

/// Why the server sent `disconnect`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DisconnectReason {
    /// The `open` offered no media this server accepts.
    UnsupportedMedia,
    /// The organisation's transcription quota is used up (at `open` or at a quota check).
    QuotaExhausted,
    /// The client broke the protocol.
    ProtocolError,
    /// The connector was revoked or its organisation deleted during the call.
    Revoked,
    /// The server is shutting down.
    ServerStopping,
}

impl DisconnectReason {
    /// The `reason` and `info` of the `disconnect` message.
    pub fn message(self) -> (&'static str, &'static str) {
        match self {
            DisconnectReason::UnsupportedMedia => ("error", MEDIA_INFO),
            DisconnectReason::QuotaExhausted => ("error", QUOTA_INFO),
            DisconnectReason::ProtocolError => ("error", "protocol error"),
            DisconnectReason::Revoked => ("unauthorized", REVOKED_INFO),
            DisconnectReason::ServerStopping => ("error", STOPPING_INFO),
        }
    }
}

/// The `disconnect` info when the connector or organisation is no longer valid.
pub const REVOKED_INFO: &str = "The connector was revoked or its organisation deleted";
/// The `disconnect` info when the server shuts down.
pub const STOPPING_INFO: &str = "The server is shutting down; connect again to continue";

/// The `disconnect` info when the transcription quota is used up (fixed by the contract).
pub const QUOTA_INFO: &str = "Transcription quota exhausted for this plan";
/// The `disconnect` info when no offered media is supported.
pub const MEDIA_INFO: &str =
    "No supported audio format offered: this server accepts PCMU or L16 at 8000 Hz, 1 or 2 channels";

/// A child actor of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Child {
    /// Splits frames into channels.
    Deinterleaver,
    /// Transcribes the channel with this index.
    Transcriber(usize),
    /// Runs the intent analysis.
    Intent,
}

impl std::fmt::Display for Child {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Child::Deinterleaver => f.write_str("deinterleaver"),
            Child::Transcriber(channel) => write!(f, "transcriber {channel}"),
            Child::Intent => f.write_str("intent"),
        }
    }
}

impl std::fmt::Display for CallEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallEnd::Closed => f.write_str("closed by the client"),
            CallEnd::ClientGone => f.write_str("client went away"),
            CallEnd::Disconnected(DisconnectReason::UnsupportedMedia) => {
                f.write_str("disconnected: no supported media")
            }
            CallEnd::Disconnected(DisconnectReason::QuotaExhausted) => {
                f.write_str("disconnected: quota exhausted")
            }
            CallEnd::Disconnected(DisconnectReason::ProtocolError) => {
                f.write_str("disconnected: protocol error")
            }
            CallEnd::Disconnected(DisconnectReason::Revoked) => {
                f.write_str("disconnected: connector or organisation revoked")
            }
            CallEnd::Disconnected(DisconnectReason::ServerStopping) => {
                f.write_str("disconnected: server stopping")
            }
            CallEnd::IdleTimeout => f.write_str("idle timeout"),
            CallEnd::ProbeOver => f.write_str("probe answered"),
            CallEnd::FrameTooLarge => f.write_str("frame too large"),
            CallEnd::ChildFailed(child) => write!(f, "{child} failed"),
            CallEnd::Failed => f.write_str("call failed"),
        }
    }
}
