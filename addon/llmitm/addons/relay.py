"""The relay's lifecycle inside mitmproxy: llmitm's loopback server, started in ``running``
(the returned task is awaited by mitmproxy, so no flow arrives before it listens) and closed
in ``done``. Other addons register jobs with :attr:`LlmRelay.server` and re-point their flows
at the URL it returns: one relay per process serves every kind of job (paced replays,
failover, WebSocket sessions), because mitmproxy sends a response an addon makes in one
piece and only a real upstream can stream one. When a pointed flow ends (``response`` or
``error``: answered, answered locally, aborted by its client, killed), its registration is
forgotten, so one that was never used does not keep its job, and the request it holds, alive.

The relay's own upstream connections verify TLS like mitmproxy does: certifi, or the bundle
of ``ssl_verify_upstream_trusted_ca``; ``ssl_insecure`` turns verification off.
"""

from __future__ import annotations

import asyncio
import logging
import ssl

import certifi
from mitmproxy import ctx, http

from llmitm.relay.server import RelayServer

logger = logging.getLogger(__name__)

RELAY_URL_KEY = "llmitm_relay_url"
"""``flow.metadata`` key: the relay URL the flow was pointed at (forgotten when it ends)."""


def tls_context() -> ssl.SSLContext:
    """The context for the relay's upstream TLS, from mitmproxy's own options."""
    if ctx.options.ssl_insecure:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    cafile = ctx.options.ssl_verify_upstream_trusted_ca or certifi.where()
    context = ssl.create_default_context(cafile=cafile)
    if ctx.options.ssl_verify_upstream_trusted_confdir:
        context.load_verify_locations(capath=ctx.options.ssl_verify_upstream_trusted_confdir)
    return context


class LlmRelay:
    name = "llmitm_relay"

    def __init__(self) -> None:
        self.server: RelayServer | None = None
        """The listening server; ``None`` before ``running`` has started it and after ``done``."""
        self._starting: asyncio.Task[None] | None = None

    def running(self) -> asyncio.Task[None] | None:
        if self.server is not None:
            return None
        server = RelayServer()
        try:
            server.tls_context = tls_context()
        except (OSError, ssl.SSLError) as exc:
            logger.error("llmitm: relay: cannot set up upstream TLS verification: %s", exc)
        self._starting = asyncio.get_running_loop().create_task(
            self._start(server), name="llmitm relay start"
        )
        return self._starting

    async def _start(self, server: RelayServer) -> None:
        try:
            await server.start()
        except OSError as exc:
            logger.error("llmitm: cannot start the relay: %s", exc)
            return
        self.server = server

    def listening(self) -> RelayServer | None:
        """The running server, ``None`` while it is not listening (never waits)."""
        return self.server

    async def ready(self) -> RelayServer:
        """The listening server, waiting for start-up if a flow arrives during it."""
        if self.server is None and self._starting is not None:
            await asyncio.shield(self._starting)
        if self.server is None:
            raise RuntimeError("llmitm's relay is not running")
        return self.server

    def point(self, flow: http.HTTPFlow, url: str) -> None:
        """Send ``flow`` to the relay at ``url`` (straight there, also in upstream mode)."""
        previous = flow.metadata.get(RELAY_URL_KEY)
        if previous is not None and previous != url:
            self._forget(previous)  # re-pointed: the first registration will not be used
        flow.metadata[RELAY_URL_KEY] = url
        flow.request.url = url
        flow.server_conn.via = None

    def response(self, flow: http.HTTPFlow) -> None:
        self._flow_ended(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        self._flow_ended(flow)

    def _flow_ended(self, flow: http.HTTPFlow) -> None:
        # Used or not: forgetting a used token is a no-op, so no need to know which.
        url = flow.metadata.pop(RELAY_URL_KEY, None)
        if url is not None:
            self._forget(url)

    def _forget(self, url: str) -> None:
        if self.server is not None:
            self.server.forget(url)

    def done(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.close()
