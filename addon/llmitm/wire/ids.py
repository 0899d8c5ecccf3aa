"""Id and clock injection.

Everything that mints an id or reads the clock takes an :data:`IdFactory` and a
:data:`Clock`, so tests can make output byte-for-byte reproducible, and a :class:`Mint`
lets a replay hand out exactly what the recorded exchange was handed.
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections import deque
from collections.abc import Callable
from typing import Any

IdFactory = Callable[[str], str]
"""Returns a fresh id for a prefix such as ``"resp"``, ``"msg"`` or ``"call"``."""

Clock = Callable[[], float]
"""Returns the current time in seconds since the epoch."""


def random_id(prefix: str) -> str:
    """An id shaped like OpenAI's: prefix, underscore, 48 hex digits."""
    return f"{prefix}_{secrets.token_hex(24)}"


def system_clock() -> float:
    return time.time()


class CountingIds:
    """Deterministic ids for tests and replay: ``resp_0001``, ``msg_0002``, …"""

    def __init__(self, start: int = 1) -> None:
        self._counter = itertools.count(start)

    def __call__(self, prefix: str) -> str:
        return f"{prefix}_{next(self._counter):04d}"


def fixed_clock(at: float) -> Clock:
    """A clock frozen at ``at``."""
    return lambda: at


class Mint:
    """One exchange's ids, clock readings and other minted values, noted as handed out.

    Recording keeps :attr:`tape` with the interaction; a replay seeds a new ``Mint`` with it
    and gets the same values back in the same order per kind (an id's prefix, ``clock``,
    ``sealed``…), so today's translator re-makes the recorded answer byte for byte. Past the
    recorded values (the translator now mints more), values are fresh again."""

    __slots__ = ("_recorded", "_replay", "_replayed", "tape")

    def __init__(self, recorded: dict[str, list[Any]] | None = None) -> None:
        self.tape: dict[str, list[Any]] = {}
        self._recorded = recorded
        self._replay = {kind: deque(values) for kind, values in (recorded or {}).items()}
        self._replayed: set[str] = set()

    def take(self, kind: str, make: Callable[[], Any]) -> Any:
        """The next recorded value of ``kind``, else ``make()``; noted either way."""
        queue = self._replay.get(kind)
        if queue:
            value = queue.popleft()
            if isinstance(value, str):
                self._replayed.add(value)
        else:
            value = make()
        self.tape.setdefault(kind, []).append(value)
        return value

    def id(self, prefix: str) -> str:
        """An :data:`IdFactory`."""
        return self.take(prefix, lambda: random_id(prefix))

    def now(self) -> float:
        """A :data:`Clock`."""
        return self.take("clock", system_clock)

    def marked(self, marker: str) -> bool:
        """Whether this exchange takes a way of making values that older recordings did not:
        a recording takes it and notes ``marker`` on its tape; a replay takes it only when its
        recording noted it, so one made before hands out its values as it was handed them."""
        if self._recorded is not None and marker not in self._recorded:
            return False
        self.tape[marker] = [True]
        return True

    def replayed(self, value: str) -> bool:
        """``value`` came from the recording (not made fresh)."""
        return value in self._replayed
