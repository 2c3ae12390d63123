//! A live call's client for tests: streams silence at a pace and records how the server ends
//! the call.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::handshake::client::Request;
use tokio_tungstenite::tungstenite::Message;

use super::audiohook::{message, open, session_id};

/// 100 ms of stereo PCMU silence.
pub const FRAME: [u8; 1600] = [0xFF; 1600];

/// What a call's client saw.
#[derive(Debug, Default)]
pub struct CallLog {
    /// The parameters of the server's `disconnect`, and when it came.
    pub disconnect: Option<(Value, Instant)>,
    /// The close code.
    pub close: Option<u16>,
}

/// Streams up to `frames` frames of 100 ms, `pace` apart, counting in `sent` the milliseconds
/// sent; then sends `close`. A `disconnect` from the server is answered with `close` and stops
/// the audio.
pub async fn stream_call(
    request: Request,
    frames: usize,
    pace: Duration,
    sent: Arc<AtomicU64>,
) -> CallLog {
    let id = session_id(&request);
    let Ok((ws, _)) = tokio_tungstenite::connect_async(request).await else {
        return CallLog::default();
    };
    let (mut tx, mut rx) = ws.split();
    let mut seq = 1;
    tx.send(message(&id, seq, "open", open(false)))
        .await
        .unwrap();
    let mut log = CallLog::default();
    let mut opened = false;
    let mut left = frames;
    let mut tick = tokio::time::interval(pace.max(Duration::from_millis(1)));
    loop {
        tokio::select! {
            _ = tick.tick(), if opened && left > 0 && log.disconnect.is_none() => {
                if tx.send(Message::binary(FRAME.to_vec())).await.is_err() {
                    break;
                }
                sent.fetch_add(100, Ordering::SeqCst);
                left -= 1;
                if left == 0 {
                    seq += 1;
                    let _ = tx.send(message(&id, seq, "close", json!({"reason": "end"}))).await;
                }
            }
            msg = rx.next() => match msg {
                Some(Ok(Message::Text(t))) => {
                    let v: Value = serde_json::from_str(&t).unwrap();
                    match v["type"].as_str() {
                        Some("opened") => opened = true,
                        Some("disconnect") => {
                            log.disconnect = Some((v["parameters"].clone(), Instant::now()));
                            seq += 1;
                            let _ = tx
                                .send(message(&id, seq, "close", json!({"reason": "disconnect"})))
                                .await;
                        }
                        _ => {}
                    }
                }
                Some(Ok(Message::Close(frame))) => {
                    log.close = frame.map(|f| u16::from(f.code));
                    break;
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => break,
            }
        }
    }
    log
}

/// Starts a call that streams a minute in real time; returns once it has sent `ms`.
pub async fn real_time_call(
    request: Request,
    ms: u64,
) -> (tokio::task::JoinHandle<CallLog>, Arc<AtomicU64>) {
    let sent = Arc::new(AtomicU64::new(0));
    let call = tokio::spawn(stream_call(
        request,
        600,
        Duration::from_millis(100),
        sent.clone(),
    ));
    while sent.load(Ordering::SeqCst) < ms {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (call, sent)
}
