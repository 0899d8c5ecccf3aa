"""SQLite schema versions: the ordered list of migration steps and the code that applies them.

The database's ``PRAGMA user_version`` is the number of steps applied. A step is never edited
once released: a later issue that needs a table or a column appends a step. Steps run in one
``BEGIN IMMEDIATE`` transaction each, with the version re-read under the lock, so several
llmitm processes opening one new file at once migrate it exactly once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import aiosqlite

from llmitm.errors import StoreError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Migration:
    """Step ``version`` (1-based, consecutive): the statements that take the schema there."""

    version: int
    name: str
    statements: tuple[str, ...]


class SchemaTooNew(StoreError, RuntimeError):
    """The database was written by a newer llmitm; this one must not touch it."""


# Recordings (issue 6): only rec_* tables, each created IF NOT EXISTS, so this step commutes
# with any other feature's step: whichever number a merge gives it, the schema ends up the same.
_RECORDINGS: tuple[str, ...] = (
    """
    CREATE TABLE IF NOT EXISTS rec_interactions (
        id TEXT PRIMARY KEY,
        session TEXT NOT NULL,
        started_us INTEGER NOT NULL,
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
        ttfb_us INTEGER,
        duration_us INTEGER,
        truncated TEXT,
        error TEXT,
        mode TEXT NOT NULL
    )
    """,
    "CREATE INDEX IF NOT EXISTS rec_interactions_key "
    "ON rec_interactions (scope, match_key, started_us)",
    "CREATE INDEX IF NOT EXISTS rec_interactions_started ON rec_interactions (started_us)",
    """
    CREATE TABLE IF NOT EXISTS rec_messages (
        interaction_id TEXT NOT NULL,
        leg TEXT NOT NULL
            CHECK (leg IN ('client_req', 'upstream_req', 'upstream_resp', 'client_resp')),
        method TEXT NOT NULL,
        url TEXT NOT NULL,
        status INTEGER NOT NULL,
        headers_json TEXT NOT NULL,
        body_sha256 TEXT NOT NULL,
        chunk_index BLOB,
        PRIMARY KEY (interaction_id, leg)
    ) WITHOUT ROWID
    """,
    """
    CREATE TABLE IF NOT EXISTS rec_blobs (
        sha256 TEXT PRIMARY KEY,
        size INTEGER NOT NULL,
        data BLOB NOT NULL
    ) WITHOUT ROWID
    """,
    """
    CREATE TABLE IF NOT EXISTS rec_misses (
        id INTEGER PRIMARY KEY,
        at_us INTEGER NOT NULL,
        scope TEXT NOT NULL,
        match_key TEXT NOT NULL,
        reason TEXT NOT NULL,
        canonical TEXT NOT NULL,
        closest_id TEXT,
        closest_canonical TEXT
    )
    """,
)


# The Conversations API (store.sqlite_conversations). New tables only, each IF NOT EXISTS:
# like the recordings step, it commutes with any other feature's step whatever its number.
_CONVERSATIONS: tuple[str, ...] = (
    """
    CREATE TABLE IF NOT EXISTS conversations (
        id TEXT PRIMARY KEY,
        created_at REAL NOT NULL,
        metadata BLOB NOT NULL,
        credential TEXT
    )
    """,
    # Items in the order they were added; a JSON blob each, read only by the sans-IO API.
    """
    CREATE TABLE IF NOT EXISTS conversation_items (
        conversation_id TEXT NOT NULL,
        position INTEGER NOT NULL,
        item_id TEXT NOT NULL,
        item BLOB NOT NULL,
        PRIMARY KEY (conversation_id, position)
    ) WITHOUT ROWID
    """,
    "CREATE INDEX IF NOT EXISTS conversation_items_id ON conversation_items "
    "(conversation_id, item_id)",
)

# Responses state across proxies sharing one store (store.sqlite_responses): new tables only,
# each IF NOT EXISTS, so this step too commutes with any other feature's step.
_RESPONSES_ACROSS_PROXIES: tuple[str, ...] = (
    # A response a proxy is answering and will store: another proxy asked for it waits.
    """
    CREATE TABLE IF NOT EXISTS response_pending (
        id TEXT PRIMARY KEY,
        created_at REAL NOT NULL,
        credential TEXT
    )
    """,
    # The lease of each running background response: its proxy's heartbeat, and a cancel
    # (or delete) another proxy asked for.
    """
    CREATE TABLE IF NOT EXISTS response_runs (
        response_id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        heartbeat_at REAL NOT NULL,
        cancel_requested_at REAL,
        delete_requested INTEGER NOT NULL DEFAULT 0
    )
    """,
    "CREATE INDEX IF NOT EXISTS response_runs_owner ON response_runs (owner)",
)

MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "usage",
        (
            # One row per upstream response. Times are UTC microseconds since the epoch:
            # integers compare and group exactly, and ``day`` is a cheap strftime away.
            """
            CREATE TABLE usage (
                id INTEGER PRIMARY KEY,
                at_us INTEGER NOT NULL,
                endpoint TEXT NOT NULL,
                model TEXT NOT NULL,
                route TEXT NOT NULL,
                input_tokens INTEGER NOT NULL DEFAULT 0,
                cached_tokens INTEGER NOT NULL DEFAULT 0,
                output_tokens INTEGER NOT NULL DEFAULT 0,
                reasoning_tokens INTEGER NOT NULL DEFAULT 0
            )
            """,
            "CREATE INDEX usage_at ON usage (at_us)",
        ),
    ),
    Migration(
        2,
        "responses",
        (
            # Responses llmitm answers over chat-only endpoints (store.sqlite_responses).
            # JSON blobs: only the sans-IO local Responses API looks inside them.
            """
            CREATE TABLE responses (
                id TEXT PRIMARY KEY,
                response BLOB NOT NULL,
                input_items BLOB NOT NULL,
                previous_response_id TEXT,
                created_at REAL NOT NULL,
                expires_at REAL
            )
            """,
            "CREATE INDEX responses_expires ON responses (expires_at) WHERE expires_at IS NOT NULL",
            # Every input and output item with an id, for input item_reference {id}.
            """
            CREATE TABLE response_items (
                item_id TEXT NOT NULL,
                response_id TEXT NOT NULL,
                item BLOB NOT NULL,
                PRIMARY KEY (item_id, response_id)
            ) WITHOUT ROWID
            """,
            "CREATE INDEX response_items_response ON response_items (response_id)",
            # Events of background responses, for GET ?stream=true&starting_after=N.
            """
            CREATE TABLE response_events (
                response_id TEXT NOT NULL,
                seq INTEGER NOT NULL,
                event BLOB NOT NULL,
                PRIMARY KEY (response_id, seq)
            ) WITHOUT ROWID
            """,
            # Ids minted by native Responses endpoints: where their retrieve/delete/… go.
            """
            CREATE TABLE response_owners (
                id TEXT PRIMARY KEY,
                endpoint TEXT NOT NULL,
                created_at REAL NOT NULL,
                expires_at REAL
            )
            """,
            # The key that seals reasoning into encrypted_content, made once, with the schema,
            # under the migration's lock: every process sharing this file agrees on it, and
            # tokens stay valid across restarts. It never leaves the (0600) database.
            "CREATE TABLE llmitm_secrets (name TEXT PRIMARY KEY, value BLOB NOT NULL)",
            "INSERT INTO llmitm_secrets (name, value) VALUES ('reasoning-seal', randomblob(32))",
        ),
    ),
    Migration(3, "recordings", _RECORDINGS),
    Migration(
        4,
        "recorded mints, compressed bodies, credential fingerprints",
        (
            # The ids, times and sealed tokens a translated answer was minted with (JSON,
            # replay.model.Interaction.minted): a replay through today's translator hands them
            # out again, so it re-makes the recorded answer byte for byte.
            "ALTER TABLE rec_interactions ADD COLUMN minted TEXT",
            # How a body and a chunk index are stored (store.blob_codec): '' raw, 'zstd'.
            "ALTER TABLE rec_blobs ADD COLUMN codec TEXT NOT NULL DEFAULT ''",
            "ALTER TABLE rec_messages ADD COLUMN index_codec TEXT NOT NULL DEFAULT ''",
            # Which credential a recording was made with, as an HMAC fingerprint under a key
            # that never leaves this database (replay.fingerprint); never exported.
            "ALTER TABLE rec_interactions ADD COLUMN credential TEXT",
            "INSERT INTO llmitm_secrets (name, value) "
            "VALUES ('credential-fingerprint', randomblob(32))",
        ),
    ),
    Migration(
        5,
        "chunk indexes of layout 2",
        (
            # Recording now writes chunk indexes as arrival times (float64) and lengths
            # (store.recording_rows.pack_index, layout 2). Nothing in the tables changes:
            # the step exists so that an older llmitm, which would read those indexes as
            # layout 1 and cut streams at the wrong places, refuses the file instead.
            "SELECT 1",
        ),
    ),
    Migration(
        6,
        "who created each stored response",
        (
            # The HMAC fingerprint (replay.fingerprint) of the client credential that created
            # a stored response or had a native endpoint mint an id, or 'anonymous': state
            # calls answer only that credential. Rows from before stay NULL, owned by nobody:
            # only a proxy whose responses_scope is "shared" still reads them.
            "ALTER TABLE responses ADD COLUMN credential TEXT",
            "ALTER TABLE response_owners ADD COLUMN credential TEXT",
        ),
    ),
    Migration(7, "conversations", _CONVERSATIONS),
    Migration(
        8,
        "content-addressed chunks shared by recordings and Responses state",
        (
            # Large values stored once (store.content, store.sqlite_content): a chunk is a leaf
            # (bytes) or a recipe (literals, whole chunks and slices of chunks), named by the
            # sha256 of what it holds and counting the references to it (owner columns below
            # and recipes), so a chunk is deleted when its last owner is.
            """
            CREATE TABLE store_chunks (
                name BLOB PRIMARY KEY,
                kind TEXT NOT NULL CHECK (kind IN ('leaf', 'recipe')),
                refs INTEGER NOT NULL,
                size INTEGER NOT NULL,
                codec TEXT NOT NULL,
                data BLOB NOT NULL
            )
            """,
            # The owners. A row whose chunk column is set keeps its value there (and an empty
            # value in the older column); rows from before keep theirs where they were.
            "ALTER TABLE rec_messages ADD COLUMN body_chunk BLOB",
            "ALTER TABLE rec_interactions ADD COLUMN canonical_chunk BLOB",
            "ALTER TABLE responses ADD COLUMN input_chunk BLOB",
            "ALTER TABLE responses ADD COLUMN response_chunk BLOB",
            # Input items by id, for item_reference, in 16 bytes a row: a resent history gets
            # fresh ids every turn, so this index grows with the square of the turns, and a
            # row of text ids cost ~250 bytes with its index. Keys are the first 8 bytes of
            # the ids' blake2b; a reader confirms a hit by the item's id itself.
            "ALTER TABLE responses ADD COLUMN id_key INTEGER",
            "CREATE INDEX responses_id_key ON responses (id_key)",
            """
            CREATE TABLE response_input_ids (
                item_key INTEGER NOT NULL,
                response_key INTEGER NOT NULL,
                PRIMARY KEY (item_key, response_key)
            ) WITHOUT ROWID
            """,
            "CREATE INDEX response_input_ids_response ON response_input_ids (response_key)",
        ),
    ),
    Migration(9, "responses and background runs across proxies", _RESPONSES_ACROSS_PROXIES),
)


def check_sequence(migrations: Sequence[Migration]) -> None:
    """Refuse a list whose versions are not 1, 2, 3, … (a merge mistake, caught at open)."""
    for expected, step in enumerate(migrations, start=1):
        if step.version != expected:
            raise ValueError(f"migration {step.name!r} has version {step.version}, not {expected}")


async def user_version(db: aiosqlite.Connection) -> int:
    async with db.execute("PRAGMA user_version") as cursor:
        row = await cursor.fetchone()
    return int(row[0]) if row else 0


async def migrate(db: aiosqlite.Connection, migrations: Sequence[Migration]) -> int:
    """Apply the steps the database lacks; return its version afterwards.

    ``db`` must be in autocommit mode (``isolation_level=None``) so the transactions here
    are the only ones.
    """
    check_sequence(migrations)
    latest = len(migrations)
    current = await user_version(db)
    while current < latest:
        await db.execute("BEGIN IMMEDIATE")
        try:
            # Another process may have migrated while we waited for the lock.
            current = await user_version(db)
            step = migrations[current] if current < latest else None
            if step is not None:
                for statement in step.statements:
                    await db.execute(statement)
                # user_version lives in the database header, inside this transaction.
                await db.execute(f"PRAGMA user_version = {step.version:d}")
        except BaseException:
            await db.execute("ROLLBACK")
            raise
        await db.execute("COMMIT" if step is not None else "ROLLBACK")
        if step is None:
            break
        log.info("store: applied migration %d (%s)", step.version, step.name)
        current = step.version
    if current > latest:
        raise SchemaTooNew(
            f"the database has schema version {current}; this llmitm knows up to {latest}"
        )
    return current
