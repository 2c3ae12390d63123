//! Running the service: the HTTP listener and the admin socket, with graceful shutdown.

use std::net::SocketAddr;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::admin::socket;
use crate::app::App;

/// A running server.
pub struct Server {
    /// The address it listens on (useful when bound to port 0).
    pub addr: SocketAddr,
    shutdown: oneshot::Sender<()>,
    http: JoinHandle<()>,
    admin: JoinHandle<()>,
    calls: std::sync::Arc<crate::calls::Calls>,
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
    let (shutdown, signal) = oneshot::channel::<()>();
    let (addr, serving) = warp::serve(crate::http::routes(app))
        .try_bind_with_graceful_shutdown(addr, async {
            let _ = signal.await;
        })
        .map_err(|e| {
            admin.abort();
            ServeError::Bind {
                addr,
                message: e.to_string(),
            }
        })?;
    let http = tokio::spawn(serving);
    tracing::info!(%addr, "listening");
    Ok(Server {
        addr,
        shutdown,
        http,
        admin,
        calls,
    })
}

impl Server {
    /// Stops accepting, lets requests in flight finish, and returns when done.
    pub async fn stop(self) {
        let _ = self.shutdown.send(());
        let _ = self.http.await;
        self.admin.abort();
        let _ = self.admin.await;
        // Usage of calls still in progress is written before the process ends.
        self.calls.shutdown().await;
    }
}
