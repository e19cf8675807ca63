-- sandkeeper's fleet store on PostgreSQL, version 1 (see src/lib.rs and docs/fleet-postgres.md).
-- Applied once, in one transaction, under the migration advisory lock (src/schema.rs).
--
-- Every operation of the store is one call of one function below, in one statement: a client
-- stopped anywhere never leaves a transaction of the store open (the server runs the call to its
-- end and commits). Each function locks the one key row it decides on (FOR UPDATE) before it
-- reads any process lease, so concurrent operations on a key run one after the other, each on
-- what the one before it committed.

CREATE SCHEMA IF NOT EXISTS sandkeeper_fleet;

-- Incarnations: a sequence never hands a number out twice (nextval is not rolled back), and
-- incarnations are u32 values of at least 1.
CREATE SEQUENCE sandkeeper_fleet.incarnation AS bigint MINVALUE 1 MAXVALUE 4294967295 NO CYCLE;

-- Fencing tokens: one sequence for every key, so a token is never handed out twice, even after a
-- key's row is removed and the key claimed again. Per key, tokens only grow.
CREATE SEQUENCE sandkeeper_fleet.token AS bigint MINVALUE 1 NO CYCLE;

-- One row per process: its lease. A renewal is one write of this row, whatever the number of
-- keys the process owns (the key rows name the process; liveness is read here).
CREATE TABLE sandkeeper_fleet.process (
    incarnation bigint PRIMARY KEY CHECK (incarnation BETWEEN 1 AND 4294967295),
    epoch bigint NOT NULL CHECK (epoch >= 0),
    expires_ms bigint NOT NULL
);

-- One row per key: its owner (a process lease and the epoch it claimed under), the newest token,
-- the durable record its last owner left, who wants it, the newest record write applied since it
-- was claimed.
CREATE TABLE sandkeeper_fleet.key_entry (
    key text PRIMARY KEY,
    owner bigint REFERENCES sandkeeper_fleet.process (incarnation),
    owner_epoch bigint,
    token bigint NOT NULL DEFAULT 0 CHECK (token >= 0),
    record jsonb NOT NULL DEFAULT '{}',
    wants bigint[] NOT NULL DEFAULT '{}',
    recording bigint,
    CHECK ((owner IS NULL) = (owner_epoch IS NULL))
);

-- A renewal lists its process's wanted keys without reading every key.
CREATE INDEX key_entry_owner ON sandkeeper_fleet.key_entry (owner) WHERE owner IS NOT NULL;

-- Renews the lease of p_incarnation under p_epoch to expire at p_expires_ms: NULL when refused
-- (the store has a newer epoch for it), else the keys it owns under p_epoch that others want.
CREATE FUNCTION sandkeeper_fleet.renew(p_incarnation bigint, p_epoch bigint, p_expires_ms bigint)
RETURNS text[] LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO sandkeeper_fleet.process AS p (incarnation, epoch, expires_ms)
    VALUES (p_incarnation, p_epoch, p_expires_ms)
    ON CONFLICT (incarnation) DO UPDATE
        SET epoch = EXCLUDED.epoch, expires_ms = EXCLUDED.expires_ms
        WHERE p.epoch <= EXCLUDED.epoch;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    RETURN ARRAY(
        SELECT k.key FROM sandkeeper_fleet.key_entry k
        WHERE k.owner = p_incarnation AND k.owner_epoch = p_epoch AND cardinality(k.wants) > 0
        ORDER BY k.key);
END
$$;

-- Whether (p_incarnation, p_epoch) holds a lease live at p_now_ms.
CREATE FUNCTION sandkeeper_fleet.is_live(p_incarnation bigint, p_epoch bigint, p_now_ms bigint)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (
        SELECT 1 FROM sandkeeper_fleet.process p
        WHERE p.incarnation = p_incarnation AND p.epoch = p_epoch AND p.expires_ms > p_now_ms)
$$;

