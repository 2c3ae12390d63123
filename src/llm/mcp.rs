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
use crate::netaddr::{is_public, Network};
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
    /// The server's port is not one the service may reach on a public address.
    #[error("the MCP server's port {0} is not allowed (80 and 443 are; an administrator can add others with llm.mcp_ports)")]
    Port(u16),
    /// The server did not answer in time.
    #[error("the MCP server did not answer within {0:?}")]
    Timeout(Duration),
    /// Listing the tools failed.
    #[error("cannot list the MCP server's tools: {0}")]
    List(String),
}

/// Where MCP servers may be: public addresses on the web's ports (80, 443, and those the
/// operator lists), and the networks and host names allowed (on any port: the operator chose
/// them).
///
/// The operator's `llm.mcp_allow` is the bound for every organisation: an organisation's own
/// list ([`McpPolicy::for_org`], set with `callstream org set-mcp-allow`) opens an address only
/// where the bound does too, so one organisation's exception is never everybody's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpPolicy {
    networks: Vec<Network>,
    hosts: Vec<String>,
    ports: Vec<u16>,
    /// The operator's bound, for an organisation's policy.
    bound: Option<Box<McpPolicy>>,
}

impl Default for McpPolicy {
    fn default() -> Self {
        Self {
            networks: Vec::new(),
            hosts: Vec::new(),
            ports: vec![80, 443],
            bound: None,
        }
    }
}

impl McpPolicy {
    /// A policy allowing, besides public addresses, `allow`: CIDR networks (`10.0.0.0/8`),
    /// single addresses, or host names; and, besides ports 80 and 443, `ports`.
    pub fn new(allow: &[String], ports: &[u16]) -> Result<Self, String> {
        let mut policy = Self::default();
        policy.ports.extend_from_slice(ports);
        for entry in allow {
            let entry = entry.trim();
            match Network::parse(entry) {
                Ok(net) => policy.networks.push(net),
                Err(_) if !entry.is_empty() && !entry.contains(['/', ':']) => {
                    policy.hosts.push(entry.to_ascii_lowercase());
                }
                Err(e) => return Err(format!("llm.mcp_allow: {e}")),
            }
        }
        Ok(policy)
    }

    /// The policy of an organisation whose own list is `allow`, within this one (the
    /// operator's bound). Entries that do not read are ignored (they are checked when set).
    pub fn for_org(&self, allow: &[String]) -> McpPolicy {
        let mut org = allow
            .iter()
            .filter_map(|a| McpPolicy::new(std::slice::from_ref(a), &[]).ok())
            .fold(McpPolicy::default(), |mut all, one| {
                all.networks.extend(one.networks);
                all.hosts.extend(one.hosts);
                all
            });
        org.ports.clone_from(&self.ports);
        org.bound = Some(Box::new(self.clone()));
        org
    }

    /// Whether `ip` (or `host`) was opened explicitly: by this list, and by the bound's.
    fn opened(&self, host: &str, ip: IpAddr) -> bool {
        let here = self.hosts.iter().any(|h| h.eq_ignore_ascii_case(host))
            || crate::netaddr::listed(&self.networks, ip);
        here && self.bound.as_ref().is_none_or(|b| b.opened(host, ip))
    }

    fn allows(&self, host: &str, addr: SocketAddr) -> Result<(), McpError> {
        if self.opened(host, addr.ip()) {
            Ok(())
        } else if !is_public(addr.ip()) {
            Err(McpError::Address(addr.ip()))
        } else if !self.ports.contains(&addr.port()) {
            Err(McpError::Port(addr.port()))
        } else {
            Ok(())
        }
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
        for addr in &addrs {
            self.allows(&host, *addr)?;
        }
        Ok((host, first))
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
            // A proxy would resolve the name again, past the check.
            .no_proxy()
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
        assert!(matches!(
            default.check("http://[64:ff9b::7f00:1]/mcp").await,
            Err(McpError::Address(_))
        ));
        assert!(matches!(
            default.check("http://8.8.8.8:5432/mcp").await,
            Err(McpError::Port(5432))
        ));
        assert!(default.check("https://8.8.8.8/mcp").await.is_ok());
        assert!(default.check("http://8.8.8.8/mcp").await.is_ok());
        let ports = McpPolicy::new(&[], &[8443]).unwrap();
        assert!(ports.check("https://8.8.8.8:8443/mcp").await.is_ok());
        let allowed = McpPolicy::new(&["127.0.0.0/8".into(), "10.9.9.9".into()], &[]).unwrap();
        let (host, addr) = allowed.check("http://127.0.0.1:9000/mcp").await.unwrap();
        assert_eq!((host.as_str(), addr.port()), ("127.0.0.1", 9000));
        assert!(allowed.check("http://10.9.9.9/mcp").await.is_ok());
        assert!(allowed.check("http://10.9.9.10/mcp").await.is_err());
        let by_name = McpPolicy::new(&["localhost".into()], &[]).unwrap();
        assert!(by_name.check("http://localhost:9000/mcp").await.is_ok());
        assert!(McpPolicy::new(&["10.0.0.0/33".into()], &[]).is_err());
        // An organisation's list counts only within the operator's bound.
        let bound = McpPolicy::new(&["10.0.0.0/8".into(), "mcp.internal".into()], &[]).unwrap();
        assert!(bound
            .for_org(&[])
            .check("http://10.1.1.1/mcp")
            .await
            .is_err());
        let org = bound.for_org(&["10.1.0.0/16".into(), "192.168.0.0/16".into()]);
        assert!(org.check("http://10.1.1.1:9000/mcp").await.is_ok());
        assert!(org.check("http://10.2.1.1/mcp").await.is_err());
        assert!(org.check("http://192.168.1.1/mcp").await.is_err());
        assert!(org.check("https://8.8.8.8/mcp").await.is_ok());
        assert!(org.check("https://8.8.8.8:8080/mcp").await.is_err());
    }
}
