"""The only code that imports mitmproxy: small addons in dataflow order."""

from __future__ import annotations

from llmitm.addons.listenfile import ListenFile
from llmitm.addons.relay import LlmRelay
from llmitm.addons.responses import LlmResponses
from llmitm.addons.router import LlmRouter
from llmitm.addons.settings import LlmitmSettings
from llmitm.addons.store import LlmStore
from llmitm.addons.usage import LlmUsage


def make_addons() -> list[object]:
    """llmitm's addons, in the order a flow meets them."""
    settings = LlmitmSettings()
    store = LlmStore(settings)  # opened in running, before the listen file says "ready"
    relay = LlmRelay()  # started in running: failover goes through it
    # LlmUsage reads a non-streamed body before LlmResponses translates it.
    return [
        settings,
        store,
        relay,
        LlmRouter(settings, relay),
        LlmUsage(store),
        LlmResponses(),
        ListenFile(),
    ]
