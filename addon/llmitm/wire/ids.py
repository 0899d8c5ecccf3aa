"""Id and clock injection.

Everything that mints an id or reads the clock takes an :data:`IdFactory` and a
:data:`Clock`, so tests can make output byte-for-byte reproducible.
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections.abc import Callable

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
