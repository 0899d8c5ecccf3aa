"""A tiny HTTP proxy that counts what goes through it: CONNECT tunnels (each piped both ways
until either side closes) and plain forward requests (refused: nothing here needs them).
Loopback only, for tests of a client that must honour an upstream proxy."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator


class ConnectProxy:
    def __init__(self) -> None:
        self.tunnels: list[str] = []
        """The ``host:port`` of every CONNECT, in order."""
        self.refused = 0
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            method, target, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
            if method != "CONNECT":
                self.refused += 1
                writer.write(b"HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\n\r\n")
                return
            self.tunnels.append(target)
            host, _, port = target.rpartition(":")
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(host.strip("[]"), int(port)), 10
            )
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass
        finally:
            writer.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


@contextlib.contextmanager
def connect_proxy() -> Iterator[ConnectProxy]:
    """A :class:`ConnectProxy` on its own loop in a thread."""
    proxy = ConnectProxy()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="connect proxy", daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(proxy.start(), loop).result(10)
    try:
        yield proxy
    finally:
        asyncio.run_coroutine_threadsafe(proxy.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
