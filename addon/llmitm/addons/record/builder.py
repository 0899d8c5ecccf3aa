"""Builds records off the event loop: the CPU-heavy half of recording, after the flow ended.

Redacting a request, computing its match key and redacting every leg cost about as much as
parsing each body a few times — hundreds of milliseconds for a request of a few MB, which
agents send on every turn. Done in a hook, that is time the client waits (the ``response``
hook runs before the answer is sent) and time every other flow's events wait. So the record
tap hands each finished flow's plain values here, one worker thread builds the
:class:`~llmitm.replay.model.Interaction`, and the result is delivered back on the event
loop, where the recorder queues it for the store. Nothing is written before it is redacted:
the worker only ever hands on redacted records.

Started after the answer: the tap submits a build from the flow's ``response`` hook, which
mitmproxy runs before it writes the answer (a non-streamed body, a stream's end) to the
client, in the same step of the event loop. A worker that started at once took the GIL from
that step, and a CPU from the client reading its answer (on a 2-core machine running the
client too, a 5 MB request's answer reached it ~20 ms later with recording on than off): so
a build reaches the worker from the loop's next step (:meth:`RecordBuilder._hand_over`),
once the answer is written, and starts :data:`GRACE_S` after its flow ended — a build that
waited that long behind others starts at once, so the worker keeps its pace under load.

Paced by the store: a record holds its request bodies in full (its streams compressed as
the store keeps them) until the store's writer has written it — so the worker
builds the next record only once fewer than :data:`STORE_AHEAD` writes wait for the store
(or :data:`PACE_S` has passed), and many streams ending at once do not all sit in memory
uncompressed. Bounded: with :data:`BACKLOG` builds waiting, a new one runs inline in the
hook, and without a running loop (a hook called from a test) every build does.
:meth:`RecordBuilder.flush` (shutdown) waits for the worker — which then waits for the
store no more — and delivers what it built, before the recordings folder is written and the
store closes.

Paced by the proxy's collection after a burst: when many flows end together and none is
left open, the proxy collects what they left (:class:`~llmitm.addons.memory.LlmMemoryTrim`,
within half a second), and the worker waits for that collection before it builds. Built
before it, the records took fresh memory while the ended flows still held theirs: with 64
recorded streams of 100 events ending together the burst's peak RSS grew 74.6–82.7 KiB a
stream, against 72.0–72.5 with the builds after the collection (RSS sampled every 10 ms,
three runs each); with 64 streams of 1,000 events, 129.2 against 106.7 (one run each).
A flow ending alone is built at once, and a busy proxy, which does not collect while flows
are open, is not waited for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from llmitm.replay.model import Interaction

logger = logging.getLogger(__package__)

BACKLOG = 256
"""Builds waiting for the worker before new ones run inline (each holds its flow's bodies,
a stream's compressed)."""
STORE_AHEAD = 2
"""Writes the store may have waiting before the worker builds the next record. When records
waited with their bodies whole (~0.5 MB for a stream of 1,000 Responses events) and 64 such
streams ended together, the proxy's resident size jumped by ~115 KiB a stream with 8 here
and ~60 with 2, the peak of the whole burst (RSS sampled every 10 ms); a record's streams
now wait compressed, its request bodies whole."""
PACE_S = 2.0
"""The longest the worker waits for the store (or a collection) before building anyway."""
PACE_STEP_S = 0.005
GRACE_S = 0.05
"""How long after its flow ended a build may start: the client reads its answer first."""

Build = Callable[[], Interaction | None]


class RecordBuilder:
    """One worker thread running builds; their records delivered on the event loop."""

    def __init__(
        self,
        deliver: Callable[[Interaction], None],
        store_behind: Callable[[], int] = lambda: 0,
        collection_due: Callable[[], bool] = lambda: False,
    ) -> None:
        self.deliver = deliver
        self.store_behind = store_behind
        """How many writes wait for the store (read from the worker: an estimate is enough)."""
        self.collection_due = collection_due
        """Whether the proxy is about to collect what a burst of ended flows left (read from
        the worker, as ``store_behind``)."""
        self._closing = False
        self._executor: ThreadPoolExecutor | None = None
        self._built: deque[Interaction | None] = deque()
        self._pending: deque[tuple[Build, asyncio.AbstractEventLoop, float]] = deque()
        """Builds submitted in this step of the loop, for the worker in the next."""
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
        with self._lock:
            self._waiting += 1
        if not self._pending:
            loop.call_soon(self._hand_over)
        self._pending.append((build, loop, time.monotonic() + GRACE_S))

    def _hand_over(self) -> None:
        """The builds submitted in the loop's last step, to the worker."""
        if self._pending and self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="llmitm-record")
        while self._pending:
            self._executor.submit(self._work, *self._pending.popleft())  # type: ignore[union-attr]

    def flush(self) -> None:
        """Wait for every build submitted and deliver its record (at shutdown)."""
        self._hand_over()  # submitted in this step, without the loop running since
        executor, self._executor = self._executor, None
        if executor is not None:
            self._closing = True  # the store's writer cannot run while this waits
            executor.shutdown(wait=True)
            self._closing = False
        self._drain()

    @property
    def waiting(self) -> int:
        """Builds submitted and not delivered yet."""
        return self._waiting

    def _work(self, build: Build, loop: asyncio.AbstractEventLoop, start: float) -> None:
        early = start - time.monotonic()
        if early > 0 and not self._closing:
            time.sleep(early)
        waited = 0.0
        while not self._closing and waited < PACE_S and self._held_back():
            time.sleep(PACE_STEP_S)
            waited += PACE_STEP_S
        self._built.append(self._run(build))  # deque appends are atomic
        with contextlib.suppress(RuntimeError):  # the loop has closed: flush() delivers it
            loop.call_soon_threadsafe(self._drain)

    def _held_back(self) -> bool:
        return self.store_behind() >= STORE_AHEAD or self.collection_due()

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
