"""Keep the objects of start-up out of the garbage collector's full passes.

A running llmitm holds some 100k Python objects made at start-up (mitmproxy's and llmitm's
modules, the configuration, the routing tables) that live as long as the process. Every full
(generation 2) collection walks them all — ~60 ms on a busy 2-core machine — and the objects
of the flows that live a few seconds are what triggers those collections, so a share of each
event's cost went into walking start-up objects again (visible as large "own time" in
whichever function allocated when a collection ran). When the proxy is running this addon
calls ``gc.freeze()`` once: the objects alive then move to a permanent generation that no
collection walks. Reference counting still frees them; only a reference cycle among them
would never be collected, and start-up objects are not garbage. Option ``llmitm_gc_freeze``
(on by default) turns it off.
"""

from __future__ import annotations

import gc

from mitmproxy import ctx
from mitmproxy.addonmanager import Loader


class LlmGcFreeze:
    name = "llmitm_gc_freeze"

    def __init__(self) -> None:
        self.frozen = False

    def load(self, loader: Loader) -> None:
        loader.add_option(
            "llmitm_gc_freeze",
            bool,
            True,
            "Once the proxy runs, move the objects made at start-up out of the garbage "
            "collector's full passes (gc.freeze), which otherwise walk them again and again.",
        )

    def running(self) -> None:
        if ctx.options.llmitm_gc_freeze and not self.frozen:
            gc.collect()  # what start-up left as garbage goes now, not frozen forever
            gc.freeze()
            self.frozen = True
