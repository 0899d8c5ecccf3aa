"""A background response: llmitm makes the upstream call itself, since no client waits.

The chat stream goes through the same :class:`ChatToResponsesStream` as a live flow, so the
events and ids are those a streaming client would have seen. The run renumbers them after
its own ``response.created``/``response.queued`` (status ``queued``), keeps them in memory
for live readers (:meth:`BackgroundRun.follow`) and hands each batch to ``record_events``
(the store, for resume after the run or a restart); ``record_state`` gets the Response
object at each status change. Cancelling the task closes the upstream connection.

No network code here: ``open_upstream`` returns an object with ``status`` and
``relay_body(write, drain)`` (:class:`llmitm.relay.client.UpstreamResponse`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import orjson

from llmitm.responses_api.answers import TERMINAL_STATUSES
from llmitm.translate.context import TranslationContext
from llmitm.translate.error_bodies import translate_error_body
from llmitm.translate.stream_to_responses import ChatToResponsesStream
from llmitm.wire.errors import ApiError, normalise_error
from llmitm.wire.sse import DONE_DATA, SSEDecoder

logger = logging.getLogger(__name__)


class UpstreamBody(Protocol):
    status: int

    async def relay_body(
        self, write: Callable[[list[bytes]], None], drain: Callable[[], Awaitable[None]]
    ) -> None: ...


def frame(event: dict[str, Any]) -> bytes:
    """One Responses SSE frame."""
    return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


class BackgroundRun:
    """One background response from ``queued`` to a terminal status."""

    def __init__(
        self,
        response: dict[str, Any],
        context: TranslationContext,
        *,
        record_events: Callable[[list[tuple[int, bytes]]], None],
        record_state: Callable[[dict[str, Any]], None],
    ) -> None:
        self.response = dict(response, status="queued", background=True)
        self.context = context
        self.frames: list[bytes] = []
        self._record_events = record_events
        self._record_state = record_state
        self._changed = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self._emit(
            [
                {"type": "response.created", "response": dict(self.response)},
                {"type": "response.queued", "response": dict(self.response)},
            ]
        )

    @property
    def id(self) -> str:
        return str(self.response["id"])

    @property
    def finished(self) -> bool:
        return self.response.get("status") in TERMINAL_STATUSES

    def start(self, open_upstream: Callable[[], Awaitable[UpstreamBody]]) -> asyncio.Task[None]:
        self.task = asyncio.get_running_loop().create_task(
            self._run(open_upstream), name=f"llmitm background {self.id}"
        )
        return self.task

    def cancel(self) -> None:
        """Stop the upstream call; the response ends ``cancelled``."""
        if self.finished:
            return
        self._end("cancelled")
        if self.task is not None:
            self.task.cancel()

    def abandon(self, message: str) -> None:
        """llmitm is stopping: the response ends ``failed`` rather than in_progress forever,
        with a ``response.failed`` event that ends the stream of whoever follows it (on any
        proxy sharing the store)."""
        if self.finished:
            return
        error = {"code": "server_error", "message": message}
        self._emit([{"type": "response.failed", "response": failed(self.response, error)}])
        self._end("failed", error)
        if self.task is not None:
            self.task.cancel()

    def lose(self) -> None:
        """Another proxy ended this run as stale (this one failed to renew its lease in
        time): stop it without a further write, the store's state is theirs now."""
        if self.finished:
            return
        self._record_state = self._record_events = _nothing
        self.response = dict(self.response, status="failed")
        self._changed.set()
        if self.task is not None:
            self.task.cancel()

    async def follow(self, after: int = -1) -> AsyncIterator[bytes]:
        """The frames with ``sequence_number > after``, then each new one until the end."""
        position = max(after, -1) + 1  # a negative position would index from the end
        while True:
            while position < len(self.frames):
                yield self.frames[position]
                position += 1
            if self.finished:
                return
            self._changed.clear()
            await self._changed.wait()

    # -- the run --------------------------------------------------------------------------

    async def _run(self, open_upstream: Callable[[], Awaitable[UpstreamBody]]) -> None:
        translator = ChatToResponsesStream(self.context)
        try:
            translator.start()  # its created/in_progress: ours (status queued) came first
            self._set_status("in_progress")
            try:
                upstream = await open_upstream()
            except Exception as exc:
                self._translated(translator.fail(_unreachable(exc)))
                return
            if upstream.status >= 400:
                await self._upstream_error(upstream, translator)
                return
            decoder = SSEDecoder()

            def write(pieces: list[bytes]) -> None:
                for piece in pieces:
                    self._translated(_translate(translator, decoder.feed(piece)))

            async def drain() -> None:
                return None

            try:
                await upstream.relay_body(write, drain)
            except Exception as exc:  # a cut upstream: the translator's close() says so
                logger.warning("llmitm: background %s: upstream ended early: %s", self.id, exc)
            self._translated(_translate(translator, decoder.close()) + translator.close())
        except asyncio.CancelledError:
            self._end("cancelled")  # no-op when cancel() or abandon() already ended it
        except Exception:
            logger.exception("llmitm: background response %s failed", self.id)
            self._end("failed", {"code": "server_error", "message": "llmitm's run failed."})

    async def _upstream_error(
        self, upstream: UpstreamBody, translator: ChatToResponsesStream
    ) -> None:
        pieces: list[bytes] = []

        async def drain() -> None:
            return None

        with contextlib.suppress(Exception):
            await upstream.relay_body(pieces.extend, drain)
        status, body = translate_error_body(b"".join(pieces), upstream.status, "responses")
        self._translated(translator.fail(normalise_error(body, status)))

    def _translated(self, events: list[dict[str, Any]]) -> None:
        if self.finished or not events:
            return
        terminal = None
        for event in events:
            if event["type"] in ("response.completed", "response.incomplete", "response.failed"):
                # One created_at for the whole life of the response: the queued one's.
                event["response"]["created_at"] = self.response["created_at"]
                terminal = event["response"]
        self._emit(events)
        if terminal is not None:
            self.response = terminal
            self._record_state(self.response)

    def _emit(self, events: list[dict[str, Any]]) -> None:
        batch = []
        for event in events:
            event["sequence_number"] = len(self.frames)
            data = frame(event)
            batch.append((len(self.frames), data))
            self.frames.append(data)
        self._record_events(batch)
        self._changed.set()

    def _set_status(self, status: str) -> None:
        self.response = dict(self.response, status=status)
        self._emit([{"type": "response.in_progress", "response": dict(self.response)}])
        self._record_state(self.response)

    def _end(self, status: str, error: dict[str, Any] | None = None) -> None:
        if self.finished:
            return
        self.response = dict(self.response, status=status, error=error)
        self._record_state(self.response)
        self._changed.set()


def failed(response: dict[str, Any], error: dict[str, Any]) -> dict[str, Any]:
    """The Response object of a run that ended failed with ``error``."""
    return dict(response, status="failed", error=error)


def _nothing(_value: Any) -> None:
    return None


def _translate(translator: ChatToResponsesStream, events: list[tuple[str | None, bytes]]) -> list:
    out: list[dict[str, Any]] = []
    for _name, data in events:
        if data == DONE_DATA:
            out += translator.done()
            continue
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            chunk = None
        if not isinstance(chunk, dict):
            out += translator.fail(
                ApiError(
                    message="The upstream sent a malformed stream event.",
                    code="server_error",
                    status=502,
                )
            )
            continue
        out += translator.feed(chunk)
    return out


def _unreachable(exc: Exception) -> ApiError:
    return ApiError(
        message=f"llmitm could not reach the upstream: {exc}",
        type="server_error",
        code="server_error",
        status=502,
    )
