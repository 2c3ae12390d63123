//! `WSS /api/llm/chat/realtime`: chat turns over one WebSocket, streamed piece by piece.
//!
//! Client frame: `{"type": "message", "messages": [...], "return_markdown": bool,
//! "system_prompt"?: string, "user"?: string}`. Server frames per turn: zero or more
//! `{"type": "delta", "text"}`, then `{"type": "done", "usage"}`; or `{"type": "error",
//! "message"}`, after which the connection stays open.
//!
//! Lifecycle (spec section 3): a missing or invalid key closes the socket right after the
//! upgrade. Each turn re-checks the key (revoked: closed), the organisation (deleted: closed),
//! the key's RPM budget shared with REST (exceeded: error frame) and reserves its worst case
//! (prompt and 4096 tokens, or what is left) against the token quota (nothing left: closed).
//! During and between turns the key and organisation are re-checked every 250 ms, so a
//! revocation or deletion closes the session within a second; so does a server that stops. The
//! close codes and reasons are chosen by [`close_frame`]. One
//! turn runs at a time; a frame that arrives during a turn gets an error frame. Turns run with
//! a fixed cap of 4096 tokens and temperature 0.2; sampling fields are refused.
//!
//! A turn is billed for what it generated even when the session ends under it: the model
//! stops at its next token (nobody reads the deltas) and the prompt and tokens so far are
//! recorded. The server waits for such turns before it exits.

use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde::Serialize;
use serde_json::Value;
use tokio::sync::mpsc;
use warp::ws::{Message as WsMessage, WebSocket, Ws};
use warp::{Filter, Rejection, Reply};

use callstream_actors::usage::UsageSource;

use crate::app::App;
use crate::auth::slots::Slot;
use crate::auth::{AuthError, Caller};
use crate::http::chat::{parse_common, REALTIME_MAX_TOKENS, REALTIME_TEMPERATURE, SAMPLING_FIELDS};
use crate::http::errors::{close_frame, is_too_big, ApiError, SocketClose};
use crate::llm::chat::{ChatTurn, TurnError};
use crate::llm::markdown::PlainStream;
use crate::llm::{LlmError, Sampling, Usage};

/// How often an open session re-checks its key.
const KEY_CHECK: Duration = Duration::from_millis(250);

/// Frames the server sends.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ServerFrame {
    /// A piece of the answer.
    Delta {
        /// Text.
        text: String,
    },
    /// The end of a turn.
    Done {
        /// Tokens billed; `null` when an MCP tool loop hit its cap without a final answer.
        usage: Option<Usage>,
    },
    /// The turn failed; the connection stays open.
    Error {
        /// What went wrong.
        message: String,
    },
}

/// `GET /api/llm/chat/realtime` (WebSocket upgrade).
///
/// The key is resolved before the upgrade so that a key already holding
/// `realtime.max_sessions_per_key` sessions is answered 429 without one; a missing or invalid
/// key still gets its close code after the upgrade, as the contract says.
pub fn routes(app: App) -> impl Filter<Extract = (impl Reply,), Error = Rejection> + Clone {
    warp::path!("api" / "llm" / "chat" / "realtime")
        .and(warp::ws())
        .and(warp::header::optional::<String>("x-api-key"))
        .and_then(move |ws: Ws, key: Option<String>| {
            let app = app.clone();
            async move { Ok::<_, Rejection>(handshake(app, ws, key).await) }
        })
}

/// Admits the upgrade (see [`routes`]).
async fn handshake(app: App, ws: Ws, key: Option<String>) -> warp::reply::Response {
    if app.lifecycle.is_draining() {
        return ApiError::Draining.to_response();
    }
    let limits = &app.config.realtime;
    let admitted = match app.auth.authenticate(key.as_deref()).await {
        Ok(caller) => match take_places(&app, &caller).await {
            Ok(slots) => Ok((caller, slots)),
            Err(refused) => return refused.to_response(),
        },
        Err(e) => Err(e),
    };
    ws.max_message_size(limits.max_frame_bytes)
        .max_frame_size(limits.max_frame_bytes)
        .on_upgrade(move |socket| session(app, key, admitted, socket))
        .into_response()
}

