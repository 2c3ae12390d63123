//! `WSS /api/callstream/ws`: live calls from Genesys Cloud over AudioHook v2.
//!
//! The upgrade request is authenticated here (connector client id in `X-API-Key`, RFC 9421
//! signature keyed by its client secret); a refused key or signature closes the socket as
//! [`SocketClose::CallRefused`] before a protocol message, and a store that cannot check the
//! signature's nonce is answered `503` before the upgrade (a possible replay is never let
//! through). An authenticated socket gets a [`CallSupervisor`] that runs the protocol and the
//! call's actors. This module only moves frames: the socket's reader hands each frame
//! to the supervisor with a credit from a bounded pool (so a call that cannot keep up stops
//! being read, and TCP pushes back on the client), and its writer sends what the supervisor
//! queues. If the supervisor dies without closing the socket, the writer closes it as
//! [`CallEnd::Failed`] and the call's usage is written here. Close codes come from
//! [`close_frame`].

use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use ractor::Actor;
use tokio::sync::{mpsc, Semaphore};
use warp::http::HeaderMap;
use warp::ws::{Message as WsMessage, WebSocket, Ws};
use warp::{Filter, Rejection, Reply};

use callstream_actors::billing;
use callstream_actors::call::{CallArgs, CallEnd, CallMsg, CallSupervisor, Outbound};
use callstream_actors::usage::Account;

use crate::app::App;
use crate::auth::rfc9421::RequestParts;
use crate::auth::slots::Slot;
use crate::auth::AuthError;
use crate::calls::HandshakeError;
use crate::capacity::{LiveLag, Place};
use crate::http::errors::{close_frame, is_too_big, ApiError, SocketClose};

/// The close frame for `why`.
fn close_message(why: SocketClose<'_>) -> WsMessage {
    let (code, reason) = close_frame(why);
    WsMessage::close_with(code, reason)
}

/// `GET /api/callstream/ws` (WebSocket upgrade).
pub fn routes(app: App) -> impl Filter<Extract = (impl Reply,), Error = Rejection> + Clone {
    warp::path!("api" / "callstream" / "ws")
        .and(warp::ws())
        .and(warp::path::full())
        .and(warp::query::raw().or(warp::any().map(String::new)).unify())
        .and(warp::header::headers_cloned())
        .and_then(
            move |ws: Ws, path: warp::path::FullPath, query: String, headers: HeaderMap| {
                let app = app.clone();
                async move { Ok::<_, Rejection>(handshake(app, ws, path, query, headers).await) }
            },
        )
}

/// Admits the upgrade, or answers why not (see [`routes`]).
async fn handshake(
    app: App,
    ws: Ws,
    path: warp::path::FullPath,
    query: String,
    headers: HeaderMap,
) -> warp::reply::Response {
    if app.lifecycle.is_draining() {
        return ApiError::Draining.to_response();
    }
    let verdict = match authenticate(&app, path.as_str(), &query, &headers).await {
        Ok(account) => match admit(&app, &account).await {
            Ok(places) => Ok((account, places)),
            Err(refused) => return refused.to_response(),
        },
        // The nonces could not be checked (the store is down, or full of nonces that have
        // not expired): refused before the upgrade, never accepted as a possible replay.
        Err(HandshakeError::Store(e)) => {
            tracing::warn!(error = %e, "AudioHook handshake refused: nonces unavailable");
            return ApiError::Auth(AuthError::Store(e)).to_response();
        }
        Err(e) => {
            tracing::info!(error = %e, "AudioHook handshake refused");
            Err(())
        }
    };
    let session_header = headers
        .get("audiohook-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let max = app.config.calls.max_frame_bytes;
    ws.max_message_size(max)
        .max_frame_size(max)
        .on_upgrade(move |socket| async move {
            match verdict {
                Ok((account, (_here, _connector, _org, redact))) => {
                    call(app, account, redact, session_header, socket).await
                }
                Err(()) => refuse(socket).await,
            }
        })
        .into_response()
}

/// Takes the call's places: one on this instance while it has room for another call
/// ([`crate::capacity`]: refused `503` `at_capacity`, so the platform retries later or
/// elsewhere, and the calls in progress keep their speech workers), then under its
/// connector's and its organisation's caps (the plan's `max_live_calls`, within
/// `calls.max_calls_per_org`), counted over every instance (refused `429`). Both are answered
/// before the upgrade. Also tells whether the organisation redacts this connector's calls.
async fn admit(app: &App, account: &Account) -> Result<(Place, Slot, Slot, bool), ApiError> {
    let here = app
        .capacity
        .admit(&LiveLag::of(&app.asr))
        .inspect_err(|_| app.calls.live.refused(&account.org_id))?;
    let limits = &app.config.calls;
    let too_many = |what: &str, max: usize| ApiError::TooMany {
        code: "too_many_calls",
        message: format!("{what} already has {max} calls in progress"),
    };
    let store = |e: crate::store::StoreError| ApiError::Auth(AuthError::Store(e));
    let found = app.store.org(&account.org_id).await.map_err(store)?;
    let redact = found
        .as_ref()
        .is_some_and(|org| org.history.redacts(&account.key_id));
    let plan_cap = found
        .and_then(|org| app.config.plans.get(&org.plan).map(|p| p.max_live_calls))
        .unwrap_or(usize::MAX);
    let org_cap = limits.max_calls_per_org.min(plan_cap);
    let connector = app
        .slots
        .try_acquire(
            &format!("calls:connector:{}", account.key_id),
            limits.max_calls_per_connector,
        )
        .await
        .map_err(store)?
        .ok_or_else(|| too_many("this connector", limits.max_calls_per_connector))?;
    let org = app
        .slots
        .try_acquire(&format!("calls:org:{}", account.org_id), org_cap)
        .await
        .map_err(store)?
        .ok_or_else(|| too_many("this organisation", org_cap))?;
    Ok((here, connector, org, redact))
}

async fn authenticate(
    app: &App,
    path: &str,
    query: &str,
    headers: &HeaderMap,
) -> Result<Account, HandshakeError> {
    let pairs: Vec<(String, String)> = headers
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let target = if query.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{query}")
    };
    let authority = headers
        .get("host")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let request = RequestParts {
        method: "GET",
        target: &target,
        authority,
        headers: &pairs,
    };
    app.calls
        .authenticate(&request, crate::clock::now_ms() / 1000)
        .await
}

