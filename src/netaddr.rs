//! IP networks (CIDR blocks) and which addresses are on the public internet: what the
//! trusted-proxy list, the per-address limits and the MCP client's address checks share.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A block of addresses: an address and how many of its leading bits are the network's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Network {
    addr: IpAddr,
    prefix: u8,
}

impl Network {
    /// Reads `10.0.0.0/8`, `2001:db8::/32`, or a single address (`10.1.2.3`, `::1`). An
    /// IPv4-mapped IPv6 block stays IPv6; [`Network::contains`] compares such addresses both
    /// ways.
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let (addr, prefix) = text.split_once('/').unwrap_or((text, ""));
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("{text:?} is not an address or CIDR block"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = if prefix.is_empty() {
            max
        } else {
            prefix
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("bad prefix length in {text:?}"))?
        };
        Ok(Self { addr, prefix })
    }

    /// Reads every entry of `list`, naming the first bad one.
    pub fn parse_all(list: &[String]) -> Result<Vec<Self>, String> {
        list.iter().map(|t| Self::parse(t)).collect()
    }

    /// Whether `ip` is in the block. An IPv4-mapped IPv6 address (`::ffff:10.0.0.1`) is the
    /// IPv4 address it carries.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        match (ip, self.addr) {
            (IpAddr::V4(ip), IpAddr::V4(net)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(ip) & mask == u32::from(net) & mask
            }
            (IpAddr::V6(ip), IpAddr::V6(net)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(ip) & mask == u128::from(net) & mask
            }
            _ => false,
        }
    }
}

/// Whether any block of `list` holds `ip`.
pub fn listed(list: &[Network], ip: IpAddr) -> bool {
    list.iter().any(|n| n.contains(ip))
}

/// `ip`, with an IPv4-mapped IPv6 address written as the IPv4 address it is.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// True for addresses on the public internet. Not public: the IANA special-purpose blocks
/// (loopback, private, shared 100.64/10, link-local, benchmarking 198.18/15, the IETF
/// protocol block 192.0.0/24, documentation, reserved 240/4 and broadcast, unspecified,
/// multicast; IPv6 unique-local, link-local, site-local `fec0::/10`, documentation), and any
/// IPv6 address that carries an IPv4 address which is not public itself (IPv4-mapped,
/// IPv4-compatible `::a.b.c.d`, NAT64 `64:ff9b::/96` and `64:ff9b:1::/48`, 6to4 `2002::/16`)
/// nor Teredo `2001::/32`, whose embedded server and client cannot be checked.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(v4: Ipv4Addr) -> bool {
    let [a, b, c, _] = v4.octets();
    !(v4.is_loopback()
        || v4.is_private()
        || v4.is_link_local()
        || v4.is_unspecified()
        || v4.is_multicast()
        || v4.is_broadcast()
        || v4.is_documentation()
        || a == 0
        || (a == 100 && (64..128).contains(&b))
        || (a == 192 && b == 0 && c == 0)
        || (a == 198 && (b == 18 || b == 19))
        || a >= 240)
}

fn is_public_v6(v6: Ipv6Addr) -> bool {
    if let Some(v4) = v6.to_ipv4_mapped() {
        return is_public_v4(v4);
    }
    let s = v6.segments();
    let low_v4 = || Ipv4Addr::from((u128::from(v6) & 0xffff_ffff) as u32);
    // IPv4-compatible (deprecated) `::a.b.c.d`, besides `::` and `::1`.
    if s[..6].iter().all(|x| *x == 0) {
        return !v6.is_unspecified() && !v6.is_loopback() && is_public_v4(low_v4());
    }
    // NAT64, well-known and local-use prefixes: the IPv4 address is the last 32 bits (for
    // the /48, as the NAT64 operator chooses; it is checked as if it were the last 32 bits,
    // and the block is refused unless that address is public).
    if s[0] == 0x64 && s[1] == 0xff9b && (s[2..6].iter().all(|x| *x == 0) || s[2] == 1) {
        return s[2] == 0 && is_public_v4(low_v4());
    }
    // 6to4: the IPv4 address is bits 16-47.
    if s[0] == 0x2002 {
        let embedded = Ipv4Addr::from((u32::from(s[1]) << 16) | u32::from(s[2]));
        return is_public_v4(embedded);
    }
    !(v6.is_loopback()
        || v6.is_unspecified()
        || v6.is_multicast()
        || (s[0] & 0xfe00) == 0xfc00
        || (s[0] & 0xffc0) == 0xfe80
        || (s[0] & 0xffc0) == 0xfec0
        || (s[0] == 0x2001 && s[1] == 0x0db8)
        || (s[0] == 0x2001 && s[1] == 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn special_purpose_addresses_are_not_public() {
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.254",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "240.0.0.1",
            "198.18.0.1",
            "198.19.255.255",
            "192.0.0.8",
            "192.0.2.1",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "fec0::1",
            "2001:db8::1",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::127.0.0.1",
            "::10.0.0.1",
            "::169.254.169.254",
            "64:ff9b::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::a00:1",
            "64:ff9b:1::8.8.8.8",
            "2002:7f00:1::",
            "2002:a9fe:a9fe::1",
            "2002:c0a8:0101::1",
        ] {
            assert!(!is_public(ip(private)), "{private}");
        }
        for public in [
            "8.8.8.8",
            "1.1.1.1",
            "100.128.0.1",
            "198.20.0.1",
            "2606:4700::1111",
            "::ffff:8.8.4.4",
            "::8.8.8.8",
            "64:ff9b::8.8.8.8",
            "2002:0808:0808::1",
        ] {
            assert!(is_public(ip(public)), "{public}");
        }
    }

    #[test]
    fn networks_hold_their_addresses() {
        let net = Network::parse("10.0.0.0/8").unwrap();
        assert!(net.contains(ip("10.255.0.1")));
        assert!(net.contains(ip("::ffff:10.0.0.1")));
        assert!(!net.contains(ip("11.0.0.1")));
        let one = Network::parse(" 192.168.1.7 ").unwrap();
        assert!(one.contains(ip("192.168.1.7")));
        assert!(!one.contains(ip("192.168.1.8")));
        let v6 = Network::parse("fd00::/8").unwrap();
        assert!(v6.contains(ip("fd12::1")));
        assert!(!v6.contains(ip("10.0.0.1")));
        assert!(Network::parse("0.0.0.0/0").unwrap().contains(ip("8.8.8.8")));
        assert!(Network::parse("10.0.0.0/33").is_err());
        assert!(Network::parse("example.com").is_err());
        assert!(Network::parse_all(&["10.0.0.0/8".into(), "x".into()]).is_err());
        assert!(listed(
            &Network::parse_all(&["127.0.0.1".into(), "::1".into()]).unwrap(),
            ip("::1")
        ));
    }
}
