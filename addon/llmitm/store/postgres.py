"""The shared store: ``Store`` over one PostgreSQL database, through asyncpg, for a fleet of
proxies (several processes on one host, or several hosts) that share usage, Responses state,
conversations, recordings and keys.

Owns connections, the transaction around each batch, reconnecting and the shared keys.
Layout, as the SQLite store's (``store.sqlite``) where nothing forces a difference:

- one writer connection, used only by the writer task of a ``WriteQueue`` (``store.writer``):
  ``submit`` never blocks and drops, counted and logged at a bounded rate, once ``max_queue``
  writes wait;
- each batch is one transaction, each run of same-kind writes in it a savepoint, so a write
  that raises is rolled back alone, logged with its kind, and its neighbours commit. A batch
  PostgreSQL aborts as a deadlock's victim or a serialization failure (other proxies write
  the same chunks) is applied again, a few times;
- reads go through a small pool, so they neither queue behind the writer nor share its
  connection (asyncpg runs one statement at a time per connection);
- several proxies write at once: the content chunks' counts stay right under concurrent
  writers (``store.postgres_content``), and the keys every proxy must agree on (the reasoning
  seal, the credential fingerprint key) are made once — ``INSERT … ON CONFLICT DO NOTHING``,
  then read back — by whichever proxy opens the database first;
- the database may be unreachable, at start or later. A proxy starts anyway (reads then fail
  with :class:`StoreUnreachable`, which the caller answers as an error), the writer retries
  with a backoff up to ``retry_max`` seconds apart, writes wait in the queue meanwhile and
  are dropped — counted, logged — once it is full. A batch whose connection broke is applied
  again on the next connection: when the break came after PostgreSQL committed but before it
  said so, that batch is written twice (usage counted twice); the window is one round trip.
  ``close`` waits ``close_timeout`` at most for an unreachable database, then gives up what is
  still queued (counted as failed);
- the password comes from the environment (``PGPASSWORD``, which asyncpg reads as libpq does)
  and never appears in a message: :attr:`location` is the URL without it.

A write kind is supported by giving it an applier: ``async (connection, writes) -> None``
(``DEFAULT_APPLIERS``, or ``appliers=`` for more), as for SQLite.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import asyncpg

from llmitm.exchange.usage import UsageRecord
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
from llmitm.store import postgres_content
from llmitm.store import postgres_conversations as conversations
from llmitm.store import postgres_recordings as recordings
from llmitm.store import postgres_responses as responses
from llmitm.store.api import GroupBy, Store, StoreStats, StoreUnreachable, UsageRow, Write
from llmitm.store.location_url import without_password
from llmitm.store.migrations import Migration
from llmitm.store.postgres_migrations import MIGRATIONS, migrate, refuse_newer, schema_version
from llmitm.store.postgres_usage import apply_usage, usage_rows
from llmitm.store.recordings import (
    DeleteRecordings,
    DeleteScope,
    PruneRecordings,
    RecordingWrite,
    RekeyRecording,
    ReplayMissRecord,
)
from llmitm.store.writer import BatchOutcome, WriteQueue

log = logging.getLogger(__name__)

PostgresApplier = Callable[[asyncpg.Connection, Sequence[Any]], Awaitable[None]]

DEFAULT_APPLIERS: Mapping[type, PostgresApplier] = {
    UsageRecord: apply_usage,
    ResponseSaved: responses.apply_saved,
    ResponseDeleted: responses.apply_deleted,
    ResponseEvents: responses.apply_events,
    ResponseOwned: responses.apply_owned,
    ResponsesPurged: responses.apply_purged,
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

_SEAL_KEY, _FINGERPRINT_KEY = responses.SECRET_NAMES
# The schema version with pending marks and run leases (a read-only store may be older).
_ACROSS_PROXIES_SCHEMA = 2

# Errors after which the connection is no good: reconnect and apply the batch again.
_CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.OperatorInterventionError,  # the server shuts down or restarts
)
# Errors PostgreSQL raises for a batch that ran beside another writer's: apply it again.
_RETRY_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.DeadlockDetectedError,
    asyncpg.exceptions.SerializationError,
)
_RETRIES = 5
# Authentication and missing databases do not heal by waiting: refuse at start.
_FATAL_AT_START: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.InvalidAuthorizationSpecificationError,
    asyncpg.exceptions.InvalidPasswordError,
    asyncpg.exceptions.InvalidCatalogNameError,
)


class PostgresStore(Store, ResponseReader, ConversationReader):
    """The store in the PostgreSQL database at ``dsn`` (``postgresql://user@host:port/db``;
    the password from ``PGPASSWORD``).

    ``max_queue``, ``batch_size``, ``appliers``, ``migrations``, ``warn_interval`` and
    ``read_only`` as for ``SqliteStore``. ``start_offline``: when the database is unreachable
    at ``open``, start anyway and keep trying (a proxy: answers must not wait for it) rather
    than fail (a command). ``connect_timeout``: seconds one connection
    attempt may take. ``retry_max``: the longest pause between the writer's attempts to
    reconnect. ``close_timeout``: how long ``close`` waits for an unreachable database.
    ``read_timeout``: how long a read waits for the writes submitted before it.
    """

    def __init__(
        self,
        dsn: str,
        *,
        max_queue: int = 10_000,
        batch_size: int = 500,
        appliers: Mapping[type, PostgresApplier] | None = None,
        migrations: Sequence[Migration] = MIGRATIONS,
        warn_interval: float = 10.0,
        read_only: bool = False,
        start_offline: bool = False,
        connect_timeout: float = 5.0,
        retry_max: float = 5.0,
        close_timeout: float = 5.0,
        read_timeout: float = 10.0,
        pool_size: int = 4,
    ) -> None:
        self.dsn = dsn
        self.read_only = read_only
        self.start_offline = start_offline
        self.schema_version = 0
        self._appliers: dict[type, PostgresApplier] = {**DEFAULT_APPLIERS, **(appliers or {})}
        self._migrations = tuple(migrations)
        self._connect_timeout = connect_timeout
        self._retry_max = retry_max
        self._close_timeout = close_timeout
        self._read_timeout = read_timeout
        self._pool_size = pool_size
        self._warn_interval = warn_interval
        self._max_queue = max_queue
        self._writes = WriteQueue(
            self._apply_batch,
            max_queue=max_queue,
            batch_size=batch_size,
            name=f"store {self.location}",
            warn_interval=warn_interval,
        )
        self._writer: asyncpg.Connection | None = None
        self._pool: asyncpg.Pool | None = None
        self._give_up_at: float | None = None
        self._next_warning = 0.0
        self._opened = False

    @property
    def location(self) -> str:
        return without_password(self.dsn)

    def reachable(self) -> bool:
        writer = self._writer
        return writer is not None and not writer.is_closed()

    # -- lifecycle

    async def open(self) -> None:
        if self._opened:
            return
        pool = await asyncpg.create_pool(
            self.dsn,
            min_size=0,
            max_size=self._pool_size,
            timeout=self._connect_timeout,
            command_timeout=None,
        )
        try:
            if self.read_only:
                async with self._acquire(pool) as db:
                    self.schema_version = await schema_version(db)
                refuse_newer(self.schema_version, self._migrations)
            else:
                await self._first_connect()
        except BaseException:
            await pool.close()
            raise
        self._pool = pool
        self._opened = True
        if not self.read_only:
            self._give_up_at = None
            self._writes.start()

    async def _first_connect(self) -> None:
        """Connect and migrate now when the database answers; when it does not, start
        anyway (the writer keeps trying). A schema too new, a wrong password or a missing
        database are refused at once: waiting does not mend them."""
        try:
            await self._connect_writer()
        except _FATAL_AT_START:
            raise
        except _CONNECTION_ERRORS as error:
            if not self.start_offline:
                raise StoreUnreachable(
                    f"{self.location}: the database is unreachable ({_reason(error)})"
                ) from None
            log.warning(
                "%s: the database is unreachable (%s); starting without it: writes wait in "
                "the queue (up to %d) while the store reconnects",
                self.location,
                _reason(error),
                self._max_queue,
            )

    async def _connect_writer(self) -> asyncpg.Connection:
        db = await asyncpg.connect(self.dsn, timeout=self._connect_timeout, command_timeout=None)
        try:
            self.schema_version = await migrate(db, self._migrations)
            await responses.ensure_secrets(db, responses.SECRET_NAMES)
        except BaseException:
            await db.close(timeout=self._connect_timeout)
            raise
        self._writer = db
        return db

    async def close(self) -> None:
        if not self._opened:
            return
        try:
            if not self.read_only:
                # From here an unreachable database is waited for close_timeout at most.
                self._give_up_at = time.monotonic() + self._close_timeout
                await self._writes.close()
        finally:
            self._opened = False
            writer, self._writer = self._writer, None
            pool, self._pool = self._pool, None
            if writer is not None:
                with contextlib.suppress(Exception):
                    await writer.close(timeout=self._connect_timeout)
            if pool is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(pool.close(), self._connect_timeout)

    def submit(self, write: Write) -> None:
        if self.read_only:
            raise RuntimeError(f"{self.location}: the store was opened read-only")
        if type(write) not in self._appliers:
            raise TypeError(f"the PostgreSQL store has no applier for {type(write).__name__}")
        self._writes.submit(write)

    async def flush(self) -> None:
        await self._writes.flush()

    def stats(self) -> StoreStats:
        return self._writes.stats()

    # -- the writer

    async def _apply_batch(self, batch: list[Write]) -> BatchOutcome:
        for attempt in itertools.count(1):
            db = self._writer or await self._reconnect()
            try:
                return await self._apply_in_transaction(db, batch)
            except _RETRY_ERRORS as error:
                if attempt >= _RETRIES:
                    raise
                log.info("%s: batch retried after %s", self.location, _reason(error))
                await asyncio.sleep(0.01 * attempt)
            except Exception as error:
                if not (isinstance(error, _CONNECTION_ERRORS) or db.is_closed()):
                    raise
                self._writer = None
                with contextlib.suppress(Exception):
                    db.terminate()
                self._warn(f"lost the connection ({_reason(error)}); reconnecting")
        raise AssertionError("unreachable")

    async def _reconnect(self) -> asyncpg.Connection:
        """The writer's connection, made again with a growing pause between attempts; gives
        up (the batch counts as failed) only once ``close`` has waited ``close_timeout``."""
        delay = 0.1
        while True:
            if self._give_up_at is not None and time.monotonic() >= self._give_up_at:
                raise StoreUnreachable(f"{self.location}: the database is unreachable")
            try:
                db = await self._connect_writer()
            except _CONNECTION_ERRORS as error:
                self._warn(f"cannot reach the database ({_reason(error)}); retrying")
            else:
                log.info("%s: connected to the database", self.location)
                return db
            pause = delay
            if self._give_up_at is not None:
                pause = max(0.0, min(pause, self._give_up_at - time.monotonic()))
            await asyncio.sleep(pause)
            delay = min(delay * 2, self._retry_max)

    def _warn(self, message: str) -> None:
        """One warning per ``warn_interval``: an outage would otherwise log every retry."""
        now = time.monotonic()
        if now < self._next_warning:
            return
        self._next_warning = now + self._warn_interval
        stats = self._writes.stats()
        log.warning(
            "%s: %s (%d write(s) queued, %d dropped so far)",
            self.location,
            message,
            stats.queued,
            stats.dropped,
        )

    async def _apply_in_transaction(
        self, db: asyncpg.Connection, batch: list[Write]
    ) -> BatchOutcome:
        """Apply ``batch`` in one transaction: first without savepoints (each costs two round
        trips, and a batch rarely holds a bad write); when a write fails, the transaction is
        rolled back and applied again with each run in its own savepoint, so only the bad
        write is lost."""
        runs = [list(run) for _, run in itertools.groupby(_in_runs(batch), key=type)]
        try:
            async with db.transaction():
                for run in runs:
                    await self._appliers[type(run[0])](db, run)
            return BatchOutcome(written=len(batch), failed=0)
        except Exception as error:
            if isinstance(error, _CONNECTION_ERRORS + _RETRY_ERRORS) or db.is_closed():
                raise
        written = failed = 0
        async with db.transaction():
            for run in runs:
                ok, bad = await self._apply_run(db, run)
                written += ok
                failed += bad
        return BatchOutcome(written=written, failed=failed)

    async def _apply_run(self, db: asyncpg.Connection, run: list[Write]) -> tuple[int, int]:
        """Apply consecutive writes of one kind in a savepoint; return (written, failed)."""
        kind = run[0].kind
        applier = self._appliers[type(run[0])]
        savepoint = db.transaction()
        await savepoint.start()
        try:
            await applier(db, run)
        except Exception as error:
            if isinstance(error, _CONNECTION_ERRORS + _RETRY_ERRORS) or db.is_closed():
                raise  # the whole batch is applied again, not this write skipped
            await savepoint.rollback()
            if len(run) > 1:
                # Find the bad write(s) by applying one at a time; the rest still commit.
                results = [await self._apply_run(db, [write]) for write in run]
                return sum(r[0] for r in results), sum(r[1] for r in results)
            log.error(
                "%s: a %r write failed and was skipped: %s",
                self.location,
                kind,
                error,
                exc_info=error,
            )
            return 0, 1
        await savepoint.commit()
        return len(run), 0

    # -- reads

    @contextlib.asynccontextmanager
    async def _acquire(self, pool: asyncpg.Pool | None = None) -> AsyncIterator[asyncpg.Connection]:
        pool = pool or self._pool
        if pool is None:
            raise RuntimeError("the store is not open")
        try:
            connection = await pool.acquire(timeout=self._connect_timeout)
        except _CONNECTION_ERRORS as error:
            raise StoreUnreachable(
                f"{self.location}: the database is unreachable ({_reason(error)})"
            ) from None
        try:
            yield connection
        finally:
            await pool.release(connection)

    @contextlib.asynccontextmanager
    async def _reading(
        self, *, settled: bool = False, snapshot: bool = False
    ) -> AsyncIterator[asyncpg.Connection]:
        """A read connection; ``settled``: after the writes submitted before the call (for
        a bounded time: an unreachable database fails the read instead); ``snapshot``: its
        statements see one state of the database (a read-only repeatable-read transaction),
        for a read of a row and then of the chunks it names, which another proxy may delete
        or save anew in between."""
        if settled and not self.read_only:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.flush(), self._read_timeout)
        async with self._acquire() as db:
            if self.schema_version == 0:
                # Never migrated by this process (read-only, or started while it was down).
                self.schema_version = await schema_version(db)
                refuse_newer(self.schema_version, self._migrations)
            if not snapshot:
                yield db
                return
            async with db.transaction(isolation="repeatable_read", readonly=True):
                yield db

    def _has_schema(self) -> bool:
        return self.schema_version >= 1

    async def usage_rows(
        self, since: datetime | None = None, group_by: GroupBy = "endpoint"
    ) -> list[UsageRow]:
        async with self._reading() as db:
            return await usage_rows(db, since, group_by) if self._has_schema() else []

    async def response(
        self, response_id: str, credential: str | None = None
    ) -> StoredResponse | None:
        async with self._reading(settled=True, snapshot=True) as db:
            if not self._has_schema():
                return None
            return await responses.read_response(db, response_id, credential)

    async def chain(
        self, response_id: str, max_depth: int = 10_000, credential: str | None = None
    ) -> list[StoredResponse]:
        async with self._reading(settled=True, snapshot=True) as db:
            if not self._has_schema():
                return []
            return await responses.read_chain(db, response_id, max_depth, credential)

    async def items(
        self, item_ids: Sequence[str], credential: str | None = None
    ) -> dict[str, dict[str, Any]]:
        async with self._reading(settled=True, snapshot=True) as db:
            if not self._has_schema():
                return {}
            return await responses.read_items(db, item_ids, credential)

    async def events(self, response_id: str, after: int = -1) -> list[bytes]:
        async with self._reading(settled=True) as db:
            if not self._has_schema():
                return []
            return await responses.read_events(db, response_id, after)

    async def owner(self, response_id: str) -> ResponseOwner | None:
        async with self._reading(settled=True) as db:
            return await responses.read_owner(db, response_id) if self._has_schema() else None

    async def pending(self, response_id: str) -> PendingResponse | None:
        async with self._reading(settled=True) as db:
            if self.schema_version < _ACROSS_PROXIES_SCHEMA:
                return None
            return await responses.read_pending(db, response_id)

    async def run_lease(self, response_id: str) -> RunLease | None:
        async with self._reading(settled=True) as db:
            if self.schema_version < _ACROSS_PROXIES_SCHEMA:
                return None
            return await responses.read_run_lease(db, response_id)

    async def owned_leases(self, owner: str) -> list[RunLease]:
        async with self._reading(settled=True) as db:
            if self.schema_version < _ACROSS_PROXIES_SCHEMA:
                return []
            return await responses.read_owned_leases(db, owner)

    async def seal_key(self) -> bytes | None:
        async with self._reading() as db:
            if not self._has_schema():
                return None
            return await responses.read_secret(db, _SEAL_KEY)

    async def fingerprint_key(self) -> bytes | None:
        async with self._reading() as db:
            if not self._has_schema():
                return None
            return await responses.read_secret(db, _FINGERPRINT_KEY)

    async def conversation(
        self, conversation_id: str, credential: str | None = None
    ) -> StoredConversation | None:
        async with self._reading(settled=True) as db:
            if not self._has_schema():
                return None
            return await conversations.read_conversation(db, conversation_id, credential)

    async def conversation_items(self, conversation_id: str) -> list[dict[str, Any]]:
        async with self._reading(settled=True) as db:
            if not self._has_schema():
                return []
            return await conversations.read_items(db, conversation_id)

    async def recordings(
        self, scope: str | None = None, limit: int | None = None
    ) -> list[Interaction]:
        async with self._reading() as db:
            if not self._has_schema():
                return []
            return await recordings.list_interactions(db, scope, limit)

    async def load_recordings(self, scope: str | None = None) -> list[Interaction]:
        async with self._reading() as db:
            if not self._has_schema():
                return []
            # One snapshot: a recording pruned meanwhile by another proxy is either whole
            # or absent, never a row without its chunks.
            async with db.transaction(isolation="repeatable_read", readonly=True):
                return await recordings.load_interactions(db, scope)

    async def recording(self, ident: str) -> Interaction | None:
        async with self._reading() as db:
            if not self._has_schema():
                return None
            async with db.transaction(isolation="repeatable_read", readonly=True):
                return await recordings.get_interaction(db, ident)

    async def request_urls(self) -> list[tuple[str, str]]:
        async with self._reading() as db:
            return await recordings.request_urls(db) if self._has_schema() else []

    async def last_replay_miss(self) -> ReplayMissRecord | None:
        async with self._reading() as db:
            return await recordings.last_miss(db) if self._has_schema() else None

    async def content_problems(self) -> list[str]:
        async with self._reading(settled=True) as db:
            return await postgres_content.check(db) if self._has_schema() else []


# Write kinds that only append rows no other kind reads or changes: applied after the rest of
# their batch, so a recording, a usage row, a recording… make two runs, not one per write
# (each run costs its applier's round trips).
_APPEND_ONLY = (UsageRecord, ReplayMissRecord)


def _in_runs(batch: list[Write]) -> list[Write]:
    """``batch`` in the order it is applied: as submitted, the append-only kinds last."""
    return [w for w in batch if not isinstance(w, _APPEND_ONLY)] + [
        w for w in batch if isinstance(w, _APPEND_ONLY)
    ]


def _reason(error: BaseException) -> str:
    """An error as a few words for a log line (no DSN: asyncpg's messages name the host,
    never the password)."""
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0][:200]
