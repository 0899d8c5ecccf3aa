"""One flow's connections, reached through the ``proxyserver`` addon's registry.

mitmproxy's public addon API hands an addon flows, not the sockets under them; llmitm needs the
client's ``StreamWriter`` (to batch its writes, :mod:`.coalesce`) and the connection handler
(to close a stalled upstream, :mod:`llmitm.addons.stall`). Both live in ``Proxyserver.connections``
and ``ConnectionHandler.transports``, which are mitmproxy internals. :func:`check` looks for them
once at start-up; when they are not there it logs once and every lookup answers ``None`` from
then on: streams go out unbatched and a stalled stream's flow is killed instead of having its
upstream closed (the client sees its connection close rather than an error event).
"""

from __future__ import annotations

import logging
from typing import Any

from mitmproxy import ctx, http

from llmitm.addons.patches.fallback import degrade


def _missing_from(handler: type) -> str | None:
    if not hasattr(handler, "close_connection"):
        return "ConnectionHandler.close_connection"
    if "transports" not in getattr(handler, "__annotations__", {}):
        return "ConnectionHandler.transports"
    return None


try:
    from mitmproxy.proxy.server import ConnectionHandler
except ImportError as exc:  # moved in this mitmproxy
    MISSING: str | None = str(exc)
else:
    MISSING = _missing_from(ConnectionHandler)

logger = logging.getLogger(__name__)

PATCH = "connection registry"

usable = MISSING is None
"""Whether the lookups below may try the registry (false after a failed :func:`check`)."""


def check(master: Any) -> bool:
    """The start-up check, once the servers exist: the registry is where llmitm looks."""
    global usable
    missing = MISSING
    if missing is None:
        registry = getattr(master.addons.get("proxyserver"), "connections", None)
        if not isinstance(registry, dict):
            missing = "the proxyserver addon's connections registry"
    usable = missing is None
    if not usable:
        degrade(
            PATCH,
            missing or "",
            "streamed events are written one by one and a stalled stream is killed "
            "(the client's connection closes) instead of ending with an error event",
        )
    return usable


def handler_of(flow: http.HTTPFlow) -> Any | None:
    """The connection handler serving ``flow``'s client, if the registry has it."""
    if not usable:
        return None
    try:
        proxyserver: Any = ctx.master.addons.get("proxyserver")
        return proxyserver.connections.get(flow.client_conn.id)
    except AttributeError:
        return None


def client_writer(flow: http.HTTPFlow) -> Any | None:
    """What mitmproxy writes ``flow``'s client bytes to (a ``StreamWriter`` for sockets)."""
    handler = handler_of(flow)
    try:
        return handler.transports[handler.client].writer if handler is not None else None
    except (AttributeError, KeyError):
        return None


def close_server_side(flow: http.HTTPFlow) -> bool:
    """Close ``flow``'s upstream connection, so mitmproxy sees its body end early; ``False``
    when the handler cannot be reached."""
    handler = handler_of(flow)
    if handler is None:
        return False
    try:
        handler.close_connection(flow.server_conn)
    except (AttributeError, KeyError, AssertionError):
        return False
    return True
