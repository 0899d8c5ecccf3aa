"""The relay's socket job reassembles each client message from wsproto's pieces, however the
reads cut it, and hands the protocol its exact UTF-8 bytes."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from wsproto.connection import Connection, ConnectionType
from wsproto.events import TextMessage

from llmitm.relay.client import Proxy
from llmitm.relay.socket_job import ResponsesSocketJob, SocketOrigin


class Received:
    """Stands in for the protocol: keeps what it is given."""

    def __init__(self) -> None:
        self.messages: list[bytes | str] = []

    def receive_text(self, data: bytes | str) -> list[Any]:
        self.messages.append(data)
        return []


async def test_a_message_cut_across_reads_reaches_the_protocol_whole() -> None:
    # Characters of two, three and four bytes, so the reads cut inside some of them.
    history = [{"role": "user", "content": f"{n} don’t — “done” 🙂 é " * 400} for n in range(40)]
    messages = [
        orjson.dumps({"type": "response.create", "input": history[: n + 1]}) for n in (9, 39)
    ]
    client = Connection(ConnectionType.CLIENT)
    wire = b"".join(client.send(TextMessage(data=m.decode())) for m in messages)
    assert len(messages[-1]) > 4 * 65536  # several reads a message
    reader = asyncio.StreamReader()
    reader.feed_data(wire)
    reader.feed_eof()
    job = ResponsesSocketJob(SocketOrigin("http://x/v1/responses", [], Proxy("x", 1, False)))
    received = Received()
    job._socket = received  # type: ignore[assignment]
    await job._read_messages(reader)
    assert received.messages == messages
