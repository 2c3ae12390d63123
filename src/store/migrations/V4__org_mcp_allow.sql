-- The non-public networks and host names an organisation's MCP server may have, set by the
-- operator (`callstream org set-mcp-allow`); each counts only within `llm.mcp_allow`.
ALTER TABLE orgs ADD COLUMN mcp_allow TEXT[] NOT NULL DEFAULT '{}';
