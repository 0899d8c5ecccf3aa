"""The only code that imports mitmproxy: small addons in dataflow order."""

from __future__ import annotations

from llmitm.addons.listenfile import ListenFile
from llmitm.addons.responses import LlmResponses
from llmitm.addons.router import LlmRouter
from llmitm.addons.settings import LlmitmSettings


def make_addons() -> list[object]:
    """llmitm's addons, in the order a flow meets them."""
    settings = LlmitmSettings()
    return [settings, LlmRouter(settings), LlmResponses(), ListenFile()]
