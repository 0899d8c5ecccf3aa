"""The relay server: mitmproxy sends a registered flow's request here and the registered job
answers it — forwarding upstream (:class:`~llmitm.relay.jobs.UpstreamJob`) or any other job
that writes a response — always ending its own body cleanly.

Bound to 127.0.0.1 on a random port; each request carries a one-use token in its path, so
nothing but the flows llmitm registered can use it. A registration lives until its request
arrives or its flow ends without sending it (``forget``, from the relay addon's flow-end
hooks): :meth:`RelayServer.stats` counts both, for ``GET /_llmitm/status``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets

import h11

from llmitm.relay.client import UpstreamClient, UpstreamRequest, UpstreamSettings
from llmitm.relay.jobs import RelayJob, RelayReply, SocketJob, UpstreamJob

logger = logging.getLogger(__name__)

PATH_PREFIX = "/llmitm-relay/"
MAX_HEAD_BYTES = 1 << 20
"""The largest request head the relay reads (h11's default, 16 KiB, is less than the client
headers mitmproxy takes and hands on); the router refuses larger ones before relaying."""


class RelayServer:
    """Register jobs, then serve each once to mitmproxy by token."""

    def __init__(
        self, *, connect_timeout: float = 30.0, upstream: UpstreamSettings | None = None
    ) -> None:
        self.connect_timeout = connect_timeout
        self.client = UpstreamClient(upstream)
        """Every job's upstream requests share its keep-alive pools."""
        self._jobs: dict[str, RelayJob | SocketJob] = {}
        self._connections = 0  # relay connections being served now
        self._server: asyncio.Server | None = None
        self._ready = asyncio.Event()
        self._closing: set[asyncio.Task[None]] = set()
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()

    async def ready(self) -> None:
        await self._ready.wait()

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self._close_client(self.client)

    def reconfigure(self, upstream: UpstreamSettings) -> None:
        """Use ``upstream`` from now on; requests under way finish on the old pools."""
        old, self.client = self.client, UpstreamClient(upstream)
        self._close_client(old, busy=False)

    def _close_client(self, client: UpstreamClient, *, busy: bool = True) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop: nothing was ever opened on one
        task = loop.create_task(client.aclose(busy=busy), name="llmitm relay pools close")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def register(self, job: RelayJob | SocketJob | UpstreamRequest) -> str:
        """The relay URL that serves ``job`` once (a bare request is forwarded upstream)."""
        if isinstance(job, UpstreamRequest):
            job = UpstreamJob(job, self.client, self.connect_timeout)
        token = secrets.token_urlsafe(18)
        self._jobs[token] = job
        return f"http://127.0.0.1:{self.port}{PATH_PREFIX}{token}"

    def forget(self, url: str) -> None:
        """Drop a registration that will not be used (the flow was answered otherwise)."""
        self._jobs.pop(url.rpartition("/")[2], None)

    def stats(self) -> dict[str, int]:
        """Registrations not yet used, and relay connections being served: both return to 0
        once every flow has ended; and upstream connections kept in the pools (at most the
        pool's keep-alive bound once every flow has ended)."""
        return {
            "registered": len(self._jobs),
            "connections": self._connections,
            "pooled": self.client.connections(),
        }

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        reply = RelayReply(writer)
        self._connections += 1
        try:
            job, headers = await self._read_job(reader)
            if job is None:
                await reply.error(404, "Unknown or used llmitm relay token.", code="not_found")
            elif isinstance(job, SocketJob):
                await job.serve_socket(headers, reader, writer)
            else:
                await _serve_until_abort(job, reply, reader)
                await reply.finish()
        except (ConnectionError, OSError):
            pass  # mitmproxy went away (the client aborted): nothing to answer
        except Exception:
            logger.exception("llmitm relay: unexpected failure")
            with contextlib.suppress(Exception):
                if not reply.started:
                    await reply.error(500, "llmitm's relay failed; see the proxy's log.")
        finally:
            self._connections -= 1
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _read_job(
        self, reader: asyncio.StreamReader
    ) -> tuple[RelayJob | SocketJob | None, list[tuple[bytes, bytes]]]:
        """The job the request's token names, and the request's headers."""
        connection = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                data = await reader.read(65536)
                if not data:
                    return None, []
                connection.receive_data(data)
                continue
            if isinstance(event, h11.Request):
                target = event.target.decode("latin-1")
                if target.startswith("http://"):
                    # Absolute form: mitmproxy in upstream mode writes its requests for a
                    # proxy, also the ones it sends straight here.
                    target = "/" + target.removeprefix("http://").partition("/")[2]
                if not target.startswith(PATH_PREFIX):
                    return None, []
                job = self._jobs.pop(target[len(PATH_PREFIX) :], None)
                headers = list(event.headers)
                # Read the body mitmproxy sends along (the job has its own): closing a socket
                # with unread data resets it, and mitmproxy would lose the answer.
                while job is not None:
                    event = connection.next_event()
                    if event is h11.NEED_DATA:
                        data = await reader.read(65536)
                        if not data:
                            return None, []
                        connection.receive_data(data)
                    elif isinstance(event, h11.EndOfMessage):
                        return job, headers
                    elif not isinstance(event, h11.Data):
                        return None, []
                return None, []
            return None, []


async def _serve_until_abort(
    job: RelayJob, reply: RelayReply, reader: asyncio.StreamReader
) -> None:
    """Serve ``job``; cancel it when mitmproxy closes the connection (the client went away),
    so a job waiting for an upstream, a backoff or a free slot lets go at once and its
    ``finally`` releases what it holds."""
    serving = asyncio.ensure_future(job.serve(reply))
    watching = asyncio.ensure_future(reader.read(1))
    try:
        await asyncio.wait({serving, watching}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watching.cancel()
        if watching.done() and not watching.cancelled():
            # A reset reads as an error here: retrieved, or asyncio logs it as an unhandled
            # task error (one traceback per client that aborted).
            watching.exception()
        if not serving.done():
            serving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await serving
            raise ConnectionResetError("mitmproxy closed the relay connection")
    serving.result()  # re-raise what the job raised