/// Takes the session's places under its key's cap (`realtime.max_sessions_per_key`) and its
/// organisation's (the plan's `max_realtime_sessions`), counted over every instance, or says
/// why not (429 before the upgrade).
async fn take_places(app: &App, caller: &Caller) -> Result<(Slot, Slot), ApiError> {
    let store = |e: crate::store::StoreError| ApiError::Auth(AuthError::Store(e));
    let too_many = |what: &str, max: usize| ApiError::TooMany {
        code: "too_many_sessions",
        message: format!("{what} already has {max} realtime sessions open"),
    };
    let per_key = app.config.realtime.max_sessions_per_key;
    let key = app
        .slots
        .try_acquire(&format!("realtime:{}", caller.key.id), per_key)
        .await
        .map_err(store)?
        .ok_or_else(|| too_many("this API key", per_key))?;
    let per_org = caller.plan.max_realtime_sessions;
    let org = app
        .slots
        .try_acquire(&format!("realtime:org:{}", caller.org.id), per_org)
        .await
        .map_err(store)?
        .ok_or_else(|| too_many("this organisation", per_org))?;
    Ok((key, org))
}

impl ServerFrame {
    /// The error frame of a failed turn: what a REST client would read in the error body.
    fn error(e: ApiError) -> Self {
        ServerFrame::Error {
            message: e.public_message().0,
        }
    }
}

fn frame(f: &ServerFrame) -> WsMessage {
    WsMessage::text(serde_json::to_string(f).expect("server frames always serialize"))
}

/// What the session must do after a client frame.
enum Next {
    /// Send this frame and carry on.
    Reply(ServerFrame),
    /// The key, organisation or quota is no longer good: close the session.
    Close(AuthError),
    /// Run this turn, under this reservation.
    Turn(Box<ChatTurn>, Option<String>, crate::usage::Reservation),
}

async fn on_frame(app: &App, key: &str, text: &str, caller: &mut Caller) -> Next {
    let value: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            return Next::Reply(ServerFrame::Error {
                message: format!("the frame is not valid JSON: {e}"),
            })
        }
    };
    if value.get("type").and_then(Value::as_str) != Some("message") {
        return Next::Reply(ServerFrame::Error {
            message: "frames must have \"type\": \"message\"".into(),
        });
    }
    if let Some(field) = SAMPLING_FIELDS.iter().find(|f| value.get(**f).is_some()) {
        return Next::Reply(ServerFrame::Error {
            message: format!("{field} is not accepted on realtime chat (turns use 4096 tokens at temperature 0.2)"),
        });
    }
    let fields = match parse_common(&value) {
        Ok(fields) => fields,
        Err(invalid) => {
            return Next::Reply(ServerFrame::Error {
                message: invalid.message,
            })
        }
    };
    // The key and organisation as they are now, not as they were at the handshake.
    match app.auth.authenticate(Some(key)).await {
        Ok(fresh) => *caller = fresh,
        Err(e @ (AuthError::Store(_) | AuthError::PlanMissing(_))) => {
            return Next::Reply(ServerFrame::error(ApiError::Auth(e)))
        }
        Err(e) => return Next::Close(e),
    }
    if let Err(e) = app.auth.check_rate(caller, Instant::now()).await {
        return Next::Reply(ServerFrame::error(ApiError::Auth(e)));
    }
    let sampling = Sampling {
        max_tokens: REALTIME_MAX_TOKENS,
        temperature: REALTIME_TEMPERATURE,
        ..Sampling::default()
    };
    let mut turn = ChatTurn {
        messages: fields.messages,
        system_prompt: fields.system_prompt,
        return_markdown: fields.return_markdown,
        sampling,
        budget: None,
        response_format: None,
    };
    match crate::http::chat::reserve_turn(app, caller, &mut turn).await {
        Ok(reservation) => Next::Turn(Box::new(turn), fields.user, reservation),
        Err(e @ AuthError::QuotaExhausted(_)) => Next::Close(e),
        Err(e) => Next::Reply(ServerFrame::error(ApiError::Auth(e))),
    }
}

