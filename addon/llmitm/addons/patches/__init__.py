"""Every use of mitmproxy's internals, one module per patch: what llmitm changes or reads
inside mitmproxy beyond its public addon API, each behind a guarded import and a start-up
check that falls back to mitmproxy's public behaviour when the internal is not as expected.

:class:`LlmPatches` runs the start-up checks; the hosts of :mod:`llmitm.addons.hosts` call
:mod:`.master` while they build a master; the console's front-end check runs when it starts.
"""

from __future__ import annotations

from typing import Any

from mitmproxy import ctx
from mitmproxy.addonmanager import Loader

from llmitm.addons.patches import (
    connections,
    cut_streams,
    headers,
    hooks,
    layer_queues,
    options,
    relay_pipe,
    type_checks,
)


class LlmPatches:
    """Runs each patch's start-up check once: at ``load`` what needs only mitmproxy's code, at
    ``running`` what needs the master's servers. A failed check logs once and its patch's
    public fallback serves; nothing here stops llmitm from starting."""

    name = "llmitm_patches"

    def load(self, loader: Loader) -> None:
        cut_streams.install()
        hooks.install()
        layer_queues.install()
        options.install()
        relay_pipe.install()
        type_checks.install()
        headers.check()

    def running(self) -> None:
        master: Any = ctx.master
        connections.check(master)
