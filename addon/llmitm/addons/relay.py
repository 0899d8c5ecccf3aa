"""The relay's lifecycle inside mitmproxy: llmitm's loopback server, started in ``running``
(the returned task is awaited by mitmproxy, so no flow arrives before it listens) and closed
in ``done``. Other addons register jobs with :attr:`LlmRelay.server` and re-point their flows
at the URL it returns: one relay per process serves every kind of job (paced replays,
failover, WebSocket sessions), because mitmproxy sends a response an addon makes in one
piece and only a real upstream can stream one. When a pointed flow ends (``response`` or
``error``: answered, answered locally, aborted by its client, killed), its registration is
forgotten, so one that was never used does not keep its job, and the request it holds, alive.

The relay's upstream connections follow mitmproxy's options, read once in ``configure`` and
handed down as plain :class:`~llmitm.relay.client.UpstreamSettings`: TLS verified against
certifi or the bundle of ``ssl_verify_upstream_trusted_ca`` (and ``_confdir``), not at all
with ``ssl_insecure``; the ``client_certs`` file, or a folder's ``<host>.pem``; HTTP/2 unless
``http2`` is off; and in ``upstream:`` mode, through that proxy (``upstream_auth`` too).

mitmproxy reaches the relay in memory (:mod:`llmitm.addons.patches.relay_pipe`): no loopback
socket between the two, which run on one event loop; over TCP where that patch cannot apply.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from collections.abc import Set
from pathlib import Path

import certifi
from mitmproxy import ctx, http
from mitmproxy.addonmanager import Loader
from mitmproxy.proxy import mode_specs

from llmitm.addons.patches import relay_pipe
from llmitm.relay.client import UpstreamProxy, UpstreamSettings
from llmitm.relay.server import RelayServer

logger = logging.getLogger(__name__)

RELAY_URL_KEY = "llmitm_relay_url"
"""``flow.metadata`` key: the relay URL the flow was pointed at (forgotten when it ends)."""


_UPSTREAM_OPTIONS = frozenset(
    {
        "ssl_insecure",
        "ssl_verify_upstream_trusted_ca",
        "ssl_verify_upstream_trusted_confdir",
        "client_certs",
        "http2",
        "mode",
        "upstream_auth",
    }
)


def tls_context(client_cert: str | None = None) -> ssl.SSLContext:
    """The context for the relay's upstream TLS, from mitmproxy's own options."""
    if ctx.options.ssl_insecure:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        cafile = ctx.options.ssl_verify_upstream_trusted_ca or certifi.where()
        context = ssl.create_default_context(cafile=cafile)
        if ctx.options.ssl_verify_upstream_trusted_confdir:
            context.load_verify_locations(capath=ctx.options.ssl_verify_upstream_trusted_confdir)
    if client_cert is not None:
        context.load_cert_chain(client_cert)  # one PEM with the certificate and its key
    return context


def upstream_settings() -> UpstreamSettings:
    """mitmproxy's options as the relay's plain settings (``OSError``/``SSLError`` when a
    file they name is missing or unreadable)."""
    certs = os.path.expanduser(ctx.options.client_certs) if ctx.options.client_certs else None
    host_tls: dict[str, ssl.SSLContext] = {}
    if certs is not None and os.path.isdir(certs):
        # mitmproxy picks ``<host>.pem`` from a folder per server: so does the relay.
        host_tls = {pem.stem: tls_context(str(pem)) for pem in Path(certs).glob("*.pem")}
        certs = None
    return UpstreamSettings(
        tls_context=tls_context(certs),
        host_tls=host_tls,
        proxy=upstream_proxy(),
        http2=ctx.options.http2,
    )


def upstream_proxy() -> UpstreamProxy | None:
    """The proxy of the first ``upstream:`` mode, if mitmproxy runs one."""
    for spec in ctx.options.mode:
        try:
            mode = mode_specs.ProxyMode.parse(spec)
        except ValueError:
            continue  # mitmproxy's own check says what is wrong with it
        if isinstance(mode, mode_specs.UpstreamMode):
            host, port = mode.address
            auth = None
            if ctx.options.upstream_auth and ":" in ctx.options.upstream_auth:
                user, _, password = ctx.options.upstream_auth.partition(":")
                auth = (user, password)
            return UpstreamProxy(f"{mode.scheme}://{host}:{port}", auth)
    return None


class LlmRelay:
    name = "llmitm_relay"

    def __init__(self) -> None:
        self.server: RelayServer | None = None
        """The listening server; ``None`` before ``running`` has started it and after ``done``."""
        self._starting: asyncio.Task[None] | None = None
        self._upstream: UpstreamSettings | None = None

    def load(self, loader: Loader) -> None:
        # mitmproxy sets the root logger to DEBUG and formats every record, and httpcore (the
        # relay's upstream client) traces each step of every request at debug level: about
        # eight records per relayed request, each formatted and handed to mitmproxy's log
        # handlers, on the request path of every failover flow.
        logging.getLogger("httpcore").setLevel(logging.INFO)

    def configure(self, updated: Set[str]) -> None:
        if not updated & _UPSTREAM_OPTIONS:
            return
        try:
            self._upstream = upstream_settings()
        except (OSError, ssl.SSLError) as exc:
            logger.error("llmitm: relay: cannot set up upstream TLS: %s", exc)
            return
        if self.server is not None:
            self.server.reconfigure(self._upstream)

    def running(self) -> asyncio.Task[None] | None:
        if self.server is not None:
            return None
        server = RelayServer(upstream=self._upstream)
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
        # mitmproxy's connections to it are in memory, not loopback TCP, where the patch holds.
        relay_pipe.serve(server.address, server.connect)

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
            relay_pipe.stop(server.address)
            server.close()
