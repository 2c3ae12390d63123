//! The pace of request bodies: a client that sends its headers and then a byte now and then
//! holds a connection (and a handler) for as long as it likes, unless the body is held to a
//! minimum rate and a total deadline.
//!
//! [`pace`] wraps a request's body. Its clock starts when the handler first reads the body (a
//! handler that is busy elsewhere is not the client's fault). After `grace` the body must have
//! arrived at `min_bytes_per_s` on average since then, and all of it within `deadline`; else
//! reading it fails, the [`Tripped`] flag is set, and the server answers `408` and closes the
//! connection ([`timed_out`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::{Instant, Sleep};
use warp::hyper::body::HttpBody;
use warp::hyper::{Body, Request, Response, StatusCode};

/// How a request body must arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyPace {
    /// Time before the pace is judged.
    pub grace: Duration,
    /// The least average rate after the grace.
    pub min_bytes_per_s: u64,
    /// The longest a body may take.
    pub deadline: Duration,
}

impl BodyPace {
    /// Whether a body that has delivered `received` bytes `elapsed` after it was first read
    /// is too slow.
    pub fn too_slow(&self, elapsed: Duration, received: u64) -> bool {
        if elapsed > self.deadline {
            return true;
        }
        let judged = elapsed.saturating_sub(self.grace).as_secs_f64();
        (received as f64) < judged * self.min_bytes_per_s as f64
    }
}

/// Set when a request's body was cut off for its pace.
pub type Tripped = Arc<AtomicBool>;

/// How often a stalled body is looked at.
const CHECK_EVERY: Duration = Duration::from_millis(500);

struct Paced {
    inner: Body,
    pace: BodyPace,
    started: Option<Instant>,
    received: u64,
    check: Pin<Box<Sleep>>,
    tripped: Tripped,
}

impl Paced {
    fn trip(&mut self) -> Poll<Option<Result<Bytes, std::io::Error>>> {
        self.tripped.store(true, Ordering::Relaxed);
        Poll::Ready(Some(Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "the request body arrived too slowly",
        ))))
    }
}

impl futures_util::Stream for Paced {
    type Item = Result<Bytes, std::io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let now = Instant::now();
        let started = *self.started.get_or_insert(now);
        if self.tripped.load(Ordering::Relaxed) {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.inner).poll_data(cx) {
            Poll::Ready(Some(Ok(chunk))) => {
                self.received += chunk.len() as u64;
                if self.pace.too_slow(now - started, self.received) {
                    return self.trip();
                }
                return Poll::Ready(Some(Ok(chunk)));
            }
            Poll::Ready(Some(Err(e))) => {
                return Poll::Ready(Some(Err(std::io::Error::other(e))));
            }
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => {}
        }
        // Nothing came: look again at the pace when the timer fires (it wakes this task).
        loop {
            if self.pace.too_slow(Instant::now() - started, self.received) {
                return self.trip();
            }
            if self.check.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let next = Instant::now() + CHECK_EVERY;
            self.check.as_mut().reset(next);
        }
    }
}

/// Wraps `request`'s body to be held to `pace`; the flag says whether it was cut off. A
/// request without a body (a GET, a WebSocket upgrade) is left as it is.
pub fn pace(request: &mut Request<Body>, pace: BodyPace) -> Option<Tripped> {
    if request.body().is_end_stream() {
        return None;
    }
    let tripped = Tripped::default();
    let inner = std::mem::take(request.body_mut());
    *request.body_mut() = Body::wrap_stream(Paced {
        inner,
        pace,
        started: None,
        received: 0,
        check: Box::pin(tokio::time::sleep(CHECK_EVERY)),
        tripped: tripped.clone(),
    });
    Some(tripped)
}

/// The answer to a request whose body was cut off for its pace; the connection is closed.
pub fn timed_out(pace: BodyPace) -> Response<Body> {
    let body = serde_json::json!({
        "error": {
            "code": "request_timeout",
            "message": format!(
                "the request body arrived too slowly: after {} s it must come at {} bytes/s \
                 or more, and all of it within {} s",
                pace.grace.as_secs(),
                pace.min_bytes_per_s,
                pace.deadline.as_secs()
            ),
        }
    });
    Response::builder()
        .status(StatusCode::REQUEST_TIMEOUT)
        .header("content-type", "application/json")
        .header("connection", "close")
        .body(Body::from(body.to_string()))
        .expect("static headers are valid")
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;

    const PACE: BodyPace = BodyPace {
        grace: Duration::from_secs(10),
        min_bytes_per_s: 1000,
        deadline: Duration::from_secs(100),
    };

    #[test]
    fn the_pace_is_judged_after_the_grace_on_average() {
        let s = Duration::from_secs;
        assert!(!PACE.too_slow(s(9), 0));
        assert!(!PACE.too_slow(s(10), 0));
        assert!(PACE.too_slow(s(12), 1_999));
        assert!(!PACE.too_slow(s(12), 2_000));
        assert!(!PACE.too_slow(s(60), 50_000));
        assert!(PACE.too_slow(s(101), u64::MAX));
    }

    #[tokio::test]
    async fn a_trickling_body_is_cut_off_and_a_steady_one_is_not() {
        let ms = Duration::from_millis;
        let pace = BodyPace {
            grace: ms(200),
            min_bytes_per_s: 1000,
            deadline: Duration::from_secs(30),
        };
        let (mut sender, body) = Body::channel();
        let mut request = Request::new(body);
        let tripped = super::pace(&mut request, pace).unwrap();
        let mut stream = request.into_body();
        let feeder = tokio::spawn(async move {
            // A byte every 300 ms.
            while sender.send_data(Bytes::from_static(b"x")).await.is_ok() {
                tokio::time::sleep(ms(300)).await;
            }
        });
        let mut got = 0;
        let error = loop {
            match stream.next().await {
                Some(Ok(chunk)) => got += chunk.len(),
                Some(Err(e)) => break e,
                None => panic!("the body ended"),
            }
        };
        assert!(tripped.load(Ordering::Relaxed), "{error}");
        assert!(got <= 3, "{got} bytes came before the cut");
        feeder.abort();

        // 2,000 bytes every 100 ms is well over the pace.
        let (mut sender, body) = Body::channel();
        let mut request = Request::new(body);
        let tripped = super::pace(&mut request, pace).unwrap();
        tokio::spawn(async move {
            for _ in 0..10 {
                sender
                    .send_data(Bytes::from(vec![0u8; 2000]))
                    .await
                    .unwrap();
                tokio::time::sleep(ms(100)).await;
            }
        });
        let whole = warp::hyper::body::to_bytes(request.into_body())
            .await
            .unwrap();
        assert_eq!(whole.len(), 20_000);
        assert!(!tripped.load(Ordering::Relaxed));
    }

    #[tokio::test]
    async fn a_body_less_request_is_left_alone() {
        let mut request = Request::new(Body::empty());
        assert!(pace(&mut request, PACE).is_none());
    }
}