async fn run_turn(
    app: App,
    caller: Caller,
    turn: ChatTurn,
    user: Option<String>,
    reservation: crate::usage::Reservation,
    out: mpsc::Sender<ServerFrame>,
) {
    // The process waits for this turn to be billed before it exits.
    let _work = app.lifecycle.work();
    let (delta_tx, mut delta_rx) = mpsc::channel::<String>(64);
    let markdown = turn.return_markdown;
    let forward = {
        let out = out.clone();
        async move {
            let mut plain = (!markdown).then(PlainStream::default);
            while let Some(piece) = delta_rx.recv().await {
                let text = match plain.as_mut() {
                    Some(p) => p.push(&piece),
                    None => piece,
                };
                if !text.is_empty() && out.send(ServerFrame::Delta { text }).await.is_err() {
                    return;
                }
            }
            if let Some(rest) = plain
                .as_mut()
                .map(PlainStream::finish)
                .filter(|r| !r.is_empty())
            {
                let _ = out.send(ServerFrame::Delta { text: rest }).await;
            }
        }
    };
    let org = caller.org.clone();
    let generate = async move {
        app.chat
            .run(&org, turn, Some(delta_tx))
            .await
            .map(|o| (o, app))
    };
    let (result, ()) = tokio::join!(generate, forward);
    let (billed, last) = match result {
        Ok((outcome, _)) => (
            outcome.billed.total_tokens,
            Some(ServerFrame::Done {
                usage: outcome.usage,
            }),
        ),
        // The client left mid-turn: what was generated until then is billed.
        Err(TurnError {
            error: LlmError::Cancelled { .. },
            spent,
        }) => (spent.total_tokens, None),
        // A turn that failed is billed for what it spent before (text already streamed,
        // earlier model calls of its tool loop).
        Err(TurnError { error, spent }) => (
            spent.total_tokens,
            Some(ServerFrame::error(ApiError::Llm(error))),
        ),
    };
    let settled = reservation
        .settle(&caller.account(), billed, UsageSource::Realtime, user)
        .await;
    let last = match (settled, last) {
        (Err(e), Some(ServerFrame::Done { .. })) => {
            Some(ServerFrame::error(ApiError::Billing(e.to_string())))
        }
        (Err(e), _) => {
            tracing::error!(error = %e, tokens = billed, "realtime usage not recorded");
            None
        }
        (Ok(()), last) => last,
    };
    if let Some(last) = last {
        let _ = out.send(last).await;
    }
}

/// Sends a session's frames to its socket, each within `timeout`; a client that reads
/// nothing for that long is gone. Ends when the session drops its sender or the socket fails.
async fn writer(
    mut tx: futures_util::stream::SplitSink<WebSocket, WsMessage>,
    mut frames: mpsc::Receiver<WsMessage>,
    timeout: Duration,
) {
    while let Some(message) = frames.recv().await {
        let closing = message.is_close();
        match tokio::time::timeout(timeout, tx.send(message)).await {
            Ok(Ok(())) if !closing => {}
            Ok(Ok(())) => break,
            Ok(Err(_)) => return,
            Err(_) => {
                tracing::info!("realtime client reads nothing; session ended");
                return;
            }
        }
    }
    let _ = tokio::time::timeout(timeout, tx.close()).await;
}

/// Why a session ends.
enum End {
    /// The client closed or the socket failed.
    Gone,
    /// The key, organisation or quota is no longer good.
    Refused(AuthError),
    /// Nothing happened for `realtime.idle_timeout_ms`.
    Idle,
    /// The client sent a frame over `realtime.max_frame_bytes`.
    TooBig,
    /// The server is shutting down.
    Stopping,
}

