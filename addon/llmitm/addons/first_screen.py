"""``llmitm_first_screen``: once the proxy listens, a few lines saying where, with what
configuration, store and CA, and how to point an SDK, an app or a command at it
(``view.first_screen`` writes them; this addon gathers the facts).

In mitmdump the lines are printed to its output as they are, without the log's timestamps
(``llmitm run -- CMD`` sends that output to stderr); in mitmproxy's UIs they go to the event
log. A ``termlog_verbosity`` above info (``-q``) hides them like mitmdump's own lines, and a
master without a terminal log (llmitm inside a test process) shows none.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Set
from pathlib import Path

from mitmproxy import ctx
from mitmproxy.addonmanager import Loader

from llmitm import __version__
from llmitm.addons.patches.console_ui import front_end
from llmitm.addons.settings import LlmitmSettings
from llmitm.addons.store import LlmStore
from llmitm.view.first_screen import Listener, ScreenFacts, first_screen, listener_address

logger = logging.getLogger(__name__)

_ABOVE_INFO = ("warn", "error")


class LlmFirstScreen:
    """Options ``llmitm_first_screen`` and ``llmitm_wrapped``."""

    name = "llmitm_first_screen"

    def __init__(self, settings: LlmitmSettings, store: LlmStore) -> None:
        self.settings = settings
        self.store = store
        self.enabled = True
        self.wrapped = False
        self._shown = False

    def load(self, loader: Loader) -> None:
        loader.add_option(
            "llmitm_first_screen",
            bool,
            True,
            "Say once the proxy listens where it does, what it routes and records, and how "
            "to point a client at it.",
        )
        loader.add_option(
            "llmitm_wrapped",
            bool,
            False,
            "A command runs under this proxy with its variables set (llmitm run -- CMD sets "
            "this); the first screen says so.",
        )

    def configure(self, updated: Set[str]) -> None:
        if "llmitm_first_screen" in updated:
            self.enabled = ctx.options.llmitm_first_screen
        if "llmitm_wrapped" in updated:
            self.wrapped = ctx.options.llmitm_wrapped

    def running(self) -> None:
        if not self.enabled or self._shown:
            return
        self._shown = True
        if front_end(ctx.master) is not None:
            for line in first_screen(self.facts()):
                logger.info("%s", line)
            return
        # A master without a terminal log (llmitm in a test process) has no one to tell.
        if "termlog_verbosity" not in ctx.options:
            return
        if ctx.options.termlog_verbosity in _ABOVE_INFO:
            return
        print("\n".join(first_screen(self.facts())), file=sys.stdout, flush=True)

    def facts(self) -> ScreenFacts:
        """What is true now: the listeners bound, the configuration and store in use."""
        proxyserver = ctx.master.addons.get("proxyserver")
        listeners = tuple(
            Listener(
                kind=server.mode.type_name,
                spec=server.mode.full_spec,
                address=listener_address(server.listen_addrs),
            )
            for server in proxyserver.servers
        )
        config = self.settings.config
        store = self.store.location()
        confdir = Path(os.path.expanduser(ctx.options.confdir))
        return ScreenFacts(
            version=__version__,
            listeners=listeners,
            config=ctx.options.llmitm_config or None,
            endpoints=tuple(config.endpoints),
            routes=tuple(
                route.name or f"routes[{index}]" for index, route in enumerate(config.routes)
            ),
            store=str(store) if store is not None else None,
            record_mode=ctx.options.llmitm_record,
            recordings=ctx.options.llmitm_recordings,
            ca_file=str(confdir / "mitmproxy-ca-cert.pem"),
            wrapped=self.wrapped,
        )
