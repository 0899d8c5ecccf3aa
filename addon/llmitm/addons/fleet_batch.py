"""Calls to the fleet's shared state asked in one turn of the event loop, made as one.

A burst of requests asks the same kind of question many times at once (where does this
conversation live? remember who served it): each would cost a round trip, a pooled
connection and the driver's protocol work on the event loop. A :class:`TurnBatch` gathers the
questions asked before the loop's next turn and makes one call for all of them, and while that
call is out, gathers the next ones for the call after it (one call in flight at a time, as a
database groups commits): answers of a burst end at different moments, and this catches them
without a timer. Every caller gets its own answer, or ``None`` when the shared state did not
answer (it then decides alone, as with any call through the link). A question waits at most
for the call in flight and its own, each bounded by the link's timeout; one asked while none
is in flight waits one turn.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from llmitm.addons.fleet_link import FleetLink


class TurnBatch[Q, A]:
    """``call`` answers a list of questions with a list of answers, in the same order."""

    def __init__(
        self, link: FleetLink, call: Callable[[Sequence[Q]], Awaitable[Sequence[A]]], name: str
    ) -> None:
        self.link = link
        self.call = call
        self.name = name
        self._asked: list[tuple[Q, asyncio.Future[A | None]]] = []
        self._sending = False

    async def ask(self, question: Q) -> A | None:
        future: asyncio.Future[A | None] = asyncio.get_running_loop().create_future()
        self._asked.append((question, future))
        if not self._sending:
            self._sending = True
            self.link.spawn(self._send(), self.name)
        return await future

    async def _send(self) -> None:
        try:
            await asyncio.sleep(0)  # the rest of this turn's questions
            while self._asked:  # and those asked while the last call was out
                asked, self._asked = self._asked, []
                await self._call(asked)
        finally:
            self._sending = False

    async def _call(self, asked: list[tuple[Q, asyncio.Future[A | None]]]) -> None:
        questions = [question for question, _ in asked]
        answers: Sequence[A] | None = None
        try:
            answers = await self.link.call(lambda: self.call(questions))
            if answers is None:  # the link counted one decision taken alone; each caller's is
                self.link.fallbacks += len(asked) - 1
        finally:
            for n, (_, future) in enumerate(asked):
                if not future.done():  # a caller that went away wants nothing
                    future.set_result(None if answers is None else answers[n])
