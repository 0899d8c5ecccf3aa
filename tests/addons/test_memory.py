"""Memory given back after flows: the heap trimmed once the resident size has grown by
GROWTH_MB since the last trim, once for all the flows that ended meanwhile; the ended flows'
reference cycles collected once no flow is open and enough ended (in number or body bytes)
or the heap grew; neither with the option off."""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import weakref
from collections.abc import Iterator

import pytest
from mitmproxy.test import taddons, tflow

from llmitm.addons import memory


class FakeHeap:
    def __init__(self, resident: float) -> None:
        self.resident = resident
        self.trims = 0

    def trim(self, _pad: int) -> int:
        self.trims += 1
        self.resident -= 100
        return 1


@pytest.fixture
def heap(monkeypatch: pytest.MonkeyPatch) -> FakeHeap:
    fake = FakeHeap(100.0)
    monkeypatch.setattr(memory, "_libc_trim", lambda: fake.trim)
    monkeypatch.setattr(memory, "resident_mb", lambda: fake.resident)
    monkeypatch.setattr(memory, "TRIM_DELAY_S", 0.01)
    return fake


class Cycle:
    """Garbage only the cycle collector frees, as an ended flow of mitmproxy's is."""

    def __init__(self) -> None:
        self.itself = self


class CountedCollections:
    """The addon's calls of the cycle collector, counted and passed on. Counted here rather
    than seen in what survives: anything else in the test process may collect meanwhile."""

    def __init__(self) -> None:
        self.calls = 0

    def collect(self) -> int:
        self.calls += 1
        return gc.collect()


@pytest.fixture
def counted_gc(monkeypatch: pytest.MonkeyPatch) -> Iterator[CountedCollections]:
    counted = CountedCollections()
    monkeypatch.setattr(memory, "gc", counted)
    gc.collect()
    gc.disable()  # only an explicit collection frees the test's cycles
    yield counted
    gc.enable()


@pytest.fixture
def trimming(heap: FakeHeap) -> Iterator[memory.LlmMemoryTrim]:
    """The addon, on, over the fake heap (inside a mitmproxy test context)."""
    addon = memory.LlmMemoryTrim()
    with taddons.context(addon) as tctx:
        tctx.configure(addon, llmitm_malloc_trim=True)
        yield addon


async def ended(addon: memory.LlmMemoryTrim, flows: int) -> None:
    for _ in range(flows):
        addon.response(tflow.tflow(resp=True))
    await asyncio.sleep(0.05)


async def test_it_trims_once_the_heap_grew_by_growth_mb(
    heap: FakeHeap, trimming: memory.LlmMemoryTrim
) -> None:
    heap.resident += memory.GROWTH_MB - 1
    await ended(trimming, 3)
    assert heap.trims == 0  # grown, but not by enough
    heap.resident += 1
    await ended(trimming, 3)
    assert heap.trims == 1  # one look for the three flows
    # The baseline is the trimmed size now: it takes another GROWTH_MB to trim again.
    heap.resident += memory.GROWTH_MB - 1
    await ended(trimming, 1)
    assert heap.trims == 1
    heap.resident += 1
    trimming.error(tflow.tflow(err=True))
    await asyncio.sleep(0.05)
    assert heap.trims == 2


async def test_the_option_off_never_trims_or_collects(
    heap: FakeHeap, counted_gc: CountedCollections
) -> None:
    addon = memory.LlmMemoryTrim()
    with taddons.context(addon) as tctx:
        tctx.configure(addon, llmitm_malloc_trim=False)
        heap.resident += 10 * memory.GROWTH_MB
        await ended(addon, 2)
        assert heap.trims == 0
        assert counted_gc.calls == 0


def test_the_real_trim_and_resident_size_are_there_on_linux() -> None:
    assert memory._libc_trim() is not None
    resident = memory.resident_mb()
    assert resident is not None and resident > 1


async def test_no_trim_while_a_request_is_on_its_way(
    heap: FakeHeap, trimming: memory.LlmMemoryTrim
) -> None:
    heap.resident += memory.GROWTH_MB
    arriving = tflow.tflow()
    trimming.requestheaders(arriving)  # the next turn, sent as the last one ended
    await ended(trimming, 1)
    await asyncio.sleep(0.05)
    assert heap.trims == 0  # held while the request is open
    trimming.response(arriving)  # its answer is out: the trim may run now
    await asyncio.sleep(0.05)
    assert heap.trims == 1


