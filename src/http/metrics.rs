//! `GET /metrics`: counters of the speech workers and live calls in the Prometheus text
//! format, no authentication (bind the service to a private address or filter the path at the
//! proxy if that matters).

use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use warp::{Filter, Rejection, Reply};

use crate::app::App;

/// `GET /metrics`.
pub fn routes(app: App) -> impl Filter<Extract = (impl Reply,), Error = Rejection> + Clone {
    warp::path!("metrics").and(warp::get()).map(move || {
        warp::reply::with_header(render(&app), "content-type", "text/plain; version=0.0.4")
    })
}

fn render(app: &App) -> String {
    let pool = app.asr.snapshot();
    let stats = &app.calls.stats;
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, value: u64| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
        );
    };
    metric(
        "callstream_asr_live_queued",
        "gauge",
        "Live utterances waiting for a speech worker.",
        pool.live_queued as u64,
    );
    metric(
        "callstream_asr_file_queued",
        "gauge",
        "File utterances waiting for a speech worker.",
        pool.file_queued as u64,
    );
    metric(
        "callstream_asr_busy_workers",
        "gauge",
        "Speech workers decoding.",
        pool.busy_workers as u64,
    );
    metric(
        "callstream_asr_utterances_total",
        "counter",
        "Utterances recognised.",
        pool.utterances,
    );
    metric(
        "callstream_asr_live_rejected_total",
        "counter",
        "Live utterances the full live queue refused (each is held and offered again).",
        pool.live_rejected,
    );
    metric(
        "callstream_calls_active",
        "gauge",
        "Live calls in progress.",
        stats.active_calls.load(Ordering::Relaxed) as u64,
    );
    metric(
        "callstream_calls_total",
        "counter",
        "Live calls opened.",
        stats.calls.load(Ordering::Relaxed),
    );
    metric(
        "callstream_call_utterances_held_total",
        "counter",
        "Times a live utterance was held because the speech workers were behind.",
        stats.utterances_held.load(Ordering::Relaxed),
    );
    metric(
        "callstream_call_utterances_dropped_total",
        "counter",
        "Live utterances dropped because the speech workers stayed behind.",
        stats.utterances_dropped.load(Ordering::Relaxed),
    );
    metric(
        "callstream_call_transcripts_total",
        "counter",
        "Final transcripts sent to live calls.",
        stats.transcripts.load(Ordering::Relaxed),
    );
    out
}
