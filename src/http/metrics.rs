//! `GET /metrics`: counters of the speech workers and live calls in the Prometheus text
//! format. With `server.metrics_token` set, a scraper sends `Authorization: Bearer <token>`;
//! without it, only a client on this machine (a loopback peer, not what `X-Forwarded-For`
//! says) is answered. Others get `401`. Nothing here is per organisation; a per-organisation
//! series would be served only to a scraper with the token.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use warp::http::StatusCode;
use warp::{Filter, Rejection, Reply};

use crate::app::App;
use crate::capacity::LiveLag;
use crate::http::errors::json_error;
use crate::peer::PeerAddr;

/// `GET /metrics`.
pub fn routes(app: App) -> impl Filter<Extract = (impl Reply,), Error = Rejection> + Clone {
    warp::path!("metrics")
        .and(warp::get())
        .and(warp::ext::optional::<PeerAddr>())
        .and(warp::header::optional::<String>("authorization"))
        .map(move |peer: Option<PeerAddr>, authorization: Option<String>| {
            let token = app.config.server.metrics_token.as_str();
            if !allowed(token, peer, authorization.as_deref()) {
                let why = if token.is_empty() {
                    "metrics are served to this machine only (set server.metrics_token to scrape from elsewhere)"
                } else {
                    "metrics need Authorization: Bearer with server.metrics_token"
                };
                return json_error(StatusCode::UNAUTHORIZED, "unauthorized", why.to_owned());
            }
            warp::reply::with_header(render(&app), "content-type", "text/plain; version=0.0.4")
                .into_response()
        })
}

/// Whether a scrape from `peer` with `authorization` is answered under `token`.
fn allowed(token: &str, peer: Option<PeerAddr>, authorization: Option<&str>) -> bool {
    if token.is_empty() {
        return peer.is_some_and(|PeerAddr(p)| crate::netaddr::canonical(p.ip()).is_loopback());
    }
    let given = authorization
        .and_then(|a| a.strip_prefix("Bearer "))
        .unwrap_or_default()
        .trim();
    given.len() == token.len()
        && given
            .bytes()
            .zip(token.bytes())
            .fold(0u8, |d, (a, b)| d | (a ^ b))
            == 0
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
    let lag = LiveLag::of(&app.asr);
    metric(
        "callstream_asr_live_queued_audio_ms",
        "gauge",
        "Milliseconds of live audio waiting for a speech worker.",
        lag.queued.as_millis() as u64,
    );
    metric(
        "callstream_asr_live_expected_wait_ms",
        "gauge",
        "How long a live utterance queued now is expected to wait for a speech worker (admission control reads it).",
        lag.expected_wait().as_millis() as u64,
    );
    metric(
        "callstream_calls_capacity",
        "gauge",
        "Live calls this instance takes at most now: from the measured cost of a call, within calls.max_calls_per_instance.",
        app.capacity.ceiling(&lag) as u64,
    );
    let (ceiling, behind) = app.capacity.refused();
    metric(
        "callstream_calls_refused_at_ceiling_total",
        "counter",
        "New live calls refused because this instance had as many calls as it takes.",
        ceiling,
    );
    metric(
        "callstream_calls_refused_behind_total",
        "counter",
        "New live calls refused because live speech work was behind its latency budget.",
        behind,
    );
    metric(
        "callstream_history_writes_total",
        "counter",
        "Changes written to the call history.",
        app.history.stats.written.load(Ordering::Relaxed),
    );
    metric(
        "callstream_history_dropped_total",
        "counter",
        "Changes to the call history dropped: the writer was behind, or the store refused them three times.",
        app.history.stats.dropped.load(Ordering::Relaxed),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_need_the_token_or_a_loopback_peer() {
        let peer = |a: &str| Some(PeerAddr(a.parse().unwrap()));
        assert!(allowed("", peer("127.0.0.1:5000"), None));
        assert!(allowed("", peer("[::ffff:127.0.0.1]:5000"), None));
        assert!(!allowed("", peer("10.0.0.2:5000"), None));
        assert!(!allowed("", None, None));
        assert!(!allowed("", peer("10.0.0.2:5000"), Some("Bearer ")));
        assert!(allowed(
            "s3cret",
            peer("10.0.0.2:5000"),
            Some("Bearer s3cret")
        ));
        assert!(!allowed("s3cret", peer("127.0.0.1:5000"), None));
        assert!(!allowed(
            "s3cret",
            peer("10.0.0.2:5000"),
            Some("Bearer s3cre")
        ));
        assert!(!allowed("s3cret", peer("10.0.0.2:5000"), Some("s3cret")));
    }
}
