"""Keep Python's cyclic garbage collector off the objects that live as long as the proxy.

Every collection of the oldest generation visits every tracked object in the process —
mitmproxy's, its dependencies' and llmitm's modules, classes and configuration, a few hundred
thousand objects — and an agent's turn, whose request body parses into thousands of lists
and dicts that survive the turn's hooks, triggers such collections in proportion to its
size. The cost of a turn then grew with the history it resent times the size of the whole
heap: at turn 50 of an agent conversation the collector was a fifth of the proxy's CPU.

Once the proxy runs, :func:`gc.freeze` moves everything allocated so far into the permanent
generation, which collections never visit (what CPython's documentation recommends for a
long-running process after its start-up). Objects made later — flows, bodies, per-stream
state — are collected as before; only garbage cycles made during start-up, and never freed,
stay, which costs nothing that was not already held.

Once per process: a host that starts several proxies in one process (the pytest plugin's
in-process master) freezes at the first one's start, not again with each later proxy's
objects, which would then never be collected after that proxy stops.
"""

from __future__ import annotations

import gc
import logging

logger = logging.getLogger(__name__)

_frozen = False
"""Whether this process has frozen its start-up heap already."""


class LlmCollector:
    name = "llmitm_collector"

    def running(self) -> None:
        # After every addon's configure and running work before this one: the imports,
        # configuration and start-up state are in the heap by now.
        global _frozen
        if _frozen:
            return
        _frozen = True
        gc.collect()
        gc.freeze()
        logger.debug("llmitm: %d start-up objects frozen out of collection", gc.get_freeze_count())
