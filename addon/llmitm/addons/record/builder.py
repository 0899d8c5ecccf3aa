"""Builds records off the event loop: the CPU-heavy half of recording, after the flow ended.

Redacting a request, computing its match key and redacting every leg cost about as much as
parsing each body a few times — hundreds of milliseconds for a request of a few MB, which
agents send on every turn. Done in a hook, that is time the client waits (the ``response``
hook runs before the answer is sent) and time every other flow's events wait. So the record
tap hands each finished flow's plain values here, one worker thread builds the
:class:`~llmitm.replay.model.Interaction`, and the result is delivered back on the event
loop, where the recorder queues it for the store. Nothing is written before it is redacted:
the worker only ever hands on redacted records.

Bounded: with :data:`BACKLOG` builds waiting, a new one runs inline in the hook (the
backlog's bodies are memory held), and without a running loop (a hook called from a test)
every build does. :meth:`RecordBuilder.flush` (shutdown) waits for the worker and delivers
what it built, before the recordings folder is written and the store closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from llmitm.replay.model import Interaction

logger = logging.getLogger(__package__)

BACKLOG = 32
"""Builds waiting for the worker before new ones run inline (each holds its flow's bodies)."""

Build = Callable[[], Interaction | None]


class RecordBuilder:
    """One worker thread running builds; their records delivered on the event loop."""

    def __init__(self, deliver: Callable[[Interaction], None]) -> None:
        self.deliver = deliver
        self._executor: ThreadPoolExecutor | None = None
        self._built: deque[Interaction | None] = deque()
        self._waiting = 0
        self._lock = threading.Lock()

    def submit(self, build: Build) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None or self._waiting >= BACKLOG:
            self._deliver(self._run(build))
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="llmitm-record")
        with self._lock:
            self._waiting += 1
        self._executor.submit(self._work, build, loop)

    def flush(self) -> None:
        """Wait for every build submitted and deliver its record (at shutdown)."""
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)
        self._drain()

    @property
    def waiting(self) -> int:
        """Builds submitted and not delivered yet."""
        return self._waiting

    def _work(self, build: Build, loop: asyncio.AbstractEventLoop) -> None:
        self._built.append(self._run(build))  # deque appends are atomic
        with contextlib.suppress(RuntimeError):  # the loop has closed: flush() delivers it
            loop.call_soon_threadsafe(self._drain)

    def _run(self, build: Build) -> Interaction | None:
        try:
            return build()
        except Exception:  # recording must never cost the proxy its work
            logger.exception("llmitm: cannot record a flow")
            return None

    def _drain(self) -> None:
        built = self._built
        while built:
            interaction = built.popleft()
            with self._lock:
                self._waiting -= 1
            self._deliver(interaction)

    def _deliver(self, interaction: Interaction | None) -> None:
        if interaction is not None:
            self.deliver(interaction)