async fn session(
    app: App,
    key: Option<String>,
    admitted: Result<(Caller, (Slot, Slot)), AuthError>,
    socket: WebSocket,
) {
    let limits = app.config.realtime.clone();
    let (tx, mut rx) = socket.split();
    // Frames to the socket: at most this many wait for a client that is slow to read.
    let (out, frames) = mpsc::channel::<WsMessage>(256);
    let writer = tokio::spawn(writer(
        tx,
        frames,
        Duration::from_millis(limits.write_timeout_ms),
    ));
    let (mut caller, _slot) = match admitted {
        Ok(admitted) => admitted,
        Err(e) => {
            let (code, reason) = close_frame(SocketClose::ChatRefused(&e));
            let _ = out.try_send(WsMessage::close_with(code, reason));
            drop(out);
            let _ = writer.await;
            return;
        }
    };
    let key = key.expect("authenticated, so a key was given");
    let (turn_tx, mut turn_rx) = mpsc::channel::<ServerFrame>(64);
    let mut turn: Option<tokio::task::JoinHandle<()>> = None;
    // Whether the running turn's last frame (done or error) has gone to the client: the turn
    // then only has to return, and the client may already have sent its next message.
    let mut turn_ended = false;
    // With a shared database the key is checked when any instance announces a change (and
    // now and then); alone, on a short timer.
    let mut changes = app.shared.changes();
    let mut check = tokio::time::interval(if changes.is_some() {
        crate::calls::FALLBACK_CHECK
    } else {
        KEY_CHECK
    });
    let idle = Duration::from_millis(limits.idle_timeout_ms);
    let mut idle_at = tokio::time::Instant::now() + idle;
    let stopped = app.lifecycle.stopped();
    tokio::pin!(stopped);
    // A frame the writer cannot take means the client has stopped reading.
    let send = |f: &ServerFrame| out.try_send(frame(f)).is_ok();
    let end = loop {
        let busy = turn.as_ref().is_some_and(|t| !t.is_finished());
        tokio::select! {
            incoming = rx.next() => {
                let msg = match incoming {
                    Some(Ok(msg)) => msg,
                    Some(Err(e)) if is_too_big(&e) => break End::TooBig,
                    _ => break End::Gone,
                };
                if msg.is_close() {
                    break End::Gone;
                }
                idle_at = tokio::time::Instant::now() + idle;
                let Ok(text) = msg.to_str() else { continue };
                if turn_ended {
                    // Its last frame is out; the task is returning. Joined before the next
                    // turn, so a client that answers a done frame at once is not told to wait.
                    if let Some(t) = turn.take() {
                        let _ = t.await;
                    }
                }
                let busy = turn.as_ref().is_some_and(|t| !t.is_finished());
                if busy {
                    let busy = ServerFrame::Error { message: "a turn is already in progress; wait for its done frame".into() };
                    if !send(&busy) {
                        break End::Gone;
                    }
                    continue;
                }
                match on_frame(&app, &key, text, &mut caller).await {
                    Next::Reply(f) => {
                        if !send(&f) {
                            break End::Gone;
                        }
                    }
                    Next::Close(e) => break End::Refused(e),
                    Next::Turn(t, user, reservation) => {
                        turn_ended = false;
                        turn = Some(tokio::spawn(run_turn(app.clone(), caller.clone(), *t, user, reservation, turn_tx.clone())));
                    }
                }
            }
            Some(f) = turn_rx.recv() => {
                idle_at = tokio::time::Instant::now() + idle;
                // A turn sends deltas, then one done or error frame, its last.
                turn_ended = !matches!(f, ServerFrame::Delta { .. });
                if !send(&f) {
                    break End::Gone;
                }
            }
            () = crate::calls::next_check(&mut check, &mut changes) => {
                match app.auth.authenticate(Some(&key)).await {
                    Ok(_) => {}
                    Err(e @ (AuthError::MissingKey | AuthError::InvalidKey | AuthError::OrgDeleted)) => break End::Refused(e),
                    // A store that fails a check is not a revocation; the next check retries.
                    Err(_) => {}
                }
            }
            () = &mut stopped => break End::Stopping,
            _ = tokio::time::sleep_until(idle_at), if !busy => break End::Idle,
            _ = out.closed() => break End::Gone,
        }
    };
    // A turn in progress is left to finish on its own: with nobody reading its deltas, the
    // model stops at the next token and the turn bills what was generated.
    drop(turn);
    drop(turn_rx);
    let close = match &end {
        End::Gone => None,
        End::Refused(e) => Some(close_frame(SocketClose::ChatEnded(e))),
        End::Idle => Some(close_frame(SocketClose::ChatIdle)),
        End::TooBig => Some(close_frame(SocketClose::TooBig)),
        End::Stopping => Some(close_frame(SocketClose::ServerStopping)),
    };
    if let Some((code, reason)) = close {
        let _ = out.try_send(WsMessage::close_with(code, reason));
    }
    drop(out);
    let _ = writer.await;
}
