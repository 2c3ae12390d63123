//! The actor tree of one live call.
//!
//! ```text
//! socket task --Text/Audio--> CallSupervisor --Frame--> Deinterleaver --Samples--> Transcriber x channels
//!                                  ^    |                                              |
//!                                  |    '--Analyze--> Intent (one run at a time)       | utterances
//!                                  |                                                   v
//!                                  '---- TranscriberEvent / IntentOutcome ------- ASR pool (threads)
//! ```
//!
//! The supervisor owns the protocol [`Session`](crate::protocol::session::Session), numbers
//! every message it sends, maps utterances onto the call timeline and reports audio to the
//! process-wide [`Billing`](crate::billing::Billing) actor, which leases it the audio pool in
//! slices (30 s by default) before the audio is served. Children never name the supervisor: each reports through a typed port
//! (`DerivedActorRef` of its own event type), so the dependency runs one way. Queues are
//! bounded: the socket task holds a [`Credit`] for every frame it hands in until the
//! transcribers have taken the samples, the outbound queue to the socket is bounded, the ASR
//! pool's live queue is bounded and each transcriber holds at most
//! [`CallSettings::max_held_utterances`] utterances the pool refused.
//!
//! How a call ends is a [`CallEnd`]; the service turns it into a close code.

pub mod deinterleaver;
pub mod intent;
pub mod message;
pub mod outbound;
pub mod ports;
pub mod settings;
pub mod supervisor;
pub mod transcriber;

pub use outbound::{
    CallEnd, Child, DisconnectReason, Outbound, MEDIA_INFO, QUOTA_INFO, REVOKED_INFO, STOPPING_INFO,
};
pub use ports::{CallEnded, CallInfo, CallObserver, FinalLine, IntentClassifier, IntentFuture};
pub use settings::{CallSettings, Credit, LiveStats};
pub use supervisor::{CallArgs, CallMsg, CallSupervisor};
