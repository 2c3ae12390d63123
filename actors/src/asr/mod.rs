//! The speech engine: what a loaded Whisper model can do.

pub mod languages;

pub use languages::{model_languages, Language, ModelError};
