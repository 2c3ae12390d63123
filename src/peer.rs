//! Who is on the other end of a request: the connection's peer address, which the server
//! puts in every request, and the client's address as far as it can be believed.

use std::net::{IpAddr, SocketAddr};

use warp::{Filter, Rejection};

/// The address of a request's connection; the server puts it in every request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

/// The client's address: the connection's peer, or, when the peer is a reverse proxy on this
/// machine (a loopback address), the last address that proxy added to `X-Forwarded-For`.
/// Nothing else in `X-Forwarded-For` is believed: a client can write anything there.
pub fn client_addr() -> impl Filter<Extract = (String,), Error = Rejection> + Clone {
    warp::ext::optional::<PeerAddr>()
        .and(warp::header::optional::<String>("x-forwarded-for"))
        .map(|peer: Option<PeerAddr>, forwarded: Option<String>| {
            let Some(PeerAddr(peer)) = peer else {
                return "unknown".to_owned();
            };
            let proxied = forwarded
                .as_deref()
                .and_then(|f| f.rsplit(',').next())
                .and_then(|a| a.trim().parse::<IpAddr>().ok());
            match proxied {
                Some(addr) if peer.ip().is_loopback() => addr.to_string(),
                _ => peer.ip().to_string(),
            }
        })
}
