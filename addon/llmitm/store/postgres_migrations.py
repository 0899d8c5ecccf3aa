"""PostgreSQL schema versions: the ordered steps and the code that applies them.

The same rules as the SQLite steps (``store.migrations``): a step is never edited once
released, a later need appends one, and a database a newer llmitm wrote is refused
(:class:`SchemaTooNew`). The version is the one row of ``llmitm_schema`` rather than a pragma.
Several proxies opening one new database at once migrate it exactly once: each step runs in
one transaction that first takes a transaction-scoped advisory lock and re-reads the version
under it (PostgreSQL's DDL is transactional, so a failed step leaves nothing behind).

Step 1 is the schema the SQLite steps end at (version 8 there): a PostgreSQL store never held
the older shapes, so it has no columns kept only for them. Large values live in the chunk
table from the start (``store.postgres_content``); the secrets table is created empty and its
keys are made by the first proxy that opens the database (``store.postgres``). Step 2 is
SQLite's step 9: what proxies sharing the database tell each other about responses still
being answered and background runs.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import asyncpg

from llmitm.store.migrations import Migration, SchemaTooNew, check_sequence

log = logging.getLogger(__name__)

# Any constant that no other advisory lock of this database uses: "llmitm" in ASCII.
_MIGRATION_LOCK = 0x6C6C6D69746D

_SCHEMA_TABLE = (
    "CREATE TABLE IF NOT EXISTS llmitm_schema "
    "(one BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one), version INTEGER NOT NULL)"
)

MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "usage, Responses state, conversations, recordings, content-addressed chunks",
        (
            # One row per upstream response; times are UTC microseconds since the epoch.
            """
            CREATE TABLE usage (
                id BIGSERIAL PRIMARY KEY,
                at_us BIGINT NOT NULL,
                endpoint TEXT NOT NULL,
                model TEXT NOT NULL,
                route TEXT NOT NULL,
                input_tokens BIGINT NOT NULL DEFAULT 0,
                cached_tokens BIGINT NOT NULL DEFAULT 0,
                output_tokens BIGINT NOT NULL DEFAULT 0,
                reasoning_tokens BIGINT NOT NULL DEFAULT 0
            )
            """,
            "CREATE INDEX usage_at ON usage (at_us)",
            # Large values, stored once (store.content): a leaf or a recipe, named by the
            # sha256 of what it holds, counting its references.
            """
            CREATE TABLE store_chunks (
                name BYTEA PRIMARY KEY,
                kind TEXT NOT NULL CHECK (kind IN ('leaf', 'recipe')),
                refs BIGINT NOT NULL,
                size BIGINT NOT NULL,
                codec TEXT NOT NULL,
                data BYTEA NOT NULL
            )
            """,
            # Responses state (store.postgres_responses). JSON as bytes: only the sans-IO
            # local Responses API looks inside.
            """
            CREATE TABLE responses (
                id TEXT PRIMARY KEY,
                response BYTEA NOT NULL,
                input_items BYTEA NOT NULL,
                previous_response_id TEXT,
                created_at DOUBLE PRECISION NOT NULL,
                expires_at DOUBLE PRECISION,
                credential TEXT,
                input_chunk BYTEA,
                response_chunk BYTEA,
                id_key BIGINT
            )
            """,
            "CREATE INDEX responses_expires ON responses (expires_at) WHERE expires_at IS NOT NULL",
            "CREATE INDEX responses_id_key ON responses (id_key)",
            """
            CREATE TABLE response_items (
                item_id TEXT NOT NULL,
                response_id TEXT NOT NULL,
                item BYTEA NOT NULL,
                PRIMARY KEY (item_id, response_id)
            )
            """,
            "CREATE INDEX response_items_response ON response_items (response_id)",
            """
            CREATE TABLE response_input_ids (
                item_key BIGINT NOT NULL,
                response_key BIGINT NOT NULL,
                PRIMARY KEY (item_key, response_key)
            )
            """,
            "CREATE INDEX response_input_ids_response ON response_input_ids (response_key)",
            """
            CREATE TABLE response_events (
                response_id TEXT NOT NULL,
                seq BIGINT NOT NULL,
                event BYTEA NOT NULL,
                PRIMARY KEY (response_id, seq)
            )
            """,
            """
            CREATE TABLE response_owners (
                id TEXT PRIMARY KEY,
                endpoint TEXT NOT NULL,
                created_at DOUBLE PRECISION NOT NULL,
                expires_at DOUBLE PRECISION,
                credential TEXT
            )
            """,
            # Keys every proxy on this database shares (the reasoning seal, the credential
            # fingerprint key). They never leave the database.
            "CREATE TABLE llmitm_secrets (name TEXT PRIMARY KEY, value BYTEA NOT NULL)",
            # Conversations (store.postgres_conversations).
            """
            CREATE TABLE conversations (
                id TEXT PRIMARY KEY,
                created_at DOUBLE PRECISION NOT NULL,
                metadata BYTEA NOT NULL,
                credential TEXT
            )
            """,
            """
            CREATE TABLE conversation_items (
                conversation_id TEXT NOT NULL,
                position BIGINT NOT NULL,
                item_id TEXT NOT NULL,
                item BYTEA NOT NULL,
                PRIMARY KEY (conversation_id, position)
            )
            """,
            "CREATE INDEX conversation_items_id ON conversation_items (conversation_id, item_id)",
            # Recordings (store.postgres_recordings): whole bodies and canonical texts are
            # chunks; streams stay named rec_blobs rows.
            """
            CREATE TABLE rec_interactions (
                id TEXT PRIMARY KEY,
                session TEXT NOT NULL,
                started_us BIGINT NOT NULL,
                scope TEXT NOT NULL,
                match_key TEXT NOT NULL,
                match_key_version INTEGER NOT NULL,
                method TEXT NOT NULL,
                route TEXT NOT NULL,
                model TEXT NOT NULL,
                stream INTEGER NOT NULL,
                canonical TEXT NOT NULL,
                status INTEGER NOT NULL,
                endpoint TEXT NOT NULL,
                plan TEXT NOT NULL,
                ttfb_us BIGINT,
                duration_us BIGINT,
                truncated TEXT,
                error TEXT,
                mode TEXT NOT NULL,
                minted TEXT,
                credential TEXT,
                canonical_chunk BYTEA
            )
            """,
            "CREATE INDEX rec_interactions_key ON rec_interactions (scope, match_key, started_us)",
            "CREATE INDEX rec_interactions_started ON rec_interactions (started_us)",
            """
            CREATE TABLE rec_messages (
                interaction_id TEXT NOT NULL,
                leg TEXT NOT NULL
                    CHECK (leg IN ('client_req', 'upstream_req', 'upstream_resp', 'client_resp')),
                method TEXT NOT NULL,
                url TEXT NOT NULL,
                status INTEGER NOT NULL,
                headers_json TEXT NOT NULL,
                body_sha256 TEXT NOT NULL,
                chunk_index BYTEA,
                index_codec TEXT NOT NULL DEFAULT '',
                body_chunk BYTEA,
                PRIMARY KEY (interaction_id, leg)
            )
            """,
            "CREATE INDEX rec_messages_body ON rec_messages (body_sha256)",
            """
            CREATE TABLE rec_blobs (
                sha256 TEXT PRIMARY KEY,
                size BIGINT NOT NULL,
                codec TEXT NOT NULL DEFAULT '',
                data BYTEA NOT NULL
            )
            """,
            """
            CREATE TABLE rec_misses (
                id BIGSERIAL PRIMARY KEY,
                at_us BIGINT NOT NULL,
                scope TEXT NOT NULL,
                match_key TEXT NOT NULL,
                reason TEXT NOT NULL,
                canonical TEXT NOT NULL,
                closest_id TEXT,
                closest_canonical TEXT
            )
            """,
        ),
    ),
    Migration(
        2,
        "responses and background runs across proxies",
        (
            # A response a proxy is answering and will store: another proxy asked for it
            # waits. Times are seconds since the epoch by the writing proxy's clock.
            """
            CREATE TABLE response_pending (
                id TEXT PRIMARY KEY,
                created_at DOUBLE PRECISION NOT NULL,
                credential TEXT
            )
            """,
            "CREATE INDEX response_pending_created ON response_pending (created_at)",
            # The lease of each running background response: its proxy's heartbeat, and a
            # cancel (or delete) another proxy asked for.
            """
            CREATE TABLE response_runs (
                response_id TEXT PRIMARY KEY,
                owner TEXT NOT NULL,
                heartbeat_at DOUBLE PRECISION NOT NULL,
                cancel_requested_at DOUBLE PRECISION,
                delete_requested BOOLEAN NOT NULL DEFAULT FALSE
            )
            """,
            "CREATE INDEX response_runs_owner ON response_runs (owner)",
        ),
    ),
)


async def schema_version(db: asyncpg.Connection) -> int:
    """The version the database is at (0: no llmitm schema yet)."""
    exists = await db.fetchval("SELECT to_regclass('llmitm_schema') IS NOT NULL")
    if not exists:
        return 0
    version = await db.fetchval("SELECT version FROM llmitm_schema")
    return int(version or 0)


def refuse_newer(version: int, migrations: Sequence[Migration]) -> None:
    if version > len(migrations):
        raise SchemaTooNew(
            f"the database has schema version {version}; this llmitm knows up to {len(migrations)}"
        )


async def migrate(db: asyncpg.Connection, migrations: Sequence[Migration]) -> int:
    """Apply the steps the database lacks, one transaction each; return its version."""
    check_sequence(migrations)
    latest = len(migrations)
    current = await schema_version(db)
    while current < latest:
        async with db.transaction():
            await db.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATION_LOCK)
            await db.execute(_SCHEMA_TABLE)
            # Another proxy may have migrated while this one waited for the lock.
            current = await schema_version(db)
            if current >= latest:
                break
            step = migrations[current]
            for statement in step.statements:
                await db.execute(statement)
            await db.execute(
                "INSERT INTO llmitm_schema (one, version) VALUES (TRUE, $1) "
                "ON CONFLICT (one) DO UPDATE SET version = EXCLUDED.version",
                step.version,
            )
        log.info("store: applied PostgreSQL migration %d (%s)", step.version, step.name)
        current = step.version
    refuse_newer(current, migrations)
    return current
