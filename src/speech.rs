//! The speech engine as the service configures it: a worker pool of Whisper engines.

use callstream_actors::asr::pool::{AsrPool, PoolConfig};
use callstream_actors::asr::whisper::{WhisperEngine, WhisperSettings};
use callstream_actors::asr::{AsrEngine, AsrError};

use crate::config::Config;

/// Starts the ASR pool of `config` (`pool` overrides its worker and batch settings).
pub fn start_pool(config: &Config, pool: Option<PoolConfig>) -> Result<AsrPool, AsrError> {
    let dir = config.models.whisper.clone();
    let settings = WhisperSettings {
        beam_size: config.asr.beam_size,
        threads: 1,
        min_window_secs: config.asr.min_window_ms as f64 / 1000.0,
    };
    AsrPool::start(pool.unwrap_or_else(|| config.asr.pool()), move |_| {
        Ok(Box::new(WhisperEngine::load(&dir, settings)?) as Box<dyn AsrEngine>)
    })
}
