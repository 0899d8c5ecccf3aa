"""The console's live display: a rich ``Live`` with a panel per stream in flight, redrawn a
few times a second at most by one task on the event loop, and less often when drawing gets
expensive (drawing is kept to about 0.3% of a core). Summary lines printed while it runs go
above it with the next refresh; mitmdump's own log and flow lines are sent through rich's
stdout proxy so they print above it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from typing import Any

from rich.console import Group
from rich.live import Live

from llmitm.addons.patches.console_ui import redirect_output
from llmitm.view.live import StreamWatch
from llmitm.view.panels import layout, live_view

logger = logging.getLogger(__name__)

MIN_INTERVAL_S = 0.25
MAX_INTERVAL_S = 2.0
DRAW_BUDGET = 0.003
"""The share of one core the live display may spend drawing (and reading what it draws);
slower draws refresh less often: 64 streams' rows take ~6 ms, so a refresh every two seconds."""
_now = time.time  # mitmproxy's timestamps are epoch seconds


class LiveDisplay:
    """Panels for the streams in ``watches`` (the console's own dict, read at each tick)."""

    def __init__(self, out: Any, watches: dict[str, StreamWatch]) -> None:
        self.out = out
        self.watches = watches
        self._lines: list[Any] = []  # summary lines waiting for the next refresh
        self._live: Live | None = None
        self._task: asyncio.Task[None] | None = None
        self._restore: list[tuple[object, str, object]] = []

    def start(self, master: Any) -> None:
        self._live = Live(console=self.out, auto_refresh=False, redirect_stdout=True)
        self._live.start()
        self._restore += redirect_output(master, sys.stdout)
        self._task = asyncio.get_running_loop().create_task(self._refresh())

    def print(self, line: Any) -> None:
        # Printed with the next refresh: each print above a live display redraws it.
        self._lines.append(line)

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        for owner, attribute, value in reversed(self._restore):
            setattr(owner, attribute, value)
        self._restore.clear()
        self._flush_lines()
        if self._live is not None:
            with contextlib.suppress(Exception):
                self._live.update("", refresh=True)
                self._live.stop()
            self._live = None

    def _flush_lines(self) -> None:
        if self._lines:
            lines, self._lines = self._lines, []
            self.out.print(Group(*lines), soft_wrap=True, highlight=False)

    async def _refresh(self) -> None:
        # Every tick drains the watches (cheap, and chunks are not held longer than a tick);
        # drawing waits until its cost fits the budget.
        next_draw = 0.0
        shown = False
        drawing = True
        while True:
            await asyncio.sleep(MIN_INTERVAL_S)
            started = time.thread_time()
            now = _now()
            watches = list(self.watches.values())
            if not drawing or now < next_draw:
                for watch in watches:
                    watch.drain(now)
                if not drawing:
                    self._flush_lines()
                continue
            try:
                assert self._live is not None
                size = self._live.console.size
                panels, _lines = layout(len(watches), size.height)
                for index, watch in enumerate(watches):
                    if index < panels and not watch.full:
                        watch.promote(now)
                    elif index >= panels and watch.full:
                        watch.demote(now)  # more streams than panels now
                    else:
                        watch.drain(now)
                self._flush_lines()
                if not watches and not shown:
                    continue
                self._live.update(live_view(watches, now, size.width, size.height), refresh=True)
                shown = bool(watches)
            except Exception:
                logger.exception("llmitm console: drawing failed; only summary lines from now")
                drawing = False
                continue
            cost = time.thread_time() - started
            next_draw = now + min(MAX_INTERVAL_S, max(MIN_INTERVAL_S, cost / DRAW_BUDGET))
