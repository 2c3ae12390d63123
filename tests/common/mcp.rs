//! A real MCP server for the tests (rmcp, Streamable HTTP on loopback) with one tool,
//! `get_order_status`, behind a bearer token so that the configured headers are proven to be
//! sent.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::{
    session::local::LocalSessionManager, StreamableHttpServerConfig, StreamableHttpService,
};
use rmcp::{ErrorData, RoleServer, ServerHandler};

pub const TOKEN: &str = "mcp-secret-token";

#[derive(Clone, Default)]
pub struct Orders {
    pub calls: Arc<AtomicUsize>,
}

/// What the tool answers for an order id.
pub fn status_of(order_id: &str) -> String {
    format!("Order {order_id} shipped on 2026-11-20 via Singapore Post, tracking SP-99812.")
}

impl ServerHandler for Orders {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _: Option<PaginatedRequestParams>,
        _: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let schema = serde_json::json!({
            "type": "object",
            "properties": {"order_id": {"type": "string", "description": "The order number"}},
            "required": ["order_id"]
        });
        let serde_json::Value::Object(schema) = schema else {
            unreachable!()
        };
        Ok(ListToolsResult::with_all_items(vec![Tool::new(
            "get_order_status",
            "Look up where a customer's order is and how it ships.",
            Arc::new(schema),
        )]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let id = request
            .arguments
            .as_ref()
            .and_then(|a| a.get("order_id"))
            .and_then(|v| v.as_str())
            .unwrap_or("unknown")
            .to_owned();
        Ok(CallToolResult::success(vec![ContentBlock::text(status_of(&id))]).into())
    }
}

/// Points `org`'s MCP integration at `url`, with the bearer token the server demands, and lets
/// the organisation reach loopback (the tests' servers listen there).
pub fn attach(env: &super::Env, org: &str, url: &str) {
    let header = format!("Authorization=Bearer {TOKEN}");
    env.cli_json(&["org", "set-mcp", org, "--url", url, "--header", &header]);
    allow_loopback(env, org);
}

/// Lets `org`'s MCP server be on loopback (within the tests' `llm.mcp_allow`).
pub fn allow_loopback(env: &super::Env, org: &str) {
    env.cli_json(&["org", "set-mcp-allow", org, "127.0.0.1"]);
}

/// Starts the server; returns its URL and the handler (to count calls).
pub async fn start() -> (String, Orders) {
    let orders = Orders::default();
    let handler = orders.clone();
    let service: StreamableHttpService<Orders, LocalSessionManager> = StreamableHttpService::new(
        move || Ok(handler.clone()),
        Default::default(),
        StreamableHttpServerConfig::default(),
    );
    let router =
        axum::Router::new()
            .nest_service("/mcp", service)
            .layer(axum::middleware::from_fn(
                |req: axum::extract::Request, next: axum::middleware::Next| async move {
                    let authorised = req
                        .headers()
                        .get("authorization")
                        .and_then(|v| v.to_str().ok())
                        .is_some_and(|v| v == format!("Bearer {TOKEN}"));
                    if authorised {
                        next.run(req).await
                    } else {
                        axum::http::StatusCode::UNAUTHORIZED.into_response()
                    }
                },
            ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    (format!("http://{addr}/mcp"), orders)
}

use axum::response::IntoResponse;
