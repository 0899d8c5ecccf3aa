"""``llmitm_store``: the store's lifecycle inside mitmproxy.

The path is the option when set, else the configuration's ``[llmitm] store``, else the
user's data folder (``store.location``); ``""`` disables the store. Hooks stay sync so
``-s`` hot reload keeps working (an async ``running`` or ``done`` stops mitmproxy's script
watcher, and the old code keeps serving), yet nothing is lost at
start or exit: ``running`` and ``done`` *return* the task that opens or closes the store.
mitmproxy's master awaits an awaitable a hook returns, so at start-up flows wait for the
open and at shutdown (SIGINT, SIGTERM) the process exits only after every submitted write
is on disk; a hot reload, which calls the hooks synchronously, just schedules them.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Optional  # mitmproxy parses options typed exactly Optional[str]

from mitmproxy import ctx
from mitmproxy.addonmanager import Loader

from llmitm.addons.settings import LlmitmSettings
from llmitm.store import SqliteStore, Store, Write, default_store_path
from llmitm.store.fleet import is_shared

logger = logging.getLogger(__name__)

_PENDING_MAX = 1000


class LlmStore:
    name = "llmitm_store"

    def __init__(self, settings: LlmitmSettings) -> None:
        self.settings = settings
        self.store: Store | None = None
        self._opening: asyncio.Task[None] | None = None
        self._closing: asyncio.Task[None] | None = None
        self._pending: list[Write] = []

    def load(self, loader: Loader) -> None:
        # mitmproxy sets the root logger to DEBUG and formats every record (for its legacy
        # log events), and aiosqlite logs each statement at debug level with the repr of its
        # arguments: for a recorded stream that is a ~0.5 MB bytes repr, twice per statement,
        # plus a hook per record on the event loop — ~10 ms of CPU per flow for nothing.
        logging.getLogger("aiosqlite").setLevel(logging.INFO)
        loader.add_option(
            "llmitm_store",
            Optional[str],  # noqa: UP045
            None,
            "SQLite file for token usage (default: the config's llmitm.store, else "
            "$XDG_DATA_HOME/llmitm/llmitm.db); an empty value keeps no store.",
        )

    def path(self) -> Path | None:
        """Where the store lives now, ``None`` when it is disabled."""
        option = ctx.options.llmitm_store
        chosen = option if option is not None else self.settings.config.settings.store
        if chosen is None:
            return default_store_path()
        if is_shared(chosen):
            return None  # a database server: the fleet's routing state only, for now
        return Path(chosen).expanduser() if chosen else None

    def running(self) -> asyncio.Task[None] | None:
        path = self.path()
        if path is None or self.store is not None:
            return None
        self.store = SqliteStore(path)
        explicit = (
            ctx.options.llmitm_store is not None or self.settings.config.settings.store is not None
        )
        self._opening = asyncio.get_running_loop().create_task(
            self._open(self.store, explicit), name="llmitm store open"
        )
        return self._opening

    async def _open(self, store: Store, explicit: bool) -> None:
        try:
            await store.open()
        except Exception as exc:
            # A configured store that cannot open stops start-up (an error log makes mitmdump
            # exit 1); the default location failing only costs the accounting.
            (logger.error if explicit else logger.warning)(
                "llmitm: cannot open the store %s: %s", getattr(store, "path", store), exc
            )
            if self.store is store:
                self.store = None
            self._pending.clear()
            return
        pending, self._pending = self._pending, []
        for write in pending:
            store.submit(write)

    async def ready(self) -> Store | None:
        """The store once it is open (waiting while it opens), ``None`` when there is none."""
        opening = self._opening
        if opening is not None and not opening.done():
            await asyncio.shield(opening)
        return self.store

    def submit(self, write: Write) -> None:
        """Hand ``write`` to the store without waiting; a no-op when there is none."""
        store = self.store
        if store is None:
            return
        if self._opening is not None and not self._opening.done():
            if len(self._pending) < _PENDING_MAX:
                self._pending.append(write)
            return
        store.submit(write)

    def done(self) -> asyncio.Task[None] | None:
        store, self.store = self.store, None
        if store is None:
            return None
        self._closing = asyncio.get_running_loop().create_task(
            self._close(store, self._opening), name="llmitm store close"
        )
        return self._closing

    async def _close(self, store: Store, opening: asyncio.Task[None] | None) -> None:
        if opening is not None and not opening.done():
            await opening
        try:
            await store.close()
        except Exception:
            logger.exception("llmitm: failed to close the store")
            return
        stats = store.stats()
        if stats.dropped or stats.failed:
            logger.warning(
                "llmitm: store: %d write(s) dropped and %d failed of %d",
                stats.dropped,
                stats.failed,
                stats.submitted + stats.dropped,
            )
