"""A raw HTTP/1.1 connection to the relay, as mitmproxy holds one: requests one after another on
the same socket, each answer read by its framing (never until close, since the relay keeps the
connection open for the next request)."""

from __future__ import annotations

import asyncio

import h11


class RelayConnection:
    """One connection to the relay; :meth:`post` sends a request and reads its whole answer."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self._h11 = h11.Connection(h11.CLIENT)

    @classmethod
    async def open(cls, url: str) -> RelayConnection:
        host, port = url.split("/")[2].split(":")
        return cls(*await asyncio.open_connection(host, int(port)))

    async def send(self, url: str, body: bytes = b"", close: bool = False) -> None:
        """Send a POST to the relay URL's path, with ``body`` (mitmproxy sends the flow's)."""
        if self._h11.our_state is h11.DONE:
            self._h11.start_next_cycle()
        headers = [("host", url.split("/")[2]), ("content-length", str(len(body)))]
        if close:
            headers.append(("connection", "close"))
        path = "/" + url.split("/", 3)[3]
        data = self._h11.send(h11.Request(method="POST", target=path, headers=headers))
        data += self._h11.send(h11.Data(data=body)) if body else b""
        data += self._h11.send(h11.EndOfMessage())
        self.writer.write(data)
        await self.writer.drain()

    async def answer(self) -> tuple[int, dict[str, str], bytes]:
        """Status, headers (lower-case names) and the de-framed body of the next answer;
        ``AssertionError`` if the relay closes before the body's framed end."""
        status, headers, body = 0, {}, bytearray()
        while True:
            event = self._h11.next_event()
            if event is h11.NEED_DATA:
                self._h11.receive_data(await self.reader.read(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
                headers = {k.decode(): v.decode("latin-1") for k, v in event.headers}
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                return status, headers, bytes(body)
            else:
                raise AssertionError(f"the relay's answer did not end framed: {event!r}")

    async def post(
        self, url: str, body: bytes = b"", close: bool = False
    ) -> tuple[int, dict[str, str], bytes]:
        await self.send(url, body, close)
        return await self.answer()

    async def closed_by_relay(self, timeout: float = 5.0) -> bool:
        """Whether the relay closes the connection (end of stream) within ``timeout``."""
        try:
            return await asyncio.wait_for(self.reader.read(1), timeout) == b""
        except TimeoutError:
            return False

    def close(self) -> None:
        self.writer.close()


async def fetch(url: str, body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    """One request on a connection of its own."""
    connection = await RelayConnection.open(url)
    try:
        return await connection.post(url, body)
    finally:
        connection.close()
