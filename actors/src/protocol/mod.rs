//! The AudioHook v2 protocol: typed messages and the session state machine. No I/O here.

pub mod messages;
pub mod session;
