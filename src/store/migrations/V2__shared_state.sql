-- State the instances share besides the records: short-lived entries (dashboard sessions,
-- sign-in form tokens, live-call signature nonces), each with its expiry, and the GCRA state
-- of per-key and sign-in rate limits.

CREATE TABLE shared_entries (
    space      smallint NOT NULL,
    key        text NOT NULL,
    value      text NOT NULL,
    expires_ms bigint NOT NULL,
    PRIMARY KEY (space, key)
);
CREATE INDEX shared_entries_by_expiry ON shared_entries (expires_ms);

-- Unlogged: a database crash forgets the rate-limit state (every key starts with a full
-- burst again), which costs nothing that matters and keeps a request's check off the WAL.
CREATE UNLOGGED TABLE rate_limits (
    key    text PRIMARY KEY,
    tat_ms bigint NOT NULL
);
