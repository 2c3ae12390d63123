//! Running the service: the HTTP listener and the admin socket, with graceful shutdown.
//!
//! The listener is bounded: at most `server.max_connections` client connections are open at
//! once, and at most `server.max_connections_per_address` from one address other than a
//! trusted proxy (a connection past either is answered 503 and closed at once); a client must
//! send each request's headers within `server.header_read_timeout_ms` (slow-header attacks),
//! and its body at the pace of [`crate::body_pace`] (slow-body attacks: 408, then closed).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;

use crate::admin::socket;
use crate::app::App;
use crate::body_pace::BodyPace;
use crate::peer::{AddressPlace, Peers};

/// A running server.
pub struct Server {
    /// The address it listens on (useful when bound to port 0).
    pub addr: SocketAddr,
    shutdown: oneshot::Sender<()>,
    http: JoinHandle<()>,
    admin: JoinHandle<()>,
    calls: std::sync::Arc<crate::calls::Calls>,
    lifecycle: Arc<crate::lifecycle::Lifecycle>,
    shutdown_timeout: Duration,
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {message}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        message: String,
    },
    /// The admin socket could not be created.
    #[error("cannot create the admin socket: {0}")]
    AdminSocket(std::io::Error),
}

/// Binds `addr` and the admin socket and starts serving `app`.
pub async fn start(app: App, addr: SocketAddr) -> Result<Server, ServeError> {
    let admin_listener = socket::bind(&socket::socket_path(&app.config.storage.data_dir))
        .map_err(ServeError::AdminSocket)?;
    let admin = tokio::spawn(socket::serve(admin_listener, app.admin.clone()));
    let calls = app.calls.clone();
    let lifecycle = app.lifecycle.clone();
    let shutdown_timeout = Duration::from_millis(app.config.server.shutdown_timeout_ms);
    let (shutdown, signal) = oneshot::channel::<()>();
    let listener = TcpListener::bind(addr).await.map_err(|e| {
        admin.abort();
        ServeError::Bind {
            addr,
            message: e.to_string(),
        }
    })?;
    let addr = listener.local_addr().map_err(|e| ServeError::Bind {
        addr,
        message: e.to_string(),
    })?;
    let limits = Arc::new(Semaphore::new(app.config.server.max_connections));
    let peers = app.peers.clone();
    let header_timeout = Duration::from_millis(app.config.server.header_read_timeout_ms);
    let server_config = &app.config.server;
    let pace = BodyPace {
        grace: Duration::from_millis(server_config.body_grace_ms),
        min_bytes_per_s: server_config.min_body_bytes_per_s,
        deadline: Duration::from_millis(server_config.body_timeout_ms),
    };
    let routes = crate::http::routes(app);
    let make_service = warp::hyper::service::make_service_fn(move |conn: &Conn| {
        let service = warp::service(routes.clone());
        let peer = conn.stream.peer_addr().ok().map(crate::peer::PeerAddr);
        async move {
            Ok::<_, Infallible>(warp::hyper::service::service_fn(
                move |mut request: warp::hyper::Request<warp::hyper::Body>| {
                    if let Some(peer) = peer {
                        request.extensions_mut().insert(peer);
                    }
                    let tripped = crate::body_pace::pace(&mut request, pace);
                    let answer = warp::hyper::service::Service::call(&mut service.clone(), request);
                    async move {
                        let response = answer.await?;
                        if tripped.is_some_and(|t| t.load(std::sync::atomic::Ordering::Relaxed)) {
                            return Ok(crate::body_pace::timed_out(pace));
                        }
                        Ok::<_, Infallible>(response)
                    }
                },
            ))
        }
    });
    let serving = warp::hyper::Server::builder(warp::hyper::server::accept::from_stream(incoming(
        listener, limits, peers,
    )))
    .http1_header_read_timeout(header_timeout)
    .serve(make_service)
    .with_graceful_shutdown(async {
        let _ = signal.await;
    });
    let http = tokio::spawn(async move {
        if let Err(e) = serving.await {
            tracing::error!(error = %e, "the HTTP server stopped");
        }
    });
    tracing::info!(%addr, "listening");
    Ok(Server {
        addr,
        shutdown,
        http,
        admin,
        calls,
        lifecycle,
        shutdown_timeout,
    })
}

/// A client connection holding its place under `server.max_connections` and, unless it comes
/// from a trusted proxy, under its address's cap.
struct Conn {
    stream: TcpStream,
    _place: OwnedSemaphorePermit,
    _address: Option<AddressPlace>,
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// What a connection past a cap is told before it is closed.
fn full(message: &str) -> Vec<u8> {
    let body = serde_json::json!({
        "error": { "code": "too_many_connections", "message": message }
    })
    .to_string();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n\
         Retry-After: 1\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Accepted connections, each with its place under the caps. Accept errors (out of file
/// descriptors, say) are logged and retried: they must not stop the server.
fn incoming(
    listener: TcpListener,
    places: Arc<Semaphore>,
    peers: Arc<Peers>,
) -> impl futures_util::Stream<Item = Result<Conn, Infallible>> {
    futures_util::stream::unfold(
        (listener, places, peers),
        |(listener, places, peers)| async move {
            loop {
                let (stream, addr) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let Ok(address) = peers.admit(addr.ip()) else {
                    refuse(stream, "too many open connections from this address");
                    continue;
                };
                match places.clone().try_acquire_owned() {
                    Ok(place) => {
                        let conn = Conn {
                            stream,
                            _place: place,
                            _address: address,
                        };
                        return Some((Ok(conn), (listener, places, peers)));
                    }
                    Err(_) => refuse(stream, "the server has too many open connections"),
                }
            }
        },
    )
}

/// Answers 503 on `stream` and closes it, in the background, within a second.
fn refuse(stream: TcpStream, message: &'static str) {
    tokio::spawn(async move {
        let mut stream = stream;
        let answer = async {
            stream.write_all(&full(message)).await?;
            stream.shutdown().await
        };
        let _ = tokio::time::timeout(Duration::from_secs(1), answer).await;
    });
}

impl Server {
    /// Stops: no new connections; live feeds end, realtime sessions close (going away), live calls
    /// are disconnected; requests, calls and turns in progress get `server.shutdown_timeout_ms`
    /// to finish and be billed; then the usage of anything still open is written. Returns within
    /// that bound plus the last usage write.
    pub async fn stop(mut self) {
        let deadline = tokio::time::Instant::now() + self.shutdown_timeout;
        self.lifecycle.stop();
        self.calls
            .disconnect_all(callstream_actors::call::DisconnectReason::ServerStopping);
        let _ = self.shutdown.send(());
        let left = || deadline.saturating_duration_since(tokio::time::Instant::now());
        if tokio::time::timeout(left(), &mut self.http).await.is_err() {
            tracing::warn!("requests still running at the shutdown deadline; they are dropped");
            self.http.abort();
        }
        self.admin.abort();
        let _ = self.admin.await;
        // Calls end with their usage written; then whatever is left is flushed.
        self.calls.shutdown(left()).await;
        if !self.lifecycle.drained(left()).await {
            tracing::warn!(
                running = self.lifecycle.running(),
                "work still running at the shutdown deadline"
            );
        }
    }
}
