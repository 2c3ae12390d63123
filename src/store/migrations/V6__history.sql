-- The call history: a row per live call or file transcription, its final transcript lines and
-- its intent updates. The head's fields that never change after the start are one JSON text
-- (`head`); those that do (end, billing, latest intent) are columns. `search` holds the words of
-- every line (as the service splits them), for full-text search with the GIN index.

CREATE TABLE history_records (
    org_id       text NOT NULL,
    id           text NOT NULL,
    kind         smallint NOT NULL,
    started_ms   bigint NOT NULL,
    ended_ms     bigint,
    connector    text NOT NULL,
    intent       text,
    close_reason text,
    billed_ms    bigint NOT NULL DEFAULT 0,
    head         text NOT NULL,
    search       tsvector NOT NULL DEFAULT ''::tsvector,
    PRIMARY KEY (org_id, id)
);
CREATE INDEX history_by_start ON history_records (org_id, kind, started_ms DESC, id);
CREATE INDEX history_search ON history_records USING gin (search);

CREATE TABLE history_lines (
    org_id    text NOT NULL,
    record_id text NOT NULL,
    offset_ms bigint NOT NULL,
    channel   smallint NOT NULL,
    line      text NOT NULL,
    PRIMARY KEY (org_id, record_id, offset_ms, channel),
    FOREIGN KEY (org_id, record_id) REFERENCES history_records (org_id, id) ON DELETE CASCADE
);

CREATE TABLE history_intents (
    org_id    text NOT NULL,
    record_id text NOT NULL,
    seq       bigint GENERATED ALWAYS AS IDENTITY,
    at_ms     bigint NOT NULL,
    result    text NOT NULL,
    PRIMARY KEY (org_id, record_id, seq),
    FOREIGN KEY (org_id, record_id) REFERENCES history_records (org_id, id) ON DELETE CASCADE
);

-- An organisation's history settings (JSON: its own retention within its plan's, whether card
-- numbers and other personal data are redacted, and overrides of that per connector).
ALTER TABLE orgs ADD COLUMN history text;
