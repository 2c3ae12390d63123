//! An organisation's MCP server (Streamable HTTP), reached with the `rmcp` client: its tools
//! are listed at the start of a chat turn and called when the model asks.

use std::collections::HashMap;
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
    /// The server did not answer in time.
    #[error("the MCP server did not answer within {0:?}")]
    Timeout(Duration),
    /// Listing the tools failed.
    #[error("cannot list the MCP server's tools: {0}")]
    List(String),
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
    /// Connects, initialises and lists the tools, each step within `timeout`.
    pub async fn connect(
        integration: &McpIntegration,
        timeout: Duration,
    ) -> Result<Self, McpError> {
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
        let transport = StreamableHttpClientTransport::from_config(config);
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
        if let serde_json::Value::Object(args) = &call.arguments {
            params = params.with_arguments(args.clone());
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