-- Claims p_key for (p_incarnation, p_epoch) at p_now_ms. o_claimed: the claimant owns the key
-- under o_token and continues from o_record; else busy (a live owner holds it, the want is
-- recorded; or the claim was made under an epoch the claimant has left).
CREATE FUNCTION sandkeeper_fleet.claim(
    p_key text, p_incarnation bigint, p_epoch bigint, p_now_ms bigint,
    OUT o_claimed boolean, OUT o_token bigint, OUT o_record jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    current_epoch bigint;
    e sandkeeper_fleet.key_entry%ROWTYPE;
BEGIN
    o_claimed := false;
    SELECT p.epoch INTO current_epoch FROM sandkeeper_fleet.process p
    WHERE p.incarnation = p_incarnation;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'incarnation % claims % without a lease', p_incarnation, p_key
            USING ERRCODE = 'SKNLS';
    END IF;
    IF current_epoch > p_epoch THEN
        -- A claim that arrives late, under an epoch the process has left: it takes nothing.
        RETURN;
    END IF;
    INSERT INTO sandkeeper_fleet.key_entry (key) VALUES (p_key) ON CONFLICT (key) DO NOTHING;
    SELECT * INTO STRICT e FROM sandkeeper_fleet.key_entry k WHERE k.key = p_key FOR UPDATE;
    IF e.owner IS NOT NULL AND e.owner <> p_incarnation
        AND sandkeeper_fleet.is_live(e.owner, e.owner_epoch, p_now_ms) THEN
        IF NOT (p_incarnation = ANY (e.wants)) THEN
            UPDATE sandkeeper_fleet.key_entry k SET wants = array_append(k.wants, p_incarnation)
            WHERE k.key = p_key;
        END IF;
        RETURN;
    END IF;
    o_token := nextval('sandkeeper_fleet.token');
    UPDATE sandkeeper_fleet.key_entry k
    SET owner = p_incarnation, owner_epoch = p_epoch, token = o_token,
        wants = array_remove(k.wants, p_incarnation), recording = NULL
    WHERE k.key = p_key;
    -- The record stays until the new owner writes a newer one.
    o_claimed := true;
    o_record := e.record;
END
$$;

-- The entry of p_key, locked, if p_incarnation owns it under p_token with a lease live at
-- p_now_ms; else no row.
CREATE FUNCTION sandkeeper_fleet.owned(
    p_key text, p_incarnation bigint, p_token bigint, p_now_ms bigint)
RETURNS SETOF sandkeeper_fleet.key_entry LANGUAGE plpgsql AS $$
DECLARE
    e sandkeeper_fleet.key_entry%ROWTYPE;
BEGIN
    SELECT * INTO e FROM sandkeeper_fleet.key_entry k WHERE k.key = p_key FOR UPDATE;
    IF FOUND AND e.owner = p_incarnation AND e.token = p_token
        AND sandkeeper_fleet.is_live(e.owner, e.owner_epoch, p_now_ms) THEN
        RETURN NEXT e;
    END IF;
END
$$;

-- Writes p_record as p_key's record, numbered p_recording, if p_incarnation still owns the key
-- under p_token with a live lease at p_now_ms. A write numbered at or below one applied since the
-- key was claimed changes nothing (and answers true).
CREATE FUNCTION sandkeeper_fleet.record(
    p_key text, p_incarnation bigint, p_token bigint, p_recording bigint, p_record jsonb,
    p_now_ms bigint)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    e sandkeeper_fleet.key_entry%ROWTYPE;
BEGIN
    SELECT * INTO e FROM sandkeeper_fleet.owned(p_key, p_incarnation, p_token, p_now_ms);
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF e.recording IS NOT NULL AND e.recording >= p_recording THEN
        RETURN true;
    END IF;
    UPDATE sandkeeper_fleet.key_entry k SET recording = p_recording, record = p_record
    WHERE k.key = p_key;
    RETURN true;
END
$$;

-- Releases p_key from p_incarnation under p_token, leaving p_record, if it still owns the key
-- with a live lease at p_now_ms.
CREATE FUNCTION sandkeeper_fleet.release(
    p_key text, p_incarnation bigint, p_token bigint, p_record jsonb, p_now_ms bigint)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM sandkeeper_fleet.owned(p_key, p_incarnation, p_token, p_now_ms);
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    UPDATE sandkeeper_fleet.key_entry k SET owner = NULL, owner_epoch = NULL, record = p_record
    WHERE k.key = p_key;
    RETURN true;
END
$$;
