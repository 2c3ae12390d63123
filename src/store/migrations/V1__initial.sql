-- Everything the embedded store holds, as tables. Secrets stay sealed (ChaCha20-Poly1305 with
-- storage.secret_key): MCP header maps and connector client secrets are bytea here.

CREATE TABLE orgs (
    id                 text PRIMARY KEY,
    name               text NOT NULL,
    system_prompt      text,
    mcp_url            text,
    mcp_headers_sealed bytea,
    plan               text NOT NULL,
    deleted            boolean NOT NULL DEFAULT false,
    created_at_ms      bigint NOT NULL
);

CREATE TABLE api_keys (
    id            text PRIMARY KEY,
    org_id        text NOT NULL,
    name          text,
    hash          bytea NOT NULL UNIQUE,
    last4         text NOT NULL,
    created_at_ms bigint NOT NULL,
    revoked_at_ms bigint
);
CREATE INDEX api_keys_by_org ON api_keys (org_id, created_at_ms);

CREATE TABLE connectors (
    client_id     text PRIMARY KEY,
    org_id        text NOT NULL,
    name          text,
    created_at_ms bigint NOT NULL,
    rotated_at_ms bigint,
    revoked_at_ms bigint,
    secret_sealed bytea NOT NULL
);
CREATE INDEX connectors_by_org ON connectors (org_id, created_at_ms);

CREATE TABLE dashboard_users (
    email         text PRIMARY KEY,
    org_id        text NOT NULL,
    password_hash text NOT NULL,
    created_at_ms bigint NOT NULL
);

-- One row per charge; a live call's running total is one row per call and day, keyed by a
-- sequence derived from its call id (negative, so it never meets a generated one) and written
-- over in place.
CREATE SEQUENCE usage_ledger_seq;
CREATE TABLE usage_ledger (
    org_id text NOT NULL,
    at_ms  bigint NOT NULL,
    seq    bigint NOT NULL,
    kind   smallint NOT NULL,
    amount bigint NOT NULL,
    event  text NOT NULL,
    PRIMARY KEY (org_id, at_ms, seq)
);

-- Per-day totals, changed in the same transaction as the ledger.
CREATE TABLE usage_daily (
    org_id text NOT NULL,
    day    text NOT NULL,
    kind   smallint NOT NULL,
    amount bigint NOT NULL,
    PRIMARY KEY (org_id, day, kind)
);
