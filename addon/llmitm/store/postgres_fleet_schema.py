"""The shared routing state's tables in PostgreSQL, as numbered steps.

Apart from the store's own schema (``store.migrations``) and versioned on its own, in
``llmitm_fleet_schema``: the fleet's tables are small, hot and disposable (slots, heartbeats,
cooldowns, pins), while the store's are durable records. A released step is never edited; a
later change appends one. Steps run in one transaction under an advisory lock, so proxies
starting together upgrade the schema once.

Slots are rows, not counters: a row names the proxy holding it, so a proxy's death frees
exactly its slots. ``llmitm_fleet_take`` checks the caps and inserts under an advisory lock
per endpoint; it is a function so that the lock, the count and the insert take one round trip,
and the count runs after the lock (a statement's snapshot is taken when the statement starts,
so a lock taken inside a single plain statement would come too late).
"""

from __future__ import annotations

CHANNEL = "llmitm_fleet"
"""The NOTIFY channel: a slot freed, a cooldown started."""

SCHEMA_LOCK = 0x6C6C_6D69_746D_0F1E  # "llmitm" + "fle": any constant the store does not use

MIGRATIONS: tuple[tuple[int, str], ...] = (
    (
        1,
        f"""
        CREATE TABLE llmitm_fleet_proxies (
            id text PRIMARY KEY,
            host text NOT NULL,
            pid integer NOT NULL,
            started_at timestamptz NOT NULL DEFAULT now(),
            heartbeat_at timestamptz NOT NULL DEFAULT now(),
            expires_at timestamptz NOT NULL
        );
        CREATE TABLE llmitm_fleet_slots (
            id text PRIMARY KEY,
            proxy text NOT NULL REFERENCES llmitm_fleet_proxies (id) ON DELETE CASCADE,
            endpoint text NOT NULL,
            model text,
            taken_at timestamptz NOT NULL DEFAULT now()
        );
        CREATE INDEX llmitm_fleet_slots_key ON llmitm_fleet_slots (endpoint, model);
        CREATE INDEX llmitm_fleet_slots_proxy ON llmitm_fleet_slots (proxy);
        CREATE TABLE llmitm_fleet_cooldowns (
            endpoint text NOT NULL,
            model text NOT NULL DEFAULT '',
            until timestamptz NOT NULL,
            reason text NOT NULL DEFAULT '',
            PRIMARY KEY (endpoint, model)
        );
        CREATE TABLE llmitm_fleet_pins (
            kind text NOT NULL,
            key text NOT NULL,
            endpoint text NOT NULL,
            expires_at timestamptz NOT NULL,
            PRIMARY KEY (kind, key)
        );
        CREATE INDEX llmitm_fleet_pins_expiry ON llmitm_fleet_pins (expires_at);

        -- 1: taken; 0: a cap is full; -1: the proxy is not (or no longer) a member.
        CREATE FUNCTION llmitm_fleet_take(
            p_id text, p_proxy text, p_endpoint text, p_model text, p_cap integer,
            p_model_cap integer
        ) RETURNS integer LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_advisory_xact_lock(hashtextextended('llmitm_fleet:' || p_endpoint, 0));
            IF NOT EXISTS (
                SELECT 1 FROM llmitm_fleet_proxies WHERE id = p_proxy AND expires_at > now()
            ) THEN
                RETURN -1;
            END IF;
            IF p_cap IS NOT NULL AND (
                SELECT count(*) FROM llmitm_fleet_slots s
                JOIN llmitm_fleet_proxies p ON p.id = s.proxy
                WHERE s.endpoint = p_endpoint AND p.expires_at > now()
            ) >= p_cap THEN
                RETURN 0;
            END IF;
            IF p_model_cap IS NOT NULL AND (
                SELECT count(*) FROM llmitm_fleet_slots s
                JOIN llmitm_fleet_proxies p ON p.id = s.proxy
                WHERE s.endpoint = p_endpoint AND s.model = p_model AND p.expires_at > now()
            ) >= p_model_cap THEN
                RETURN 0;
            END IF;
            INSERT INTO llmitm_fleet_slots (id, proxy, endpoint, model)
            VALUES (p_id, p_proxy, p_endpoint, p_model)
            ON CONFLICT (id) DO NOTHING;
            RETURN 1;
        END $$;

        -- Frees one slot. Only a release from a full cap can have a waiter somewhere, so only
        -- such a release tells the fleet (of two releases at once, one always sees the cap
        -- full: neither sees the other's delete before its own count).
        CREATE FUNCTION llmitm_fleet_release(p_id text, p_cap integer, p_model_cap integer)
        RETURNS void LANGUAGE plpgsql AS $$
        DECLARE
            gone llmitm_fleet_slots%ROWTYPE;
        BEGIN
            DELETE FROM llmitm_fleet_slots WHERE id = p_id RETURNING * INTO gone;
            IF NOT FOUND THEN
                RETURN;
            END IF;
            IF (p_cap IS NOT NULL AND (
                    SELECT count(*) FROM llmitm_fleet_slots WHERE endpoint = gone.endpoint
                ) + 1 >= p_cap)
               OR (p_model_cap IS NOT NULL AND (
                    SELECT count(*) FROM llmitm_fleet_slots
                    WHERE endpoint = gone.endpoint AND model = gone.model
                ) + 1 >= p_model_cap) THEN
                PERFORM pg_notify(
                    '{CHANNEL}', json_build_object('kind', 'free', 'endpoint', gone.endpoint)::text
                );
            END IF;
        END $$;

        -- Frees the slots of proxies whose lease ran out, and forgets what expired.
        CREATE FUNCTION llmitm_fleet_sweep() RETURNS integer LANGUAGE plpgsql AS $$
        DECLARE
            freed integer;
        BEGIN
            WITH gone AS (
                DELETE FROM llmitm_fleet_slots s USING llmitm_fleet_proxies p
                WHERE p.id = s.proxy AND p.expires_at <= now()
                RETURNING s.endpoint
            ) SELECT count(*) INTO freed FROM gone;
            DELETE FROM llmitm_fleet_proxies WHERE expires_at <= now();
            DELETE FROM llmitm_fleet_cooldowns WHERE until <= now();
            DELETE FROM llmitm_fleet_pins WHERE expires_at <= now();
            IF freed > 0 THEN
                PERFORM pg_notify('{CHANNEL}', '{{"kind": "free", "endpoint": null}}');
            END IF;
            RETURN freed;
        END $$;
        """,
    ),
    (
        2,
        # Routing state is disposable and rewritten all the time: unlogged, a write costs no
        # WAL record and a commit waits for no fsync (a new pin is awaited before an answer
        # ends). A server crash empties these tables; the fleet then rebuilds itself: each
        # proxy's heartbeat finds itself gone and joins again with the slots it holds, a
        # take does the same, and affinity and cooldowns are learned anew. The slots go
        # first: an unlogged table may reference a logged one, not the other way round.
        """
        ALTER TABLE llmitm_fleet_slots SET UNLOGGED;
        ALTER TABLE llmitm_fleet_proxies SET UNLOGGED;
        ALTER TABLE llmitm_fleet_cooldowns SET UNLOGGED;
        ALTER TABLE llmitm_fleet_pins SET UNLOGGED;
        """,
    ),
)
