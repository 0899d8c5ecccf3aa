"""Send streamed create calls through llmitm's loopback relay (see :mod:`llmitm.relay`).

The router has already pointed the flow at its upstream; this addon registers that request
with the relay and points the flow at the relay instead, so the stream's end — clean or cut —
is always seen by the flow's stream callable. The relay's upstream TLS follows mitmproxy's own
options (``ssl_insecure``, ``ssl_verify_upstream_trusted_ca``), with certifi's roots otherwise.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Set

import certifi
from mitmproxy import ctx, http

from llmitm.addons.state import METADATA_KEY, FlowState
from llmitm.relay.client import UpstreamRequest
from llmitm.relay.server import RelayServer

logger = logging.getLogger(__name__)


def upstream_tls_context() -> ssl.SSLContext:
    """Verification as mitmproxy itself would do it for this upstream."""
    trusted = ctx.options.ssl_verify_upstream_trusted_ca
    context = ssl.create_default_context(cafile=trusted or certifi.where())
    if ctx.options.ssl_insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


class LlmRelay:
    name = "llmitm_relay"

    def __init__(self) -> None:
        self.server = RelayServer()
        self._starting: asyncio.Task[None] | None = None

    def configure(self, updated: Set[str]) -> None:
        if updated & {"ssl_insecure", "ssl_verify_upstream_trusted_ca"}:
            self.server.tls_context = upstream_tls_context()

    def running(self) -> None:
        # Sync on purpose: an async running() breaks mitmproxy's -s hot reload.
        self._starting = asyncio.get_running_loop().create_task(self.server.start())

    def done(self) -> None:
        self.server.close()

    async def request(self, flow: http.HTTPFlow) -> None:
        state: FlowState | None = flow.metadata.get(METADATA_KEY)
        if state is None or flow.response is not None or not state.client_stream:
            return
        await self.server.ready()
        request = flow.request
        job = UpstreamRequest(
            method=request.method,
            url=request.url,
            headers=list(request.headers.items(multi=True)),
            body=request.get_content(strict=False) or b"",
        )
        state.upstream_url = request.url
        request.url = self.server.register(job)
        # In upstream-proxy mode the flow would otherwise be sent to the proxy, not to us.
        flow.server_conn.via = None
