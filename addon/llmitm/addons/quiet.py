"""``llmitm_quiet``: mitmproxy's own info lines (each client and server connection, the
listening line) left out of the log, while llmitm's lines, warnings and errors stay.

``llmitm run`` sets it (and ``flow_detail=0`` for the per-flow lines) unless ``-v`` asks for
mitmproxy's connection log. mitmdump's ``-q`` is no substitute: it hides llmitm's lines too.
"""

from __future__ import annotations

import logging
from collections.abc import Set

from mitmproxy import ctx
from mitmproxy.addonmanager import Loader

# The logger every mitmproxy module logs under (``mitmproxy.proxy.server``, …).
MITMPROXY_LOGGER = "mitmproxy"


class LlmQuiet:
    """Option ``llmitm_quiet``."""

    name = "llmitm_quiet"

    def load(self, loader: Loader) -> None:
        loader.add_option(
            "llmitm_quiet",
            bool,
            False,
            "Leave mitmproxy's own info lines (connections, listening) out of the log; "
            "llmitm's lines, warnings and errors stay.",
        )

    def configure(self, updated: Set[str]) -> None:
        if "llmitm_quiet" in updated:
            level = logging.WARNING if ctx.options.llmitm_quiet else logging.NOTSET
            logging.getLogger(MITMPROXY_LOGGER).setLevel(level)
