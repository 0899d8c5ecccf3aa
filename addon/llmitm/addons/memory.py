"""Give memory back after flows: their reference cycles when the proxy goes idle, and the
heap to the system after a flow that made it grow a lot (a huge event).

mitmproxy's objects of a flow refer to each other (its HTTP stream's state is a bound method
of itself), so an ended flow, its bodies and whatever hangs on it are freed only by a full
pass of Python's cycle collector, which a proxy that handled a burst of flows may not run for
a long while: after waves of 200 streams with 256 KiB prompts the resident size wandered
between 160 and 280 MB with nothing held. So once no flow is open, :data:`TRIM_DELAY_S`
after one ended, this addon runs a full collection: with llmitm's start-up objects frozen
out of it (:mod:`.gc_freeze`) it visits what the flows left, 22–28 ms for some 33,000 objects
after each wave of 200 streams in ``tests/e2e/test_relay_load.py``, at a moment no request
waits for it (one that arrives meanwhile waits that long). It does so once the flows ended
since the last collection are :data:`COLLECT_AFTER_FLOWS` or carried
:data:`COLLECT_AFTER_MB` of bodies, or the resident size grew by :data:`GROWTH_MB`: a pass
visits every object the proxy holds, the history an agent's conversation keeps among them, so
one after every turn cost that turn more the longer the conversation (0.24 ms at turn 2,
0.6 ms at turn 50 in ``scripts/bench_conversation.py``), for the cycles of one flow. A proxy
that always has a flow open leaves it to Python's own collector.

glibc keeps freed memory in its heap and, after each large free, raises the size from which
it maps allocations on their own, so the memory of a 20 MiB event that was freed stays in the
process: RSS climbs wave after wave of huge flows, then stays there, although nothing leaked.
``malloc_trim`` returns the free pages at once. This addon calls it when the resident size
has grown by :data:`GROWTH_MB` since the last call: half a second after a flow ends it reads
``/proc`` once (for all the flows that ended meanwhile); nothing per chunk. Over seven waves
of 20 MiB events RSS stayed at 147–209 MiB instead of 188–269, at no cost in time; a fixed
``MALLOC_MMAP_THRESHOLD_`` or ``MALLOC_TRIM_THRESHOLD_`` kept it at 168–189 but made each
huge event 10–30 % slower (every large allocation a fresh mapping), so ``llmitm run`` sets
neither (``scripts/bench_big_event.py --waves 7``).

Neither runs between a request's last byte and its answer: each takes the event loop for a
few milliseconds (a trim ~4 ms of CPU after 5 MB requests), and an agent sends its next turn
soon after the last one ended — in ``scripts/bench_big_request.py`` about every other 5 MB
request met the trim of the one before on its way upstream. So the look waits while a flow is
open (its request seen, its response or error not yet, mitmproxy not done with it),
:data:`TRIM_DELAY_S` at a time, at most :data:`TRIM_WAIT_S` in all: a proxy that always has a
stream open still trims (but does not collect).

Option ``llmitm_malloc_trim`` (on by default) turns both off; where the C library has no
``malloc_trim`` (not glibc) only the collection runs.

glibc also gives each thread that allocates while another does a heap of its own (an
"arena", up to eight per core). The record builder's thread builds a stream's record from
its legs once the stream ends, so a burst of streams ending together had it take fresh pages
in its own heap while the main heap held the pages those streams had just freed: with 64
recorded streams ending together the proxy's peak grew ~18 KiB a stream more than without
(``scripts/bench_big_request.py --skip-big``). So when this addon loads, before llmitm starts
a thread, :func:`cap_malloc_arenas` keeps glibc to one heap for the process. Python's own
small objects never reach malloc, and llmitm's threads run Python under the GIL most of the
time, so they seldom wait for each other's allocations there. Where ``MALLOC_ARENA_MAX`` is
set in the environment, glibc has its value, and this leaves it so.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import os
import time
import weakref
from collections.abc import Callable, Set

from mitmproxy import ctx, http
from mitmproxy.addonmanager import Loader

logger = logging.getLogger(__name__)

GROWTH_MB = 64
"""Growth of the resident size since the last trim that makes the next one worth its time."""
COLLECT_AFTER_FLOWS = 16
"""Flows ended since the last collection that make the next one worth its time."""
COLLECT_AFTER_MB = 8
"""Request and response bodies (MiB, as mitmproxy held them) of the flows ended since the
last collection that make the next one worth its time: what waits for a collection is
bounded by this much, or by the flows of a burst that fit under it."""
TRIM_DELAY_S = 0.5
"""How long after a flow's end the resident size is looked at (one look for all the flows
that end meanwhile)."""
TRIM_WAIT_S = 10.0
"""The longest the look waits for the proxy to have no flow open."""
_PAGE_MB = os.sysconf("SC_PAGE_SIZE") / (1 << 20) if hasattr(os, "sysconf") else 0.0
_M_ARENA_MAX = -8
"""glibc's ``mallopt`` parameter for the most heaps (arenas) its threads may use."""


