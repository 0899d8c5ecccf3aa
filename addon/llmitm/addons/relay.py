"""``llmitm_relay``: owns llmitm's one loopback relay server (``llmitm.relay``).

Started in ``running`` (the returned task is awaited by mitmproxy's master, so flows find it
listening), closed in ``done``. Other addons register jobs with :attr:`LlmRelay.server` and
re-point a flow at the URL they get back.
"""

from __future__ import annotations

import asyncio

from llmitm.relay.server import RelayServer


class LlmRelay:
    name = "llmitm_relay"

    def __init__(self) -> None:
        self.server: RelayServer | None = None
        self._starting: asyncio.Task[None] | None = None

    def running(self) -> asyncio.Task[None] | None:
        if self.server is not None:
            return None
        self.server = RelayServer()
        self._starting = asyncio.get_running_loop().create_task(
            self.server.start(), name="llmitm relay start"
        )
        return self._starting

    async def ready(self) -> RelayServer:
        """The listening server (waits for start-up if a flow arrives during it)."""
        if self.server is None:
            raise RuntimeError("the relay is not running")
        await self.server.ready()
        return self.server

    def done(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.close()
