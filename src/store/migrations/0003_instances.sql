-- The instances sharing this database, what work in progress on each holds against the
-- quotas, and the live calls each runs. An instance writes its heartbeat every 2 s; rows of an
-- instance whose heartbeat is older than 15 s are ignored, then deleted (it crashed).

CREATE TABLE instances (
    id           text PRIMARY KEY,
    started_ms   bigint NOT NULL,
    heartbeat_ms bigint NOT NULL,
    draining     boolean NOT NULL DEFAULT false
);

CREATE TABLE reservations (
    instance_id text NOT NULL,
    org_id      text NOT NULL,
    kind        smallint NOT NULL,
    amount      bigint NOT NULL,
    PRIMARY KEY (instance_id, org_id, kind)
);
CREATE INDEX reservations_by_pool ON reservations (org_id, kind);

CREATE UNLOGGED TABLE live_calls (
    call_id     text PRIMARY KEY,
    instance_id text NOT NULL,
    org_id      text NOT NULL,
    call        text NOT NULL
);
CREATE INDEX live_calls_by_org ON live_calls (org_id);
