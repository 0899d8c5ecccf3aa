"""The fleet's shared routing state in PostgreSQL (asyncpg): slots, heartbeats, cooldowns, pins.

Times are the database's (``now()``), so proxies on hosts with skewed clocks agree; what
crosses the wire is a number of seconds (a cooldown's remaining time, a pin's TTL), which each
proxy turns into its own monotonic clock. Every call runs under ``asyncio.timeout`` and turns
any failure into :class:`~llmitm.store.fleet.FleetUnavailable`. Slot changes and cooldowns are
announced with NOTIFY on one channel, heard by one listening connection per proxy.

The password never appears in the location: asyncpg reads it from ``PGPASSWORD``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import socket
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import orjson

from llmitm.store.fleet import (
    Cooldown,
    FleetState,
    FleetUnavailable,
    Member,
    Notice,
    Pin,
    Slot,
)
from llmitm.store.postgres_fleet_schema import CHANNEL, MIGRATIONS, SCHEMA_LOCK

logger = logging.getLogger(__name__)

POOL_SIZE = 8
"""Connections per proxy for slot, cooldown and pin calls (each is one short statement)."""

OPEN_TIMEOUT = 5.0
"""Seconds joining may take at least (creating the tables the first time is slower than a
routing call)."""

_FAILURES = (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError)

_TAKING = "llmitm_fleet_take(id, $1, endpoint, model, cap, model_cap) AS taken"
_TAKE = (
    f"SELECT id, {_TAKING}"
    " FROM unnest($2::text[], $3::text[], $4::text[], $5::integer[], $6::integer[])"
    " WITH ORDINALITY AS t (id, endpoint, model, cap, model_cap, n) ORDER BY n"
)
"""Each slot's take, in the order given (a batch's statement)."""
# A new conversation's pin goes in the same statement (and transaction) as its slot's take:
# it costs no statement of its own. ``t`` is evaluated once (it is volatile), and the INSERT
# runs whether or not the final SELECT reads it.
_TAKE_AND_PIN = (
    "WITH t AS MATERIALIZED ("
    f" SELECT id, endpoint, pin_kind, pin_key, pin_ttl, n, {_TAKING}"
    " FROM unnest($2::text[], $3::text[], $4::text[], $5::integer[], $6::integer[],"
    " $7::text[], $8::text[], $9::float8[])"
    " WITH ORDINALITY AS t (id, endpoint, model, cap, model_cap, pin_kind, pin_key, pin_ttl, n)),"
    " pinned AS ("
    " INSERT INTO llmitm_fleet_pins (kind, key, endpoint, expires_at)"
    " SELECT DISTINCT ON (pin_kind, pin_key) pin_kind, pin_key, endpoint,"
    " now() + make_interval(secs => pin_ttl)"
    " FROM t WHERE taken > 0 AND pin_key IS NOT NULL"
    " ORDER BY pin_kind, pin_key, n DESC"
    " ON CONFLICT (kind, key) DO UPDATE"
    " SET endpoint = excluded.endpoint, expires_at = excluded.expires_at)"
    " SELECT id, taken FROM t ORDER BY n"
)


class PostgresFleet(FleetState):
    def __init__(self, dsn: str, *, lease: float, timeout: float) -> None:
        self.dsn = dsn
        self.lease = lease
        self.timeout = timeout
        self.proxy = f"{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"
        self._pool: asyncpg.Pool | None = None
        self._listener: asyncpg.Connection | None = None
        self._on_notice: Notice | None = None

    # --- lifecycle --------------------------------------------------------------------------

    async def open(self, on_notice: Notice) -> None:
        self._on_notice = on_notice
        async with self._call(max(self.timeout, OPEN_TIMEOUT)):
            if self._pool is None:
                self._pool = await asyncpg.create_pool(
                    self.dsn,
                    min_size=1,
                    max_size=POOL_SIZE,
                    timeout=self.timeout,
                    reset=_keep_session,
                )
            async with self._pool.acquire() as conn:
                await _migrate(conn)
                await self._join(conn, ())
        await self._listen()

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        listener, self._listener = self._listener, None
        try:
            if pool is not None:
                async with asyncio.timeout(self.timeout):
                    # Leaving frees this proxy's slots now, and says so.
                    await pool.execute("DELETE FROM llmitm_fleet_proxies WHERE id = $1", self.proxy)
                    await pool.execute("SELECT pg_notify($1, $2)", CHANNEL, _FREE_ANY)
        except _FAILURES as exc:
            logger.warning("llmitm: could not leave the fleet cleanly: %s", exc)
        finally:
            if listener is not None:
                listener.terminate()
            if pool is not None:
                pool.terminate()

    async def _listen(self) -> None:
        """(Re)connect the listening connection."""
        if self._listener is not None and not self._listener.is_closed():
            return
        async with self._call():
            conn = await asyncpg.connect(self.dsn, timeout=self.timeout)
            await conn.add_listener(CHANNEL, self._heard)
            self._listener = conn

    def _heard(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        if self._on_notice is None:
            return
        try:
            notice = orjson.loads(payload)
            kind = notice.pop("kind")
        except (orjson.JSONDecodeError, KeyError, AttributeError):
            return
        self._on_notice(kind, notice)

    async def _join(self, conn: asyncpg.Connection, held: Sequence[Slot]) -> None:
        await conn.execute(
            "INSERT INTO llmitm_fleet_proxies (id, host, pid, expires_at)"
            " VALUES ($1, $2, $3, now() + make_interval(secs => $4))"
            " ON CONFLICT (id) DO UPDATE SET heartbeat_at = now(),"
            " expires_at = excluded.expires_at",
            self.proxy,
            socket.gethostname(),
            os.getpid(),
            self.lease,
        )
        if held:
            await conn.executemany(
                "INSERT INTO llmitm_fleet_slots (id, proxy, endpoint, model)"
                " VALUES ($1, $2, $3, $4) ON CONFLICT (id) DO NOTHING",
                [(s.id, self.proxy, s.endpoint, s.model) for s in held],
            )

    # --- membership -------------------------------------------------------------------------

    async def heartbeat(self, held: Sequence[Slot]) -> int:
        async with self._call(), self._conn() as conn:
            beat = await conn.execute(
                "UPDATE llmitm_fleet_proxies SET heartbeat_at = now(),"
                " expires_at = now() + make_interval(secs => $2)"
                " WHERE id = $1 AND expires_at > now()",
                self.proxy,
                self.lease,
            )
            if beat == "UPDATE 0":
                logger.warning("llmitm: the fleet had counted this proxy dead; joining again")
                await self._join(conn, held)
            freed: int = await conn.fetchval("SELECT llmitm_fleet_sweep()")
        await self._listen()
        return freed

    async def members(self) -> list[Member]:
        async with self._call(), self._conn() as conn:
            rows = await conn.fetch(
                "SELECT p.id, p.host, p.pid, p.expires_at > now() AS alive,"
                " extract(epoch FROM now() - p.heartbeat_at)::float8 AS age,"
                " s.endpoint, count(s.id) AS slots"
                " FROM llmitm_fleet_proxies p LEFT JOIN llmitm_fleet_slots s ON s.proxy = p.id"
                " GROUP BY p.id, s.endpoint ORDER BY p.started_at, p.id"
            )
        members: dict[str, Member] = {}
        for row in rows:
            member = members.setdefault(
                row["id"],
                Member(row["id"], row["host"], row["pid"], row["alive"], row["age"], {}),
            )
            if row["endpoint"] is not None:
                member.slots[row["endpoint"]] = row["slots"]
        return list(members.values())

    async def slots_held(self) -> int:
        async with self._call(), self._conn() as conn:
            held: int = await conn.fetchval(
                "SELECT count(*) FROM llmitm_fleet_slots s"
                " JOIN llmitm_fleet_proxies p ON p.id = s.proxy WHERE p.expires_at > now()"
            )
        return held

    # --- slots ------------------------------------------------------------------------------

    async def take(self, slots: Sequence[Slot]) -> dict[str, bool]:
        # In the order of their endpoints: every batch takes the per-endpoint locks in the
        # same order, so two batches never wait for each other in a circle.
        ordered = sorted(slots, key=lambda s: s.endpoint)
        async with self._call(), self._conn() as conn:
            taken = await self._take(conn, ordered)
            if any(t < 0 for t in taken.values()):  # swept while its link was down: join
                await self._join(conn, ())  # again, then try once more
                taken = await self._take(conn, ordered)
        return {slot_id: t > 0 for slot_id, t in taken.items()}

    async def _take(self, conn: asyncpg.Connection, slots: Sequence[Slot]) -> dict[str, int]:
        args: list[Any] = [
            self.proxy,
            [s.id for s in slots],
            [s.endpoint for s in slots],
            [s.model for s in slots],
            [s.cap for s in slots],
            [s.model_cap for s in slots],
        ]
        sql = _TAKE
        if any(s.pin is not None for s in slots):
            sql = _TAKE_AND_PIN
            args += [
                [None if s.pin is None else s.pin.kind for s in slots],
                [None if s.pin is None else _key(s.pin.key) for s in slots],
                [None if s.pin is None else s.pin.ttl for s in slots],
            ]
        rows = await conn.fetch(sql, *args)
        return {row["id"]: row["taken"] for row in rows}

    async def release(self, slots: Sequence[Slot]) -> None:
        if not slots:
            return
        async with self._call(), self._conn() as conn:
            await conn.execute(
                "SELECT llmitm_fleet_release(id, cap, model_cap)"
                " FROM unnest($1::text[], $2::integer[], $3::integer[]) AS r (id, cap, model_cap)",
                [s.id for s in slots],
                [s.cap for s in slots],
                [s.model_cap for s in slots],
            )

    # --- cooldowns and pins -----------------------------------------------------------------

    async def cool(self, cooldown: Cooldown) -> None:
        async with self._call(), self._conn() as conn:
            await conn.execute(
                "WITH up AS ("
                " INSERT INTO llmitm_fleet_cooldowns AS c (endpoint, model, until, reason)"
                " VALUES ($1, $2, now() + make_interval(secs => $3), $4)"
                " ON CONFLICT (endpoint, model) DO UPDATE"
                " SET until = greatest(c.until, excluded.until),"
                " reason = CASE WHEN excluded.until > c.until THEN excluded.reason"
                " ELSE c.reason END"
                " RETURNING endpoint, model, until, reason)"
                " SELECT pg_notify($5, json_build_object('kind', 'cool', 'endpoint', endpoint,"
                " 'model', nullif(model, ''), 'reason', reason,"
                " 'remaining', extract(epoch FROM until - now())::float8)::text) FROM up",
                cooldown.endpoint,
                cooldown.model or "",
                cooldown.remaining,
                cooldown.reason,
                CHANNEL,
            )

    async def cooldowns(self) -> list[Cooldown]:
        async with self._call(), self._conn() as conn:
            rows = await conn.fetch(
                "SELECT endpoint, nullif(model, '') AS model, reason,"
                " extract(epoch FROM until - now())::float8 AS remaining"
                " FROM llmitm_fleet_cooldowns WHERE until > now()"
            )
        return [Cooldown(r["endpoint"], r["model"], r["remaining"], r["reason"]) for r in rows]

    async def pin(self, pins: Sequence[Pin]) -> None:
        latest = {(p.kind, p.key): p for p in pins}  # one row may not be upserted twice
        if not latest:
            return
        async with self._call(), self._conn() as conn:
            await conn.execute(
                "INSERT INTO llmitm_fleet_pins (kind, key, endpoint, expires_at)"
                " SELECT kind, key, endpoint, now() + make_interval(secs => ttl)"
                " FROM unnest($1::text[], $2::text[], $3::text[], $4::float8[])"
                " AS p (kind, key, endpoint, ttl)"
                " ON CONFLICT (kind, key) DO UPDATE"
                " SET endpoint = excluded.endpoint, expires_at = excluded.expires_at",
                [p.kind for p in latest.values()],
                [_key(p.key) for p in latest.values()],
                [p.endpoint for p in latest.values()],
                [p.ttl for p in latest.values()],
            )

    async def pinned(self, asked: Sequence[tuple[str | None, str | None]]) -> list[dict[str, str]]:
        if not asked:
            return []
        async with self._call(), self._conn() as conn:
            rows = await conn.fetch(
                "SELECT q.n, p.kind, p.endpoint"
                " FROM unnest($1::text[], $2::text[])"
                " WITH ORDINALITY AS q (response, conversation, n)"
                " JOIN llmitm_fleet_pins p ON ((p.kind = 'response' AND p.key = q.response)"
                " OR (p.kind = 'conversation' AND p.key = q.conversation))"
                " AND p.expires_at > now()",
                [None if response is None else _key(response) for response, _ in asked],
                [None if conversation is None else _key(conversation) for _, conversation in asked],
            )
        answers: list[dict[str, str]] = [{} for _ in asked]
        for row in rows:
            answers[row["n"] - 1][row["kind"]] = row["endpoint"]
        return answers

    # --- plumbing ---------------------------------------------------------------------------

    @asynccontextmanager
    async def _conn(self) -> AsyncIterator[asyncpg.Connection]:
        if self._pool is None:
            raise FleetUnavailable("the fleet state is not open")
        async with self._pool.acquire() as conn:
            yield conn

    @asynccontextmanager
    async def _call(self, timeout: float | None = None) -> AsyncIterator[None]:
        """Bound a call by the timeout, and make every way it can fail one exception."""
        try:
            async with asyncio.timeout(timeout or self.timeout):
                yield
        except FleetUnavailable:
            raise
        except _FAILURES as exc:
            raise FleetUnavailable(str(exc) or type(exc).__name__) from exc


_FREE_ANY = '{"kind": "free", "endpoint": null}'


async def _keep_session(_conn: asyncpg.Connection) -> None:
    """A connection goes back to the pool as it is: every call is one statement that leaves
    no session state behind (its advisory lock ends with it), and asyncpg's default reset
    would cost each call a second round trip."""


def _key(key: str) -> str:
    """A pin's key as stored: a digest (a conversation key holds NUL separators, which a
    PostgreSQL text value cannot, and the table needs no readable keys)."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


async def _migrate(conn: asyncpg.Connection) -> None:
    """Apply the fleet's schema steps not applied yet, once across proxies starting together."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", SCHEMA_LOCK)
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS llmitm_fleet_schema (version integer PRIMARY KEY,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        current = await conn.fetchval("SELECT coalesce(max(version), 0) FROM llmitm_fleet_schema")
        for version, sql in MIGRATIONS:
            if version > current:
                await conn.execute(sql)
                await conn.execute("INSERT INTO llmitm_fleet_schema (version) VALUES ($1)", version)