def _libc_trim() -> Callable[[int], int] | None:
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def cap_malloc_arenas() -> bool:
    """Keep glibc to one heap for the whole process (see the module's text); ``False`` where
    the C library is not glibc or ``MALLOC_ARENA_MAX`` already decides."""
    if "MALLOC_ARENA_MAX" in os.environ or not _glibc():
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_ARENA_MAX, 1))


def _glibc() -> bool:
    try:
        return bool(os.confstr("CS_GNU_LIBC_VERSION"))
    except (AttributeError, ValueError, OSError):
        return False


def resident_mb() -> float | None:
    """This process's resident size (``None`` where ``/proc`` has no ``statm``)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE_MB
    except (OSError, ValueError, IndexError):
        return None


class LlmMemoryTrim:
    name = "llmitm_memory_trim"

    def __init__(self) -> None:
        self._enabled = False
        self._trim: Callable[[int], int] | None = None
        self._baseline: float | None = None
        self._pending: asyncio.TimerHandle | None = None
        self._ended_flows = 0
        self._ended_bytes = 0
        """Flows ended since the last collection, and their bodies' bytes."""
        self._due = 0.0
        """When the pending look stops waiting for open flows (monotonic)."""
        # Flows whose request came and whose response or error has not: weak, so a flow
        # mitmproxy drops without either hook does not hold a trim off.
        self._open: weakref.WeakSet[http.HTTPFlow] = weakref.WeakSet()
        self._collection_due = False
        """Written on the event loop, read by the record builder (:meth:`collection_due`)."""

    def load(self, loader: Loader) -> None:
        # Now: llmitm's threads (the store's, the relay's, the record builder's) start later.
        cap_malloc_arenas()
        loader.add_option(
            "llmitm_malloc_trim",
            bool,
            True,
            "Give memory back after flows: collect their reference cycles once no flow is "
            "open, and return freed heap memory to the system after flows that grew the "
            "proxy's resident size a lot (huge events); glibc keeps it otherwise.",
        )

    def configure(self, updated: Set[str]) -> None:
        if "llmitm_malloc_trim" in updated:
            self._read_option()

    def running(self) -> None:
        # An option left at its default is never "updated": read it once the proxy runs.
        self._read_option()

    def _read_option(self) -> None:
        self._enabled = ctx.options.llmitm_malloc_trim
        self._trim = _libc_trim() if self._enabled else None
        self._baseline = resident_mb() if self._trim is not None else None

    def collection_due(self) -> bool:
        """Whether a collection of what ended flows left is coming: flows enough ended, none
        is open, and the look is pending (a flag, read from the record builder's thread)."""
        return self._collection_due

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if self._enabled:
            self._open.add(flow)
            self._collection_due = False  # the collection waits for this flow's end

    def response(self, flow: http.HTTPFlow) -> None:
        self._ended(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        self._ended(flow)

    def _ended(self, flow: http.HTTPFlow) -> None:
        self._open.discard(flow)
        if not self._enabled:
            return
        self._ended_flows += 1
        self._ended_bytes += _body_bytes(flow)
        self._collection_due = not self._open and self._worth_collecting()
        if self._pending is not None:
            return
        # After the hooks: the flow's bodies are only freed once mitmproxy has let go of it.
        self._due = time.monotonic() + TRIM_WAIT_S
        self._pending = asyncio.get_running_loop().call_later(TRIM_DELAY_S, self._check)

    def done(self) -> None:
        self._collection_due = False
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None

    def _check(self) -> None:
        self._pending = None
        self._collection_due = False
        if not self._enabled:
            return
        idle = not any(flow.live for flow in self._open)
        if not idle and time.monotonic() < self._due:
            # A request on its way (or a stream): look again once it may have ended.
            self._pending = asyncio.get_running_loop().call_later(TRIM_DELAY_S, self._check)
            return
        rss, baseline = resident_mb(), self._baseline
        grown = rss is not None and baseline is not None and rss >= baseline + GROWTH_MB
        if idle and (grown or self._worth_collecting()):
            self._ended_flows = self._ended_bytes = 0
            gc.collect()
        if self._trim is None or not grown:
            return
        self._trim(0)
        after = resident_mb()
        logger.debug("llmitm: malloc_trim: resident %.0f → %s MiB", rss, after)
        self._baseline = after if after is not None else rss

    def _worth_collecting(self) -> bool:
        return (
            self._ended_flows >= COLLECT_AFTER_FLOWS or self._ended_bytes >= COLLECT_AFTER_MB << 20
        )


def _body_bytes(flow: http.HTTPFlow) -> int:
    """The bytes of ``flow``'s request and response bodies held in full (a streamed body is
    not: it went through)."""
    held = len(flow.request.raw_content or b"")
    if flow.response is not None:
        held += len(flow.response.raw_content or b"")
    return held
