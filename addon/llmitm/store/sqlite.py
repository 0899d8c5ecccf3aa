"""The embedded store: ``Store`` over one SQLite file, through aiosqlite.

Owns connections, pragmas, file creation and the transaction around each batch. Layout:

- one writer connection, used only by the writer task of a ``WriteQueue`` (``store.writer``):
  the queue is bounded, and when it is full ``submit`` drops the write with a counted,
  rate-limited warning instead of blocking the proxy (``max_queue`` sets the bound);
- each batch (up to ``batch_size`` queued writes) is one ``BEGIN IMMEDIATE`` transaction,
  each run of same-kind writes inside it a savepoint, so a write that raises is rolled back,
  logged with its kind, and neither loses its neighbours nor stops the writer;
- one read connection (``query_only``), so reads never queue behind writes;
- WAL with ``synchronous=NORMAL`` and a ``busy_timeout``: several llmitm processes can share
  one file, and a killed process loses at most what was still queued, never the database.
  (``NORMAL`` may lose the last commits on power loss, not on a process crash.)

What a SIGKILL loses: the flows in flight, and the flows whose last hook (``response`` or
``error``) ran but whose writes have not committed — a record also waits for the builder's
worker, which redacts it off the event loop once the client has its answer. From the
client's last byte to the commit that window is ~50 ms on an idle proxy (54 ms at most over a
loopback test, bounded at 1 s by ``tests/e2e/test_store_kill.py``), up to half a second more
after a burst of flows ending together (the builder waits for the collection of what they
left), and grows under load by the batches and builds queued before it. A stream can add
more in front: mitmproxy runs its last hook when the upstream ends the body (or the client
hangs up), and a client that stops at the last event (the openai SDK at a chat stream's
``[DONE]``) has its answer that much earlier. The window is not closed by writing before the
answer ends, on purpose: the hook path never waits for the disk. A stop (SIGINT,
SIGTERM) loses none of it: the flows in flight get ``llmitm_stop_grace`` seconds to end
(``addons/drain.py``), and the store closes once every queued write has committed.

A write kind is supported by giving it an applier: ``async (connection, writes) -> None``
that stores a run of writes of that kind (``DEFAULT_APPLIERS``, or ``appliers=`` for more).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import sqlite3
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import aiosqlite

from llmitm.exchange.usage import UsageRecord
from llmitm.file_modes import make_dir
from llmitm.replay.model import Interaction
from llmitm.responses_api.conversation_records import (
    ConversationDeleted,
    ConversationItemDeleted,
    ConversationItemsAdded,
    ConversationReader,
    ConversationSaved,
    StoredConversation,
)
from llmitm.responses_api.records import (
    PendingResponse,
    ResponseDeleted,
    ResponseEvents,
    ResponseOwned,
    ResponseOwner,
    ResponsePending,
    ResponseReader,
    ResponseSaved,
    ResponsesPurged,
    RunCancelRequested,
    RunEnded,
    RunLease,
    RunsHeartbeat,
    RunStarted,
    StaleRunEnded,
    StoredResponse,
)
from llmitm.store import sqlite_content
from llmitm.store import sqlite_conversations as conversations
from llmitm.store import sqlite_recordings as recordings
from llmitm.store import sqlite_responses as responses
from llmitm.store.api import GroupBy, Store, StoreStats, UsageRow, Write
from llmitm.store.migrations import MIGRATIONS, Migration, SchemaTooNew, migrate, user_version
from llmitm.store.recordings import (
    DeleteRecordings,
    DeleteScope,
    PruneRecordings,
    RecordingWrite,
    RekeyRecording,
    ReplayMissRecord,
)
from llmitm.store.sqlite_responses import (
    apply_deleted,
    apply_events,
    apply_owned,
    apply_purged,
    apply_saved,
    read_chain,
    read_events,
    read_items,
    read_owner,
    read_response,
    read_seal_key,
)
from llmitm.store.sqlite_usage import apply_usage, usage_rows
from llmitm.store.writer import BatchOutcome, WriteQueue

log = logging.getLogger(__name__)

SqliteApplier = Callable[[aiosqlite.Connection, Sequence[Any]], Awaitable[None]]

DEFAULT_APPLIERS: Mapping[type, SqliteApplier] = {
    UsageRecord: apply_usage,
    ResponseSaved: apply_saved,
    ResponseDeleted: apply_deleted,
    ResponseEvents: apply_events,
    ResponseOwned: apply_owned,
    ResponsesPurged: apply_purged,
    ResponsePending: responses.apply_pending,
    RunStarted: responses.apply_run_started,
    RunsHeartbeat: responses.apply_heartbeat,
    RunCancelRequested: responses.apply_cancel_requested,
    RunEnded: responses.apply_run_ended,
    StaleRunEnded: responses.apply_stale_ended,
    RecordingWrite: recordings.apply_recordings,
    DeleteScope: recordings.apply_delete_scope,
    DeleteRecordings: recordings.apply_delete_ids,
    PruneRecordings: recordings.apply_prune,
    RekeyRecording: recordings.apply_rekey,
    ReplayMissRecord: recordings.apply_misses,
    ConversationSaved: conversations.apply_saved,
    ConversationDeleted: conversations.apply_deleted,
    ConversationItemsAdded: conversations.apply_items,
    ConversationItemDeleted: conversations.apply_item_deleted,
}
_RECORDINGS_TABLE = "rec_interactions"

# The migration that gave the Responses state tables their ``credential`` columns (2 created
# them): a read-only file older than that shows no Responses state rather than failing.
_RESPONSES_SCHEMA = 6

# The migration that created the conversation tables.
_CONVERSATIONS_SCHEMA = 7

_BUSY_CODES = {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED}


class SqliteStore(Store, ResponseReader, ConversationReader):
    """The store in the SQLite file at ``path`` (created, with its folder, mode 0600).

    ``max_queue``: writes waiting for the writer before ``submit`` starts dropping.
    ``batch_size``: most writes per transaction. ``busy_timeout``: seconds a transaction
    waits for another process's lock, tried ``lock_attempts`` times before its batch is
    given up (and counted as failed). ``appliers`` adds write kinds; ``migrations``
    replaces the schema steps (for tests and for kinds added outside this package).

    ``read_only``: for commands that only read (``llmitm usage``) a file a running proxy may
    be writing: ``open`` neither creates the file nor migrates it (``FileNotFoundError`` when
    it is missing, ``SchemaTooNew`` when a newer llmitm wrote it), and ``submit`` refuses.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_queue: int = 10_000,
        batch_size: int = 500,
        busy_timeout: float = 5.0,
        lock_attempts: int = 3,
        appliers: Mapping[type, SqliteApplier] | None = None,
        migrations: Sequence[Migration] = MIGRATIONS,
        warn_interval: float = 10.0,
        read_only: bool = False,
    ) -> None:
        self.path = Path(path)
        self.read_only = read_only
        self.schema_version = 0
        self._busy_timeout_ms = max(0, round(busy_timeout * 1000))
        self._lock_attempts = max(1, lock_attempts)
        self._appliers: dict[type, SqliteApplier] = {**DEFAULT_APPLIERS, **(appliers or {})}
        self._migrations = tuple(migrations)
        self._writes = WriteQueue(
            self._apply_batch,
            max_queue=max_queue,
            batch_size=batch_size,
            name=f"store {self.path.name}",
            warn_interval=warn_interval,
        )
        self._writer: aiosqlite.Connection | None = None
        self._reader: aiosqlite.Connection | None = None

    @property
    def location(self) -> str:
        return str(self.path)

    async def open(self) -> None:
        if self.read_only:
            await self._open_read_only()
            return
        if self._writer is not None:
            return
        make_dir(self.path.parent, parents=True)  # owner-only when llmitm creates it
        _create_private(self.path)
        writer = await self._connect()
        try:
            # WAL lets readers and other processes work while a batch commits; NORMAL
            # syncs at checkpoints only, which is still crash-safe for a killed process.
            await self._wal(writer)
            await writer.execute("PRAGMA synchronous = NORMAL")
            self.schema_version = await migrate(writer, self._migrations)
            reader = await self._connect()
            await reader.execute("PRAGMA query_only = ON")
        except BaseException:
            await writer.close()
            raise
        self._writer, self._reader = writer, reader
        self._writes.start()

    async def _wal(self, writer: aiosqlite.Connection) -> None:
        """Switch the file to WAL. The switch takes the file's lock and does not wait on the
        busy handler: a second process opening a new file while the first migrates it is
        told "locked" at once, so it retries here, for at most ``busy_timeout``."""
        deadline = time.monotonic() + self._busy_timeout_ms / 1000
        while True:
            try:
                await writer.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as error:
                code = getattr(error, "sqlite_errorcode", 0) & 0xFF
                if code not in _BUSY_CODES or time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(0.02)

    async def _open_read_only(self) -> None:
        if self._reader is not None:
            return
        if not self.path.is_file():
            raise FileNotFoundError(f"{self.path}: no such database file")
        reader = await self._connect(read_only=True)
        try:
            await reader.execute("PRAGMA query_only = ON")
            self.schema_version = await user_version(reader)
            if self.schema_version > len(self._migrations):
                raise SchemaTooNew(
                    f"the database has schema version {self.schema_version}; this llmitm "
                    f"knows up to {len(self._migrations)}"
                )
        except BaseException:
            await reader.close()
            raise
        self._reader = reader

    async def close(self) -> None:
        if self.read_only:
            reader, self._reader = self._reader, None
            if reader is not None:
                await reader.close()
            return
        if self._writer is None:
            return
        try:
            await self._writes.close()
        finally:
            writer, reader = self._writer, self._reader
            self._writer = self._reader = None
            # Closing matters: an unclosed aiosqlite connection's thread outlives the loop
            # and prints "Event loop is closed" at exit.
            for connection in (reader, writer):
                if connection is not None:
                    await connection.close()

    def submit(self, write: Write) -> None:
        if self.read_only:
            raise RuntimeError(f"{self.path}: the store was opened read-only")
        if type(write) not in self._appliers:
            raise TypeError(f"the SQLite store has no applier for {type(write).__name__}")
        self._writes.submit(write)

    async def flush(self) -> None:
        await self._writes.flush()

    def stats(self) -> StoreStats:
        return self._writes.stats()

    async def usage_rows(
        self, since: datetime | None = None, group_by: GroupBy = "endpoint"
    ) -> list[UsageRow]:
        reader = self._read_connection()
        if self.schema_version < 1:
            return []  # read-only over a file no llmitm has migrated yet: nothing recorded
        return await usage_rows(reader, since, group_by)

    # -- Responses state (responses_api.records): read after the writes submitted before the call,
    # so a client that retrieves right after its create sees it.

    async def _responses_reader(self) -> aiosqlite.Connection | None:
        reader = self._read_connection()
        if self.schema_version < _RESPONSES_SCHEMA:
            return None
        if not self.read_only:
            await self.flush()
        return reader

    async def response(
        self, response_id: str, credential: str | None = None
    ) -> StoredResponse | None:
        reader = await self._responses_reader()
        if reader is None:
            return None
        return await _settled(lambda: read_response(reader, response_id, credential))

    async def chain(
        self, response_id: str, max_depth: int = 10_000, credential: str | None = None
    ) -> list[StoredResponse]:
        reader = await self._responses_reader()
        if reader is None:
            return []
        return await _settled(lambda: read_chain(reader, response_id, max_depth, credential))

    async def items(
        self, item_ids: Sequence[str], credential: str | None = None
    ) -> dict[str, dict[str, Any]]:
        reader = await self._responses_reader()
        if reader is None:
            return {}
        return await _settled(lambda: read_items(reader, item_ids, credential))

    async def events(self, response_id: str, after: int = -1) -> list[bytes]:
        reader = await self._responses_reader()
        return [] if reader is None else await read_events(reader, response_id, after)

    async def owner(self, response_id: str) -> ResponseOwner | None:
        reader = await self._responses_reader()
        return None if reader is None else await read_owner(reader, response_id)

    async def seal_key(self) -> bytes | None:
        reader = await self._responses_reader()
        return None if reader is None else await read_seal_key(reader)

    async def pending(self, response_id: str) -> PendingResponse | None:
        reader = await self._responses_reader()
        return None if reader is None else await responses.read_pending(reader, response_id)

    async def run_lease(self, response_id: str) -> RunLease | None:
        reader = await self._responses_reader()
        return None if reader is None else await responses.read_run_lease(reader, response_id)

    async def owned_leases(self, owner: str) -> list[RunLease]:
        reader = await self._responses_reader()
        return [] if reader is None else await responses.read_owned_leases(reader, owner)

    # Conversations (store.sqlite_conversations), read after the writes before the call.

    async def _conversations_reader(self) -> aiosqlite.Connection | None:
        reader = self._read_connection()
        if self.schema_version < _CONVERSATIONS_SCHEMA:
            return None
        if not self.read_only:
            await self.flush()
        return reader

    async def conversation(
        self, conversation_id: str, credential: str | None = None
    ) -> StoredConversation | None:
        reader = await self._conversations_reader()
        if reader is None:
            return None
        return await conversations.read_conversation(reader, conversation_id, credential)

    async def conversation_items(self, conversation_id: str) -> list[dict[str, Any]]:
        reader = await self._conversations_reader()
        return [] if reader is None else await conversations.read_items(reader, conversation_id)

    # Recordings (store.sqlite_recordings). A file without the recordings tables (read-only
    # over an older schema) simply has none.

    async def recordings(
        self, scope: str | None = None, limit: int | None = None
    ) -> list[Interaction]:
        """Recorded interactions without their legs, oldest first (``rec ls``)."""
        reader = self._read_connection()
        if not await self._has_recordings(reader):
            return []
        return await recordings.list_interactions(reader, scope, limit)

    async def load_recordings(self, scope: str | None = None) -> list[Interaction]:
        """Recorded interactions with all four legs, in arrival order (replay, export)."""
        reader = self._read_connection()
        if not await self._has_recordings(reader):
            return []
        return await recordings.load_interactions(reader, scope)

    async def request_urls(self) -> list[tuple[str, str]]:
        """``(id, URL)`` of each recording's client request, without loading the legs."""
        reader = self._read_connection()
        if not await self._has_recordings(reader):
            return []
        return await recordings.request_urls(reader)

    async def recording(self, ident: str) -> Interaction | None:
        """One interaction by id or unique id prefix, with its legs."""
        reader = self._read_connection()
        if not await self._has_recordings(reader):
            return None
        return await recordings.get_interaction(reader, ident)

    async def fingerprint_key(self) -> bytes | None:
        """The key credential fingerprints are made with (``None``: an older schema)."""
        reader = self._read_connection()
        if self.schema_version < 4:
            return None
        return await recordings.read_fingerprint_key(reader)

    async def content_problems(self) -> list[str]:
        """What is wrong with the shared chunks (``store.sqlite_content.check``): references
        to missing chunks, counts that differ from the references. Empty when all is well,
        and for a file older than the chunk table."""
        reader = self._read_connection()
        if not await sqlite_content.has_chunks(reader):
            return []
        if not self.read_only:
            await self.flush()
        return await sqlite_content.check(reader)

    async def last_replay_miss(self) -> ReplayMissRecord | None:
        reader = self._read_connection()
        if not await self._has_recordings(reader):
            return None
        return await recordings.last_miss(reader)

    async def _has_recordings(self, reader: aiosqlite.Connection) -> bool:
        async with reader.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (_RECORDINGS_TABLE,)
        ) as cursor:
            return await cursor.fetchone() is not None

    def _read_connection(self) -> aiosqlite.Connection:
        if self._reader is None:
            raise RuntimeError("the store is not open")
        return self._reader

    async def _connect(self, *, read_only: bool = False) -> aiosqlite.Connection:
        # isolation_level=None: autocommit, so the only transactions are the ones this
        # module begins (the sqlite3 module's implicit BEGIN would be DEFERRED and could
        # fail to upgrade to a write lock without waiting for busy_timeout).
        if read_only:
            uri = f"{self.path.resolve().as_uri()}?mode=ro"
            connection = await aiosqlite.connect(uri, uri=True, isolation_level=None)
        else:
            connection = await aiosqlite.connect(self.path, isolation_level=None)
        try:
            await connection.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms:d}")
        except BaseException:
            await connection.close()
            raise
        return connection

    async def _apply_batch(self, batch: list[Write]) -> BatchOutcome:
        db = self._writer
        assert db is not None, "the writer runs only while the store is open"
        await self._begin(db)
        written = failed = 0
        try:
            for _, run in itertools.groupby(batch, key=type):
                ok, bad = await self._apply_run(db, list(run))
                written += ok
                failed += bad
            await db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                await db.execute("ROLLBACK")
            raise
        return BatchOutcome(written=written, failed=failed)

    async def _begin(self, db: aiosqlite.Connection) -> None:
        # IMMEDIATE takes the write lock now, where busy_timeout applies, instead of at the
        # first write, where a stale WAL snapshot fails at once with SQLITE_BUSY.
        for attempt in itertools.count(1):
            try:
                await db.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as error:
                code = getattr(error, "sqlite_errorcode", 0) & 0xFF
                if code not in _BUSY_CODES or attempt >= self._lock_attempts:
                    raise
                log.warning(
                    "%s: database locked by another process; retry %d of %d",
                    self.path,
                    attempt,
                    self._lock_attempts - 1,
                )
                await asyncio.sleep(0.05 * attempt)

    async def _apply_run(self, db: aiosqlite.Connection, run: list[Write]) -> tuple[int, int]:
        """Apply consecutive writes of one kind; return (written, failed)."""
        kind = run[0].kind
        applier = self._appliers[type(run[0])]
        await db.execute("SAVEPOINT llmitm_write")
        try:
            await applier(db, run)
        except Exception as error:
            await db.execute("ROLLBACK TO llmitm_write")
            await db.execute("RELEASE llmitm_write")
            if len(run) > 1:
                # Find the bad write(s) by applying one at a time; the rest still commit.
                results = [await self._apply_run(db, [write]) for write in run]
                return sum(r[0] for r in results), sum(r[1] for r in results)
            log.error(
                "%s: a %r write failed and was skipped: %s", self.path, kind, error, exc_info=error
            )
            return 0, 1
        await db.execute("RELEASE llmitm_write")
        return len(run), 0


def _create_private(path: Path) -> None:
    """Create the database file readable by its owner only: recordings may hold prompts.

    SQLite gives the -wal and -shm files the database file's mode. An existing file keeps
    the mode its owner gave it.
    """
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return
    os.close(fd)


async def _settled[T](read: Callable[[], Awaitable[T]]) -> T:
    """``read()``, once more if a chunk it needed was gone: the read connection runs each
    statement on its own (reads of several coroutines share it, so it holds no transaction
    open), and a writer — this process's or another's on the same file — may delete or save
    anew a response between the read of its row and of its chunks. The second read sees
    that change whole; a chunk missing twice is a damaged store, and raises."""
    try:
        return await read()
    except LookupError:
        return await read()
