//! What a call's supervisor is told: frames from the socket, its children's reports, the
//! service's orders, its timers and the billing actor's answers.

use super::intent::IntentOutcome;
use super::outbound::DisconnectReason;
use super::settings::Credit;
use super::transcriber::TranscriberEvent;

/// Messages of the call supervisor (`supervisor.rs`).
#[derive(Debug)]
pub enum CallMsg {
    /// A text frame from the client.
    Text(String, Credit),
    /// A binary frame from the client.
    Audio(Vec<u8>, Credit),
    /// The socket closed or failed on the client's side.
    SocketClosed,
    /// The client sent a frame larger than the server takes; the socket is unusable.
    FrameTooLarge,
    /// What a transcriber reports.
    Channel(TranscriberEvent),
    /// The intent actor's result.
    Intent(IntentOutcome),
    /// The service ends the call for this reason (`disconnect`, then close).
    Disconnect(DisconnectReason),
    /// Time to see whether the client has gone silent.
    IdleTick,
    /// The client did not answer our `disconnect` in time.
    GraceOver,
    /// A connection probe was answered a while ago.
    ProbeOver,
    /// The billing actor's answer to a lease: milliseconds granted, or why none.
    Leased(Result<u64, crate::usage::UsageError>),
    /// Time to ask again for a lease that billing could not grant.
    RetryLease,
}

impl From<TranscriberEvent> for CallMsg {
    fn from(e: TranscriberEvent) -> Self {
        CallMsg::Channel(e)
    }
}

impl TryFrom<CallMsg> for TranscriberEvent {
    type Error = CallMsg;
    fn try_from(m: CallMsg) -> Result<Self, CallMsg> {
        match m {
            CallMsg::Channel(e) => Ok(e),
            other => Err(other),
        }
    }
}

impl From<IntentOutcome> for CallMsg {
    fn from(o: IntentOutcome) -> Self {
        CallMsg::Intent(o)
    }
}

impl TryFrom<CallMsg> for IntentOutcome {
    type Error = CallMsg;
    fn try_from(m: CallMsg) -> Result<Self, CallMsg> {
        match m {
            CallMsg::Intent(o) => Ok(o),
            other => Err(other),
        }
    }
}
