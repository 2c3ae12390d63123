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
pub mod redact;
pub mod transcript;
pub mod usage;

/// The source directory of the package cargo is testing or benchmarking: `CARGO_MANIFEST_DIR`
/// as cargo sets it for the run, else `built` (the directory the caller was compiled from, its
/// `env!("CARGO_MANIFEST_DIR")`). Looked up at run time because checkouts that share one target
/// directory also share its test binaries: a binary built in another checkout would otherwise
/// read that checkout's fixtures, or fail where it no longer exists.
#[doc(hidden)]
pub fn package_dir(built: &'static str) -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR").map_or_else(|| built.into(), Into::into)
}
