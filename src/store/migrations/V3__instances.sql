-- The instances sharing this database, what work in progress on each holds against the
-- quotas, and the live calls each runs. An instance writes its heartbeat every 2 s; rows of an
-- instance whose heartbeat is older than 15 s are ignored, then deleted (it crashed).
--
-- All three are unlogged: they describe work in progress, not records, and a request's
-- reservation and its release stay off the WAL (no fsync). A database crash empties them:
-- instances register again with their next heartbeat, and work that was in progress at that
-- moment is no longer counted against the quotas (the ledger, which is logged, still holds
-- everything billed).

CREATE UNLOGGED TABLE instances (
    id           text PRIMARY KEY,
    started_ms   bigint NOT NULL,
    heartbeat_ms bigint NOT NULL,
    draining     boolean NOT NULL DEFAULT false
);

CREATE UNLOGGED TABLE reservations (
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

-- Reserves up to p_want of a pool, at least p_min (else nothing, -1), in one round trip: under
-- a lock per pool, what is left is the quota minus the month's ledger total minus what live
-- instances hold reserved. The lock is held until the calling statement's transaction ends.
CREATE FUNCTION callstream_reserve(
    p_instance text, p_org text, p_kind smallint, p_quota bigint, p_want bigint,
    p_min bigint, p_first_day text, p_last_day text, p_stale_ms bigint
) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_now bigint := (extract(epoch from clock_timestamp()) * 1000)::bigint;
    v_used bigint;
    v_held bigint;
    v_granted bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('reserve/' || p_org || '/' || p_kind::text, 0));
    SELECT COALESCE(SUM(amount), 0) INTO v_used FROM usage_daily
        WHERE org_id = p_org AND kind = p_kind AND day >= p_first_day AND day <= p_last_day;
    SELECT COALESCE(SUM(r.amount), 0) INTO v_held FROM reservations r
        JOIN instances i ON i.id = r.instance_id
        WHERE r.org_id = p_org AND r.kind = p_kind AND i.heartbeat_ms > v_now - p_stale_ms;
    v_granted := LEAST(p_want, GREATEST(p_quota - v_used - v_held, 0));
    IF v_granted < GREATEST(p_min, 1) AND p_want > 0 THEN
        RETURN -1;
    END IF;
    IF v_granted > 0 THEN
        INSERT INTO reservations (instance_id, org_id, kind, amount)
            VALUES (p_instance, p_org, p_kind, v_granted)
            ON CONFLICT (instance_id, org_id, kind)
            DO UPDATE SET amount = reservations.amount + EXCLUDED.amount;
    END IF;
    RETURN v_granted;
END
$$;
