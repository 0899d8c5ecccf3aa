"""mitmproxy's connections to llmitm's relay, in memory instead of over loopback TCP.

A failover route's flow is re-pointed at the relay (``addons.relay``), a server in this same
process and on this same event loop. mitmproxy opens its server connections in
``mitmproxy.proxy.server`` with ``asyncio.open_connection``; this patch gives that module an
``asyncio`` of its own whose ``open_connection``, for the relay's address only, returns one
end of an in-memory connection (:mod:`llmitm.relay.pipe`) whose other end the relay serves as
it serves a socket. Everything else about the connection is mitmproxy's: its hooks, its
keep-alive, its reads and writes. The relay still listens on 127.0.0.1 as before, so a
connection this patch does not catch (an address it was not told about) reaches it by TCP.

Why: each relayed request over loopback paid a ``send``, a ``recv`` and a poll of the loop in
each direction before its first byte reached the client, and each relayed read of a stream
one more of each (``docs/speed.md``, failover routes).

:func:`install` applies it once per process; when ``mitmproxy.proxy.server`` does not open
connections through its module-level ``asyncio`` as expected, it logs once and mitmproxy
reaches the relay over loopback TCP, as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any

from llmitm.addons.patches.fallback import degrade

try:
    import mitmproxy.proxy.server as _server
except ImportError as exc:  # moved in this mitmproxy
    _server = None
    MISSING: str | None = str(exc)
else:
    MISSING = None if hasattr(_server, "asyncio") else "mitmproxy.proxy.server.asyncio"

logger = logging.getLogger(__name__)

PATCH = "in-memory relay connections"

type Connect = Callable[[], tuple[asyncio.StreamReader, asyncio.StreamWriter]]

_served: dict[tuple[str, int], Connect] = {}
"""The addresses answered in memory, and how to open a connection to each."""


class _Asyncio(ModuleType):
    """``asyncio`` as ``mitmproxy.proxy.server`` sees it: itself, but for ``open_connection``
    to an address in :data:`_served`."""

    def __init__(self) -> None:
        super().__init__("asyncio")
        # Every other name is asyncio's own, looked up as fast as in asyncio itself.
        self.__dict__.update({k: v for k, v in vars(asyncio).items() if not k.startswith("__")})
        self.__dict__["open_connection"] = self._open_connection

    @staticmethod
    async def _open_connection(
        host: Any = None, port: Any = None, **kwargs: Any
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        connect = _served.get((host, port))
        if connect is not None:
            # Suspend once, as a socket's connect does: mitmproxy runs this eagerly inside its
            # event handling and registers the connection's task only after the first
            # suspension; returning at once would have that registration overwrite the one
            # this connection makes when it opens (and lose its writer).
            await asyncio.sleep(0)
            return connect()
        return await asyncio.open_connection(host, port, **kwargs)


_installed = False


def install() -> bool:
    """Route ``mitmproxy.proxy.server``'s connections to served addresses through memory;
    whether it could."""
    global _installed
    if MISSING is not None:
        degrade(PATCH, MISSING, "mitmproxy reaches llmitm's relay over loopback TCP")
        return False
    if not _installed:
        if _server.asyncio is not asyncio:  # someone else's: leave it
            degrade(PATCH, "its own asyncio", "mitmproxy reaches llmitm's relay over TCP")
            return False
        _server.asyncio = _Asyncio()  # type: ignore[attr-defined]
        _installed = True
    return True


def serve(address: tuple[str, int], connect: Connect) -> bool:
    """Answer mitmproxy's connections to ``address`` with ``connect()`` from now on (until
    :func:`stop`); whether the patch is in place to do so."""
    if not install():
        return False
    _served[address] = connect
    return True


def stop(address: tuple[str, int]) -> None:
    _served.pop(address, None)
