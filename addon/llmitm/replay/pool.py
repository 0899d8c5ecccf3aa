"""Replay pools: ``{scope: {key: FIFO of interactions}}``, built once at start-up.

FIFO per key and no order across keys: retries and agent loops replay in recorded order,
concurrent requests with different keys never disturb each other, and scopes (one per test)
never share answers. One asyncio loop pops, so each pop is atomic.

A lookup returns a :class:`Hit`, or a :class:`Miss` that says why — no recording for this
key, or the key's recordings are all used (*exhausted*, with the count) — and names the
closest recording (same method and route first, then by similarity of canonical text).

What a hit on an exhausted key gets is the caller's policy (``llmitm_replay_exhausted``):
``error`` (the default: a miss, as strict CI wants), ``repeat_last`` (the key's last recording
again: a poll or health check that a test makes more often than when it was recorded) or
``cycle`` (the key's recordings again from the first, in order). A repeat never counts a
recording as used twice, and never hides one that was not used (``unused`` stays exact).
"""

from __future__ import annotations

import difflib
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal, get_args
from urllib.parse import quote, unquote

from llmitm.replay.keys import MatchKey
from llmitm.replay.model import Interaction

OnExhausted = Literal["error", "repeat_last", "cycle"]
ON_EXHAUSTED: tuple[str, ...] = get_args(OnExhausted)

GLOBAL_SCOPE = "global"
SCOPE_HEADERS = ("x-llmitm-scope", "x-test-id")
SCOPE_PREFIX = "/llmitm-scope/"
"""A base URL ``http://proxy/llmitm-scope/<quoted scope>/v1`` scopes an unmodified client:
``OPENAI_BASE_URL`` can carry it where a header cannot (the pytest plugin uses it)."""


def split_scope_path(path: str) -> tuple[str | None, str]:
    """``/llmitm-scope/a%2Fb/v1/x?q`` → ``("a/b", "/v1/x?q")``; other paths unchanged."""
    if not path.startswith(SCOPE_PREFIX):
        return None, path
    quoted, _, rest = path[len(SCOPE_PREFIX) :].partition("/")
    return unquote(quoted) or None, "/" + rest


def scope_path(scope: str) -> str:
    return SCOPE_PREFIX + quote(scope, safe="")


@dataclass(frozen=True, slots=True)
class Hit:
    interaction: Interaction
    served: int
    """1-based position of this answer among the key's recordings."""
    total: int
    again: int = 0
    """0 for a recording's first use; n for the n-th answer past the key's recordings (only
    under ``repeat_last`` or ``cycle``)."""


@dataclass(frozen=True, slots=True)
class Miss:
    reason: Literal["no-scope", "no-key", "exhausted"]
    scope: str
    key: MatchKey
    closest: Interaction | None
    served: int = 0
    total: int = 0
    keys_in_scope: int = 0

    def describe(self) -> str:
        if self.reason == "exhausted":
            return (
                f"exhausted: served {self.served} of {self.total} recording(s) for key "
                f"{self.key.key} (llmitm_replay_exhausted=repeat_last or cycle serves them "
                "again)"
            )
        if self.reason == "no-scope":
            return f"no recordings in scope {self.scope!r}"
        return f"no recording with this key in scope {self.scope!r} ({self.keys_in_scope} keys)"


@dataclass(slots=True)
class _Queue:
    items: deque[Interaction]
    recorded: tuple[Interaction, ...]
    """Every recording of the key in order: what ``repeat_last`` and ``cycle`` serve again."""
    served: int = 0

    @property
    def total(self) -> int:
        return len(self.recorded)


@dataclass(slots=True)
class ReplayPool:
    """Every loaded interaction, by scope and key, in arrival order."""

    scopes: dict[str, dict[str, _Queue]] = field(default_factory=dict)
    everything: list[Interaction] = field(default_factory=list)

    @classmethod
    def build(cls, interactions: Iterable[Interaction]) -> ReplayPool:
        pool = cls()
        ordered = sorted(interactions, key=lambda i: (i.started_us, i.id))
        grouped: dict[str, dict[str, list[Interaction]]] = {}
        for interaction in ordered:
            grouped.setdefault(interaction.scope, {}).setdefault(interaction.key, []).append(
                interaction
            )
        for scope, keys in grouped.items():
            pool.scopes[scope] = {k: _Queue(deque(v), tuple(v)) for k, v in keys.items()}
        pool.everything = ordered
        return pool

    def has_scope(self, scope: str) -> bool:
        return scope in self.scopes

    def take(self, scope: str, key: MatchKey, on_exhausted: OnExhausted = "error") -> Hit | Miss:
        """The next recording for ``key`` in ``scope``; once they are all used,
        ``on_exhausted`` says whether that is a miss or which recording is served again."""
        keys = self.scopes.get(scope)
        if keys is None:
            return Miss("no-scope", scope, key, self.closest(scope, key))
        queue = keys.get(key.key)
        if queue is None:
            return Miss("no-key", scope, key, self.closest(scope, key), keys_in_scope=len(keys))
        if queue.items:
            queue.served += 1
            return Hit(queue.items.popleft(), queue.served, queue.total)
        total = queue.total
        if on_exhausted == "error":
            return Miss("exhausted", scope, key, queue.recorded[-1], queue.served, total, len(keys))
        # ``served`` goes on counting requests for the key, whatever they were answered with.
        queue.served += 1
        again = queue.served - total
        if on_exhausted == "repeat_last":
            return Hit(queue.recorded[-1], total, total, again)
        index = (queue.served - 1) % total
        return Hit(queue.recorded[index], index + 1, total, again)

    def closest(self, scope: str, key: MatchKey) -> Interaction | None:
        """The recording most like ``key``: same scope, method and route first, then the
        most similar canonical text."""
        best: tuple[tuple[int, int, int, float], Interaction] | None = None
        wanted = key.canonical
        for interaction in self.everything:
            same_scope = int(interaction.scope == scope)
            same_route = int(interaction.method == key.method and interaction.route == key.route)
            same_model = int(interaction.model == key.model)
            ratio = difflib.SequenceMatcher(
                None, interaction.canonical, wanted, autojunk=False
            ).quick_ratio()
            rank = (same_scope, same_route, same_model, ratio)
            if best is None or rank > best[0]:
                best = (rank, interaction)
        return best[1] if best else None

    def unused(self) -> list[Interaction]:
        """Interactions never served, in arrival order."""
        left = {id(i) for keys in self.scopes.values() for q in keys.values() for i in q.items}
        return [i for i in self.everything if id(i) in left]

    def __len__(self) -> int:
        return len(self.everything)


def canonical_diff(recorded: str, requested: str, limit: int = 60) -> list[str]:
    """A unified diff from a recording's canonical text to a request's, at most ``limit``
    lines (``-`` recorded, ``+`` requested)."""
    lines = list(
        difflib.unified_diff(
            recorded.splitlines(),
            requested.splitlines(),
            fromfile="recorded",
            tofile="request",
            lineterm="",
            n=2,
        )
    )
    if len(lines) > limit:
        lines = [*lines[:limit], f"… {len(lines) - limit} more line(s)"]
    return lines
