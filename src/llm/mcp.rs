//! An organisation's MCP server (Streamable HTTP), reached with the `rmcp` client: its tools
//! are listed at the start of a chat turn and called when the model asks.
//!
//! The URL comes from an organisation's administrator, so it is not trusted to point anywhere:
//! its host is resolved here, every address it has must be public (or allowed by
//! `llm.mcp_allow`), and the HTTP client is pinned to the address that was checked (a second
//! lookup could answer differently) and follows no redirects.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{RoleClient, ServiceExt};

use super::{ToolCall, ToolSpec};
use crate::store::McpIntegration;

/// Why the MCP server could not be used.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    /// A configured header is not a valid HTTP header.
    #[error("invalid MCP header {0:?}")]
    Header(String),
    /// Connecting or initialising failed.
    #[error("cannot reach the MCP server: {0}")]
    Connect(String),
    /// The URL is not an http(s) URL with a host.
    #[error("the MCP URL is not usable: {0}")]
    Url(String),
    /// The server's address is not one the service may reach.
    #[error("the MCP server's address {0} is not public; an administrator can allow it with llm.mcp_allow")]
    Address(IpAddr),
    /// The server did not answer in time.
    #[error("the MCP server did not answer within {0:?}")]
    Timeout(Duration),
    /// Listing the tools failed.
    #[error("cannot list the MCP server's tools: {0}")]
    List(String),
}

/// Where MCP servers may be: public addresses, and the networks and host names allowed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct McpPolicy {
    networks: Vec<(IpAddr, u8)>,
    hosts: Vec<String>,
}

impl McpPolicy {
    /// A policy allowing, besides public addresses, `allow`: CIDR networks (`10.0.0.0/8`),
    /// single addresses, or host names.
    pub fn new(allow: &[String]) -> Result<Self, String> {
        let mut policy = Self::default();
        for entry in allow {
            let entry = entry.trim();
            let (addr, prefix) = entry.split_once('/').unwrap_or((entry, ""));
            match addr.parse::<IpAddr>() {
                Ok(ip) => {
                    let max = if ip.is_ipv4() { 32 } else { 128 };
                    let prefix = if prefix.is_empty() {
                        max
                    } else {
                        prefix
                            .parse::<u8>()
                            .ok()
                            .filter(|p| *p <= max)
                            .ok_or_else(|| format!("llm.mcp_allow: bad prefix in {entry:?}"))?
                    };
                    policy.networks.push((ip, prefix));
                }
                Err(_) if prefix.is_empty() && !entry.is_empty() => {
                    policy.hosts.push(entry.to_ascii_lowercase());
                }
                Err(_) => {
                    return Err(format!(
                        "llm.mcp_allow: {entry:?} is not an address or host"
                    ))
                }
            }
        }
        Ok(policy)
    }

    fn allows(&self, host: &str, ip: IpAddr) -> bool {
        is_public(ip)
            || self.hosts.iter().any(|h| h.eq_ignore_ascii_case(host))
            || self
                .networks
                .iter()
                .any(|(net, prefix)| in_network(ip, *net, *prefix))
    }

    /// Resolves `url`'s host and checks every address it has: the host and the address to
    /// connect to.
    pub async fn check(&self, url: &str) -> Result<(String, SocketAddr), McpError> {
        let parsed = reqwest::Url::parse(url).map_err(|e| McpError::Url(e.to_string()))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(McpError::Url(format!("scheme {:?}", parsed.scheme())));
        }
        let host = parsed
            .host_str()
            .ok_or_else(|| McpError::Url("no host".into()))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = parsed
            .port_or_known_default()
            .ok_or_else(|| McpError::Url("no port".into()))?;
        let addrs: Vec<SocketAddr> = match host.parse::<IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, port)],
            Err(_) => tokio::net::lookup_host((host.as_str(), port))
                .await
                .map_err(|e| McpError::Connect(format!("cannot resolve {host}: {e}")))?
                .collect(),
        };
        let first = *addrs
            .first()
            .ok_or_else(|| McpError::Connect(format!("{host} has no address")))?;
        if let Some(refused) = addrs.iter().find(|a| !self.allows(&host, a.ip())) {
            return Err(McpError::Address(refused.ip()));
        }
        Ok((host, first))
    }
}

/// True for addresses on the public internet: not loopback, private, link-local, shared
/// (CGNAT), unspecified, multicast, broadcast or documentation ranges.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            !(v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_multicast()
                || v4.is_broadcast()
                || v4.is_documentation()
                || a == 0
                || (a == 100 && (64..128).contains(&b))
                || (a == 192 && b == 0 && v4.octets()[2] == 0)
                || a >= 240)
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_public(IpAddr::V4(v4));
            }
            let first = v6.segments()[0];
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80
                || first == 0x2001 && v6.segments()[1] == 0x0db8)
        }
    }
}

fn in_network(ip: IpAddr, net: IpAddr, prefix: u8) -> bool {
    match (ip, net) {
        (IpAddr::V4(ip), IpAddr::V4(net)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            u32::from(ip) & mask == u32::from(net) & mask
        }
        (IpAddr::V6(ip), IpAddr::V6(net)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            u128::from(ip) & mask == u128::from(net) & mask
        }
        _ => false,
    }
}

/// A connected MCP server and its tools.
pub struct McpSession {
    client: RunningService<RoleClient, ()>,
    tools: Vec<ToolSpec>,
    timeout: Duration,
}

impl std::fmt::Debug for McpSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpSession")
            .field("tools", &self.tools.len())
            .finish()
    }
}

impl McpSession {
    /// Connects, initialises and lists the tools, each step within `timeout`, if `policy`
    /// allows the server's address.
    pub async fn connect(
        integration: &McpIntegration,
        timeout: Duration,
        policy: &McpPolicy,
    ) -> Result<Self, McpError> {
        let (host, addr) = tokio::time::timeout(timeout, policy.check(&integration.url))
            .await
            .map_err(|_| McpError::Timeout(timeout))??;
        let http = reqwest::Client::builder()
            .resolve(&host, addr)
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(timeout)
            .build()
            .map_err(|e| McpError::Connect(e.to_string()))?;
        let mut headers = HashMap::new();
        for (name, value) in &integration.headers {
            let n = http1::HeaderName::try_from(name.as_str())
                .map_err(|_| McpError::Header(name.clone()))?;
            let v = http1::HeaderValue::try_from(value.as_str())
                .map_err(|_| McpError::Header(name.clone()))?;
            headers.insert(n, v);
        }
        let config = StreamableHttpClientTransportConfig::with_uri(integration.url.clone())
            .custom_headers(headers);
        let transport = StreamableHttpClientTransport::with_client(http, config);
        let client = tokio::time::timeout(timeout, ().serve(transport))
            .await
            .map_err(|_| McpError::Timeout(timeout))?
            .map_err(|e| McpError::Connect(e.to_string()))?;
        let listed = tokio::time::timeout(timeout, client.list_all_tools())
            .await
            .map_err(|_| McpError::Timeout(timeout))?
            .map_err(|e| McpError::List(e.to_string()))?;
        let tools = listed
            .into_iter()
            .map(|t| ToolSpec {
                name: t.name.to_string(),
                description: t.description.map(|d| d.to_string()).unwrap_or_default(),
                parameters: serde_json::Value::Object((*t.input_schema).clone()),
            })
            .collect();
        Ok(Self {
            client,
            tools,
            timeout,
        })
    }

    /// The server's tools.
    pub fn tools(&self) -> &[ToolSpec] {
        &self.tools
    }

    /// Calls a tool and returns what to show the model: the tool's text, or the error.
    pub async fn call(&self, call: &ToolCall) -> String {
        let mut params = CallToolRequestParams::new(call.name.clone());
        match &call.arguments {
            serde_json::Value::Object(args) => params = params.with_arguments(args.clone()),
            // The model wrote no arguments.
            serde_json::Value::Null => {}
            // Not sent as if it were a call without arguments: the model is told, and may
            // call again.
            other => {
                return format!(
                    "error: the arguments of {} must be a JSON object, not {other}",
                    call.name
                )
            }
        }
        match tokio::time::timeout(self.timeout, self.client.call_tool(params)).await {
            Err(_) => format!("error: the tool {} did not answer in time", call.name),
            Ok(Err(e)) => format!("error: {e}"),
            Ok(Ok(result)) => {
                let mut text: Vec<String> = result
                    .content
                    .iter()
                    .filter_map(|c| c.as_text().map(|t| t.text.clone()))
                    .collect();
                if text.is_empty() {
                    if let Some(structured) = &result.structured_content {
                        text.push(structured.to_string());
                    }
                }
                let body = text.join("\n");
                if result.is_error == Some(true) {
                    format!("error: {body}")
                } else {
                    body
                }
            }
        }
    }

    /// Closes the session.
    pub async fn close(self) {
        let _ = self.client.cancel().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_public_addresses_pass_by_default() {
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "fe80::1",
            "fd00::1",
            "::",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
        ] {
            assert!(!is_public(private.parse().unwrap()), "{private}");
        }
        for public in ["8.8.8.8", "1.1.1.1", "2606:4700::1111", "::ffff:8.8.4.4"] {
            assert!(is_public(public.parse().unwrap()), "{public}");
        }
    }

    #[tokio::test]
    async fn the_allow_list_opens_networks_and_hosts() {
        let default = McpPolicy::default();
        assert!(matches!(
            default.check("http://127.0.0.1:9000/mcp").await,
            Err(McpError::Address(_))
        ));
        assert!(matches!(
            default.check("http://[::1]:9000/mcp").await,
            Err(McpError::Address(_))
        ));
        assert!(matches!(
            default.check("http://localhost:9000/mcp").await,
            Err(McpError::Address(_))
        ));
        assert!(matches!(
            default.check("ftp://8.8.8.8/").await,
            Err(McpError::Url(_))
        ));
        let allowed = McpPolicy::new(&["127.0.0.0/8".into(), "10.9.9.9".into()]).unwrap();
        let (host, addr) = allowed.check("http://127.0.0.1:9000/mcp").await.unwrap();
        assert_eq!((host.as_str(), addr.port()), ("127.0.0.1", 9000));
        assert!(allowed.check("http://10.9.9.9/mcp").await.is_ok());
        assert!(allowed.check("http://10.9.9.10/mcp").await.is_err());
        let by_name = McpPolicy::new(&["localhost".into()]).unwrap();
        assert!(by_name.check("http://localhost:9000/mcp").await.is_ok());
        assert!(McpPolicy::new(&["10.0.0.0/33".into()]).is_err());
    }
}
