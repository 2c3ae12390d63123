//! Subcommands of the `callstream` binary beyond `serve`.

pub mod admin;
pub mod bench;
pub mod bench_analysis;
pub mod bench_topics;
pub mod call;
pub mod labelled;
pub mod password;
pub mod store;
pub mod transcribe;

/// `12.345` seconds as `00:00:12.345`.
pub fn clock(seconds: f64) -> String {
    let ms = (seconds.max(0.0) * 1000.0).round() as u64;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        ms / 3_600_000,
        ms / 60_000 % 60,
        ms / 1000 % 60,
        ms % 1000
    )
}
