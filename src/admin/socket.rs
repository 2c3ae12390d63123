//! The admin socket: a Unix socket in the data directory through which the CLI administers a
//! data directory whose database a running server holds open (sled allows one process).
//!
//! One request per connection: a JSON [`AdminRequest`] on one line, answered by one JSON line,
//! `{"Ok": response}` or `{"Err": error}`. Access is the file system's: the socket is created
//! mode 0600 inside the data directory.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixListener;

use super::{Admin, AdminError, AdminRequest, AdminResponse};

/// File name of the socket in the data directory.
pub const SOCKET_FILE: &str = "admin.sock";
/// Longest request line accepted.
const MAX_REQUEST: u64 = 64 * 1024;

/// The socket path of a data directory.
pub fn socket_path(data_dir: &Path) -> PathBuf {
    data_dir.join(SOCKET_FILE)
}

/// Binds the admin socket, replacing a stale file left by a server that died. Callers hold the
/// database lock, so no live server owns that file.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(path)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(listener)
}

/// Serves admin requests until the task is dropped.
pub async fn serve(listener: UnixListener, admin: Admin) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::warn!(error = %e, "admin socket accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let admin = admin.clone();
        tokio::spawn(async move {
            let (read, mut write) = stream.into_split();
            let mut line = String::new();
            let mut reader = tokio::io::BufReader::new(read.take(MAX_REQUEST));
            let answer = match reader.read_line(&mut line).await {
                Ok(_) => match serde_json::from_str::<AdminRequest>(&line) {
                    Ok(request) => {
                        tracing::info!(?request, "admin request");
                        if let AdminRequest::UserCreate { email, .. } = &request {
                            tracing::debug!(%email, "admin request for a user");
                        }
                        admin.execute(request).await
                    }
                    Err(e) => Err(AdminError::Invalid(format!("malformed admin request: {e}"))),
                },
                Err(e) => Err(AdminError::Transport(e.to_string())),
            };
            let mut out = serde_json::to_vec(&answer).expect("admin answers always serialize");
            out.push(b'\n');
            if let Err(e) = write.write_all(&out).await {
                tracing::warn!(error = %e, "admin socket write failed");
            }
        });
    }
}

/// Sends one request to the server listening on `path`.
pub fn call(path: &Path, request: &AdminRequest) -> Result<AdminResponse, AdminError> {
    let transport =
        |e: std::io::Error| AdminError::Transport(format!("admin socket {}: {e}", path.display()));
    let mut stream = std::os::unix::net::UnixStream::connect(path).map_err(transport)?;
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .map_err(transport)?;
    let mut line = serde_json::to_vec(request).expect("admin requests always serialize");
    line.push(b'\n');
    stream.write_all(&line).map_err(transport)?;
    let mut answer = String::new();
    BufReader::new(stream)
        .read_line(&mut answer)
        .map_err(transport)?;
    serde_json::from_str::<Result<AdminResponse, AdminError>>(&answer)
        .map_err(|e| AdminError::Transport(format!("malformed answer from the server: {e}")))?
}
