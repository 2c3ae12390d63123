//! `stream: true` on `POST /api/llm/chat/completions`: the answer as OpenAI-style server-sent
//! events, so the OpenAI SDKs' `stream=True` works unchanged.
//!
//! Events: a first `chat.completion.chunk` whose delta is `{"role": "assistant", "content": ""}`;
//! one chunk per piece of text (`return_markdown: false` strips Markdown from the stream as on
//! realtime chat); a chunk with an empty delta and the `finish_reason`; when
//! `stream_options.include_usage` is set, a chunk with no choices and the `usage` (`null` when
//! the tool loop hit its cap); then `data: [DONE]`. The response waits for the first piece, so a
//! turn that fails before it starts answers with its status code and JSON body; a failure after
//! that is an event `{"error": {"message", "type", "code"}}`, and the stream ends.
//!
//! Billing is as for a whole answer, written when the turn ends. A client that hangs up stops
//! the model at its next token and is billed for what was generated, as on realtime chat.

use std::convert::Infallible;

use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};
use warp::http::Response;
use warp::hyper::Body;

use callstream_actors::usage::UsageSource;

use crate::app::App;
use crate::auth::Caller;
use crate::http::errors::ApiError;
use crate::llm::chat::{ChatOutcome, ChatTurn};
use crate::llm::markdown::PlainStream;
use crate::usage::Reservation;

/// One server-sent event.
fn event(data: &Value) -> String {
    format!("data: {data}\n\n")
}

/// How the turn ended, once it has.
async fn answer(
    end: oneshot::Receiver<Result<ChatOutcome, ApiError>>,
) -> Result<ChatOutcome, ApiError> {
    end.await
        .unwrap_or_else(|_| Err(ApiError::Internal("the chat turn ended unanswered".into())))
}

/// Runs `turn` for `caller` and answers with its stream of events.
pub async fn stream(
    app: App,
    caller: Caller,
    turn: ChatTurn,
    user: Option<String>,
    reservation: Reservation,
    include_usage: bool,
) -> Result<warp::reply::Response, ApiError> {
    // A structured answer streams as the model writes it (see `chat::complete`).
    let markdown = turn.return_markdown || turn.response_format.is_some();
    let (delta_tx, mut deltas) = mpsc::channel::<String>(64);
    let (end_tx, end_rx) = oneshot::channel::<Result<ChatOutcome, ApiError>>();
    let runner = app.clone();
    tokio::spawn(async move {
        // The process waits for this turn to be billed before it exits.
        let _work = runner.lifecycle.work();
        let result = runner.chat.run(&caller.org, turn, Some(delta_tx)).await;
        // A turn that failed is billed for what it spent before (text already streamed,
        // earlier model calls of its tool loop, what a client that left had generated).
        let billed = match &result {
            Ok(outcome) => outcome.billed.total_tokens,
            Err(failed) => failed.spent.total_tokens,
        };
        let settled = reservation
            .settle(&caller.account(), billed, UsageSource::Chat, user)
            .await;
        let end = match (result, settled) {
            (Ok(outcome), Ok(())) => Ok(outcome),
            (Ok(_), Err(e)) => Err(ApiError::Billing(e.to_string())),
            (Err(failed), _) => Err(ApiError::Llm(failed.error)),
        };
        // A client that left does not read it.
        let _ = end_tx.send(end);
    });

    let first = deltas.recv().await;
    // Nothing streamed: the turn is over. A failure is answered like any failed request.
    let (early, end_rx) = match first {
        Some(_) => (None, Some(end_rx)),
        None => (Some(answer(end_rx).await?), None),
    };

    let id = crate::store::new_id("chatcmpl-", 12);
    let created = crate::clock::now_ms() / 1000;
    let model = app.llm.name().to_owned();
    let usage_chunk = json!({"id": id, "object": "chat.completion.chunk", "created": created,
        "model": model, "choices": []});
    let chunk = move |delta: Value, finish: Value| {
        event(
            &json!({"id": id, "object": "chat.completion.chunk", "created": created,
            "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}),
        )
    };
    let (out, events) = mpsc::channel::<String>(16);
    tokio::spawn(async move {
        let mut plain = (!markdown).then(PlainStream::default);
        let mut text = |piece: String| match plain.as_mut() {
            Some(p) => p.push(&piece),
            None => piece,
        };
        let role = chunk(json!({"role": "assistant", "content": ""}), Value::Null);
        if out.send(role).await.is_err() {
            return;
        }
        let mut next = first;
        while let Some(piece) = next {
            let piece = text(piece);
            if !piece.is_empty()
                && out
                    .send(chunk(json!({"content": piece}), Value::Null))
                    .await
                    .is_err()
            {
                // The client hung up: dropping the deltas stops the model.
                return;
            }
            next = deltas.recv().await;
        }
        let end = match (early, end_rx) {
            (Some(outcome), _) => Ok(outcome),
            (None, Some(end_rx)) => answer(end_rx).await,
            (None, None) => Err(ApiError::Internal("the chat turn has no end".into())),
        };
        if let Some(rest) = plain
            .as_mut()
            .map(PlainStream::finish)
            .filter(|r| !r.is_empty())
        {
            let _ = out.send(chunk(json!({"content": rest}), Value::Null)).await;
        }
        let tail = match end {
            Ok(outcome) => {
                let mut tail = vec![chunk(json!({}), json!(outcome.finish))];
                if include_usage {
                    let mut last = usage_chunk;
                    last["usage"] = json!(outcome.usage);
                    tail.push(event(&last));
                }
                tail
            }
            Err(e) => {
                let (message, _) = e.public_message();
                let code = e.status().1;
                vec![event(
                    &json!({"error": {"message": message, "type": code, "code": code}}),
                )]
            }
        };
        for e in tail
            .into_iter()
            .chain(std::iter::once("data: [DONE]\n\n".to_owned()))
        {
            if out.send(e).await.is_err() {
                return;
            }
        }
    });
    let body = futures_util::stream::unfold(events, |mut events| async move {
        events
            .recv()
            .await
            .map(|e| (Ok::<_, Infallible>(bytes::Bytes::from(e)), events))
    });
    Ok(Response::builder()
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(Body::wrap_stream(body))
        .expect("static headers are valid"))
}
