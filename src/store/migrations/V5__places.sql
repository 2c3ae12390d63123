-- Places taken under caps per organisation (its concurrent live calls, realtime sessions and
-- file transcriptions), counted over every live instance. Unlogged like the instances table:
-- a place is work in progress, and an instance whose heartbeat stops gives its places back.

CREATE UNLOGGED TABLE places (
    name        text NOT NULL,
    holder      text NOT NULL,
    instance_id text NOT NULL,
    PRIMARY KEY (name, holder)
);
CREATE INDEX places_by_instance ON places (instance_id);

-- Takes a place under p_name for p_holder if fewer than p_cap are held by live instances, in
-- one round trip, under a lock per name held until the calling statement's transaction ends.
CREATE FUNCTION callstream_take_place(
    p_instance text, p_name text, p_holder text, p_cap bigint, p_stale_ms bigint
) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_now bigint := (extract(epoch from clock_timestamp()) * 1000)::bigint;
    v_taken bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('place/' || p_name, 0));
    IF EXISTS (SELECT 1 FROM places WHERE name = p_name AND holder = p_holder) THEN
        RETURN true;
    END IF;
    SELECT count(*) INTO v_taken FROM places p
        JOIN instances i ON i.id = p.instance_id
        WHERE p.name = p_name AND i.heartbeat_ms > v_now - p_stale_ms;
    IF v_taken >= p_cap THEN
        RETURN false;
    END IF;
    INSERT INTO places (name, holder, instance_id) VALUES (p_name, p_holder, p_instance);
    RETURN true;
END
$$;
