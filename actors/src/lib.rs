//! The real-time media engine of callstream.
//!
//! This crate owns everything that touches audio and the engines: the audio path, the speech
//! engine, the AudioHook protocol state machine, the per-call actor tree and billing. It never
//! imports the service crate; what it needs from the outside world it names as a port (a trait in
//! [`usage`]) that the service implements with its store.

pub mod asr;
pub mod audio;
pub mod billing;
pub mod call;
pub mod protocol;
pub mod transcript;
pub mod usage;
