//! Who is on the other end of a request: the connection's peer address, which the server puts
//! in every request; the client's address as far as it can be believed; and the places each
//! client address holds under `server.max_connections_per_address`.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use parking_lot::Mutex;
use warp::{Filter, Rejection};

use crate::netaddr::{canonical, listed, Network};

/// The address of a request's connection; the server puts it in every request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

/// The reverse proxies in front of the service (`server.trusted_proxies`), and the open
/// connections of every other client address.
#[derive(Debug, Default)]
pub struct Peers {
    trusted: Vec<Network>,
    per_address: usize,
    // A parking_lot Mutex: a counter update per connection, never held across an await.
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// A connection's place under its address's cap; dropping it gives the place back.
#[derive(Debug)]
pub struct AddressPlace {
    peers: Arc<Peers>,
    addr: IpAddr,
}

impl Drop for AddressPlace {
    fn drop(&mut self) {
        let mut open = self.peers.open.lock();
        if let Some(n) = open.get_mut(&self.addr) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.addr);
            }
        }
    }
}

impl Peers {
    /// Trusting `trusted` as proxies, with at most `per_address` connections from any other
    /// address.
    pub fn new(trusted: Vec<Network>, per_address: usize) -> Self {
        Self {
            trusted,
            per_address,
            open: Mutex::default(),
        }
    }

    /// Whether `ip` is one of the trusted proxies.
    pub fn is_trusted(&self, ip: IpAddr) -> bool {
        listed(&self.trusted, ip)
    }

    /// A place for a new connection from `ip`: `Ok(None)` for a trusted proxy (its clients
    /// are many, and are not known yet), `Err(())` when the address has all its places.
    #[allow(clippy::result_unit_err)]
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Option<AddressPlace>, ()> {
        let ip = canonical(ip);
        if self.is_trusted(ip) {
            return Ok(None);
        }
        let mut open = self.open.lock();
        let n = open.entry(ip).or_insert(0);
        if *n >= self.per_address {
            return Err(());
        }
        *n += 1;
        Ok(Some(AddressPlace {
            peers: self.clone(),
            addr: ip,
        }))
    }

    /// The client of a request that came from `peer` with `forwarded` (its `X-Forwarded-For`):
    /// the peer itself, unless it is a trusted proxy; then the addresses the proxies added are
    /// read from the right, and the first that is not a trusted proxy is the client. Anything
    /// left of that was written by the client and is not believed.
    pub fn client(&self, peer: IpAddr, forwarded: Option<&str>) -> IpAddr {
        let peer = canonical(peer);
        if !self.is_trusted(peer) {
            return peer;
        }
        let mut client = peer;
        for hop in forwarded.unwrap_or_default().rsplit(',') {
            let Ok(addr) = hop.trim().parse::<IpAddr>() else {
                break;
            };
            client = canonical(addr);
            if !self.is_trusted(client) {
                break;
            }
        }
        client
    }

    /// The client's address of a request (see [`Peers::client`]); `0.0.0.0` when the
    /// request has no peer (it did not come through the server).
    pub fn client_addr(
        self: &Arc<Self>,
    ) -> impl Filter<Extract = (IpAddr,), Error = Rejection> + Clone {
        let peers = self.clone();
        warp::ext::optional::<PeerAddr>()
            .and(warp::header::optional::<String>("x-forwarded-for"))
            .map(
                move |peer: Option<PeerAddr>, forwarded: Option<String>| match peer {
                    Some(PeerAddr(peer)) => peers.client(peer.ip(), forwarded.as_deref()),
                    None => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                },
            )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn peers() -> Arc<Peers> {
        let trusted = Network::parse_all(&["10.0.0.0/24".into(), "::1".into()]).unwrap();
        Arc::new(Peers::new(trusted, 2))
    }

    #[test]
    fn forwarded_for_is_believed_from_trusted_proxies_only() {
        let p = peers();
        let xff = Some("6.6.6.6, 1.2.3.4");
        // A client that writes the header itself is its own address.
        assert_eq!(p.client(ip("8.8.8.8"), xff), ip("8.8.8.8"));
        assert_eq!(p.client(ip("127.0.0.1"), xff), ip("127.0.0.1"));
        // From a proxy: the last address it added.
        assert_eq!(p.client(ip("10.0.0.5"), xff), ip("1.2.3.4"));
        assert_eq!(p.client(ip("::ffff:10.0.0.5"), xff), ip("1.2.3.4"));
        // Through two proxies.
        assert_eq!(
            p.client(ip("::1"), Some("6.6.6.6, 1.2.3.4, 10.0.0.9")),
            ip("1.2.3.4")
        );
        // A proxy that added nothing usable: the proxy.
        assert_eq!(p.client(ip("10.0.0.5"), None), ip("10.0.0.5"));
        assert_eq!(p.client(ip("10.0.0.5"), Some("junk")), ip("10.0.0.5"));
    }

    #[test]
    fn each_address_has_its_own_places_and_proxies_are_not_counted() {
        let p = peers();
        let a = p.admit(ip("8.8.8.8")).unwrap().unwrap();
        let b = p.admit(ip("::ffff:8.8.8.8")).unwrap().unwrap();
        assert!(p.admit(ip("8.8.8.8")).is_err());
        assert!(p.admit(ip("8.8.4.4")).unwrap().is_some());
        for _ in 0..10 {
            assert!(p.admit(ip("10.0.0.7")).unwrap().is_none());
        }
        drop(a);
        let c = p.admit(ip("8.8.8.8")).unwrap();
        assert!(c.is_some());
        drop((b, c));
        assert!(p.open.lock().get(&ip("8.8.8.8")).is_none());
    }
}