async fn refuse(socket: WebSocket) {
    let (mut tx, _rx) = socket.split();
    let _ = tx.send(close_message(SocketClose::CallRefused)).await;
    let _ = tx.close().await;
}

async fn call(
    app: App,
    account: Account,
    redact: bool,
    session_header: Option<String>,
    socket: WebSocket,
) {
    let (mut tx, mut rx) = socket.split();
    let settings = &app.config.calls;
    let billing_actor = match app.calls.billing().await {
        Ok(b) => b,
        Err(e) => {
            tracing::error!(error = %e, "billing actor unavailable");
            let _ = tx
                .send(close_message(SocketClose::Call(&CallEnd::Failed)))
                .await;
            return;
        }
    };
    let call_id = crate::store::new_id("call", 12);
    let (out_tx, mut out_rx) = mpsc::channel::<Outbound>(settings.outbound_messages);
    let args = CallArgs {
        call_id: call_id.clone(),
        session_header,
        account: account.clone(),
        outbound: out_tx,
        pool: app.asr.clone(),
        billing: billing_actor.clone(),
        classifier: app.calls.classifier(&account),
        settings: app.calls.settings(&app.languages),
        stats: app.calls.stats.clone(),
        observer: Some(app.recorder.clone()),
        redact,
    };
    let (supervisor, _handle) = match Actor::spawn(None, CallSupervisor, args).await {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "call supervisor did not start");
            let _ = tx
                .send(close_message(SocketClose::Call(&CallEnd::Failed)))
                .await;
            return;
        }
    };

    // Revocations and a shutdown reach the call through the registry.
    let _registered = app.calls.register(&call_id, account, supervisor.clone());

    // The writer: frames the supervisor queues, until it closes the socket or goes away. Each
    // write gets `calls.write_timeout_ms`: a client that reads nothing for that long is gone,
    // and the supervisor is told so (it ends the call and writes its usage) instead of
    // waiting on a full queue.
    let write_timeout = Duration::from_millis(settings.write_timeout_ms);
    let told = supervisor.clone();
    let mut writer = tokio::spawn(async move {
        while let Some(out) = out_rx.recv().await {
            let (message, last) = match out {
                Outbound::Text(text) => (WsMessage::text(text), false),
                Outbound::Close(end) => (close_message(SocketClose::Call(&end)), true),
            };
            match tokio::time::timeout(write_timeout, tx.send(message)).await {
                Ok(Ok(())) if !last => {}
                Ok(Ok(())) => {
                    let _ = tokio::time::timeout(write_timeout, tx.close()).await;
                    return true;
                }
                Ok(Err(_)) | Err(_) => {
                    tracing::info!("call client reads nothing or is gone; ending the call");
                    let _ = told.cast(CallMsg::SocketClosed);
                    return true;
                }
            }
        }
        // The supervisor is gone without closing the socket: it failed.
        let failed = close_message(SocketClose::Call(&CallEnd::Failed));
        let _ = tokio::time::timeout(write_timeout, tx.send(failed)).await;
        let _ = tokio::time::timeout(write_timeout, tx.close()).await;
        false
    });

    let credits = Arc::new(Semaphore::new(settings.inbound_frames));
    let mut writer_done = None;
    loop {
        tokio::select! {
            done = &mut writer => {
                writer_done = Some(done.unwrap_or(false));
                break;
            }
            incoming = rx.next() => {
                let msg = match incoming {
                    Some(Ok(msg)) if msg.is_close() => Err(CallMsg::SocketClosed),
                    Some(Ok(msg)) => Ok(msg),
                    Some(Err(e)) if is_too_big(&e) => Err(CallMsg::FrameTooLarge),
                    Some(Err(e)) => {
                        tracing::info!(call = %call_id, error = %e, "call socket error");
                        Err(CallMsg::SocketClosed)
                    }
                    None => Err(CallMsg::SocketClosed),
                };
                let msg = match msg {
                    Ok(msg) => msg,
                    Err(end) => {
                        let _ = supervisor.cast(end);
                        break;
                    }
                };
                if !(msg.is_text() || msg.is_binary()) {
                    continue;
                }
                let Ok(permit) = credits.clone().acquire_owned().await else { break };
                let credit = Arc::new(permit);
                let message = if msg.is_text() {
                    CallMsg::Text(msg.to_str().unwrap_or_default().to_owned(), credit)
                } else {
                    CallMsg::Audio(msg.into_bytes(), credit)
                };
                if supervisor.cast(message).is_err() {
                    // The supervisor has stopped; the writer tells how.
                    break;
                }
            }
        }
    }
    let closed_cleanly = match writer_done {
        Some(clean) => clean,
        None => writer.await.unwrap_or(false),
    };
    if !closed_cleanly {
        tracing::error!(call = %call_id, "call supervisor failed; socket closed");
        // It did not tell the live page either.
        app.recorder.ended(
            &call_id,
            &callstream_actors::call::CallEnded {
                reason: "failed".to_owned(),
                billed_ms: 0,
            },
        );
        billing::end_call(&billing_actor, &call_id).await;
    }
}