async def test_a_flow_open_for_long_holds_the_trim_off_for_trim_wait_s_only(
    heap: FakeHeap,
    counted_gc: CountedCollections,
    trimming: memory.LlmMemoryTrim,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(memory, "TRIM_WAIT_S", 0.2)
    heap.resident += memory.GROWTH_MB
    stream = tflow.tflow()
    trimming.requestheaders(stream)  # a stream that stays open
    await ended(trimming, 1)
    assert heap.trims == 0
    await asyncio.sleep(0.25)
    assert heap.trims == 1
    assert counted_gc.calls == 0  # trimmed around the open stream, not collected
    assert stream in trimming._open


async def test_once_no_flow_is_open_the_ended_flows_cycles_are_collected(
    heap: FakeHeap, counted_gc: CountedCollections, trimming: memory.LlmMemoryTrim
) -> None:
    stream = tflow.tflow()
    trimming.requestheaders(stream)
    garbage = weakref.ref(Cycle())
    await ended(trimming, memory.COLLECT_AFTER_FLOWS)
    assert counted_gc.calls == 0  # a stream is open: Python's collector's to do
    stream.live = False  # mitmproxy let it go without a response or error hook
    await asyncio.sleep(0.05)
    assert counted_gc.calls == 1
    assert garbage() is None
    assert heap.trims == 0  # nothing grew: the collection does not trim


async def test_a_few_small_flows_wait_for_the_next_collection(
    counted_gc: CountedCollections, trimming: memory.LlmMemoryTrim
) -> None:
    # An agent's turn at a time: collecting after each visited the whole conversation.
    for _ in range(memory.COLLECT_AFTER_FLOWS - 1):
        await ended(trimming, 1)
    assert counted_gc.calls == 0
    await ended(trimming, 1)
    assert counted_gc.calls == 1
    await ended(trimming, memory.COLLECT_AFTER_FLOWS - 1)
    assert counted_gc.calls == 1  # counted again from the collection


async def test_flows_with_big_bodies_are_collected_at_once(
    counted_gc: CountedCollections, trimming: memory.LlmMemoryTrim
) -> None:
    big = tflow.tflow(resp=True)
    big.request.content = b"x" * (memory.COLLECT_AFTER_MB << 19)  # half of it
    big.response.content = b"y" * (memory.COLLECT_AFTER_MB << 19)
    trimming.response(big)
    await asyncio.sleep(0.05)
    assert counted_gc.calls == 1


async def test_a_heap_grown_by_growth_mb_is_collected_then_trimmed(
    heap: FakeHeap, counted_gc: CountedCollections, trimming: memory.LlmMemoryTrim
) -> None:
    heap.resident += memory.GROWTH_MB
    await ended(trimming, 1)
    assert (counted_gc.calls, heap.trims) == (1, 1)


# The heaps glibc gives a process whose second thread allocates, read from malloc_info's
# report in a fresh interpreter (a heap, once made, stays for the process).
HEAPS_AFTER_A_THREAD = """
import ctypes, os, re, sys, tempfile, threading
from mitmproxy.test import taddons
from llmitm.addons import memory

if sys.argv[1] == "addon":
    with taddons.context(memory.LlmMemoryTrim()):
        pass


def allocate() -> None:
    kept = [bytearray(50_000) for _ in range(20)]  # past pymalloc, under mmap's threshold
    del kept


thread = threading.Thread(target=allocate)
thread.start()
thread.join()
libc = ctypes.CDLL(None)
libc.fdopen.argtypes = [ctypes.c_int, ctypes.c_char_p]
libc.fdopen.restype = ctypes.c_void_p
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
with tempfile.TemporaryFile() as report:
    stream = libc.fdopen(os.dup(report.fileno()), b"w")
    libc.malloc_info(0, stream)
    libc.fclose(stream)
    report.seek(0)
    print(len(re.findall(rb"<heap nr=", report.read())))
"""


def heaps_after_a_thread(how: str, **env: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", HEAPS_AFTER_A_THREAD, how],
        env={**os.environ, **env},
        capture_output=True,
        check=True,
        timeout=60,
    )
    return int(done.stdout)


needs_glibc = pytest.mark.skipif(
    not memory._glibc(), reason="glibc's heaps (arenas) and malloc_info only"
)


@needs_glibc
def test_the_addon_keeps_glibc_to_one_heap_for_the_threads_started_after_it() -> None:
    # Without it, the thread's allocations took a heap of their own.
    assert heaps_after_a_thread("plain") == 2
    assert heaps_after_a_thread("addon") == 1


@needs_glibc
def test_malloc_arena_max_in_the_environment_decides_instead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert heaps_after_a_thread("addon", MALLOC_ARENA_MAX="4") == 2
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert memory.cap_malloc_arenas() is False


async def test_a_collection_is_due_from_a_bursts_end_until_it_runs(
    counted_gc: CountedCollections,
    trimming: memory.LlmMemoryTrim,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the record builder waits for after a burst: due once enough flows ended and none
    is open, not while one is, and no longer once the collection ran."""
    monkeypatch.setattr(memory, "TRIM_DELAY_S", 0.2)
    for _ in range(memory.COLLECT_AFTER_FLOWS - 1):
        trimming.response(tflow.tflow(resp=True))
    assert not trimming.collection_due()  # too few to collect for
    arriving = tflow.tflow(resp=True)
    trimming.requestheaders(arriving)
    trimming.response(tflow.tflow(resp=True))
    assert not trimming.collection_due()  # enough, but a flow is open
    trimming.response(arriving)
    assert trimming.collection_due()
    opening = tflow.tflow()
    trimming.requestheaders(opening)
    assert not trimming.collection_due()  # a new request: the collection waits for it
    await asyncio.sleep(0.3)
    assert counted_gc.calls == 0 and not trimming.collection_due()
    assert opening in trimming._open


async def test_the_collection_due_after_a_burst_runs_and_is_due_no_more(
    counted_gc: CountedCollections,
    trimming: memory.LlmMemoryTrim,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(memory, "TRIM_DELAY_S", 0.2)
    for _ in range(memory.COLLECT_AFTER_FLOWS):
        trimming.response(tflow.tflow(resp=True))
    assert trimming.collection_due()
    await asyncio.sleep(0.3)
    assert counted_gc.calls == 1 and not trimming.collection_due()


def test_the_proxys_record_builder_waits_for_its_memory_trim() -> None:
    from llmitm.addons import make_addons
    from llmitm.addons.record import LlmFlowRecorder

    addons = make_addons()
    (recorder,) = [addon for addon in addons if isinstance(addon, LlmFlowRecorder)]
    (trim,) = [addon for addon in addons if isinstance(addon, memory.LlmMemoryTrim)]
    assert recorder.builder.collection_due == trim.collection_due
