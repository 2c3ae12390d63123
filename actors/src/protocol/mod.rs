//! The AudioHook v2 protocol: typed messages (this module) and, later, the session state
//! machine. No I/O here.

pub mod messages;
