"""Plain local HTTP/1.1 servers for the upstream client's tests: a base that listens on a free
loopback port and counts the connections it accepted, and what each test answers with."""

from __future__ import annotations

import asyncio


class CountingServer:
    """Listens on ``127.0.0.1``; :meth:`serve` handles one accepted connection."""

    def __init__(self) -> None:
        self.connections = 0
        self.port = 0

    async def start(self) -> asyncio.Server:
        server = await asyncio.start_server(self._accepted, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        return server

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        await self.serve(reader, writer)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError
