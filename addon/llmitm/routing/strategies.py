"""The order in which a route's endpoints are tried for one request.

This module owns the three strategies of a route:

- ``failover``: the configured order;
- ``weighted``: a weighted random draw *without replacement*, so the first endpoint follows
  the weights and the rest of the order is still there as fallbacks (weight 0: only as a
  fallback, after every weighted endpoint, in configured order);
- ``least-busy``: fewest requests in flight first; ties keep the configured order.

**Unhealthy endpoints are skipped** (issue 4), also when every endpoint is unhealthy: the
:class:`Choice` then has an empty ``order`` and lists the cooling endpoints by the time they
recover. We do not fall back to trying a cooling endpoint "because nothing else is left":
a 429 cooldown is what the upstream asked for, and a request sent earlier only earns another
429 and extends the throttling. Instead the caller asks ``attempts`` whether the soonest
recovery fits the request's budget (then it waits and tries that endpoint: this is "retried
with backoff when it is the only one") or answers at once with ``Retry-After``.

Caps are not applied here: the caller walks the order with ``limits.acquire_first`` so an
endpoint at its cap passes the request to the next one. Randomness is an injected
``random.Random`` (seeded in tests); health and load are read, never changed.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

from llmitm.routing.health import Health

StrategyName = Literal["failover", "weighted", "least-busy"]
STRATEGIES: tuple[str, ...] = get_args(StrategyName)


@dataclass(frozen=True, slots=True)
class Choice:
    """The endpoints to try, best first, and the ones left out because they are cooling."""

    order: tuple[str, ...]
    cooling: tuple[tuple[str, float], ...] = field(default=())
    """(endpoint, monotonic time it becomes available), soonest first."""

    @property
    def retry_at(self) -> float | None:
        """When the first cooling endpoint recovers (for a ``Retry-After`` when ``order`` is
        empty)."""
        return self.cooling[0][1] if self.cooling else None


def choose(
    strategy: StrategyName,
    endpoints: Sequence[str],
    *,
    health: Health,
    now: float,
    model: str | None = None,
    weights: Mapping[str, float] | None = None,
    rng: random.Random | None = None,
    in_flight: Callable[[str], int] | None = None,
) -> Choice:
    """Order ``endpoints`` (a route's, in configured order) for one request.

    ``weights`` (default 1 each) and ``rng`` are used by ``weighted``; ``in_flight`` (e.g.
    ``Limiter.in_flight``) by ``least-busy``.
    """
    healthy = [e for e in endpoints if health.is_available(e, now, model)]
    cooling = sorted(
        ((e, health.available_at(e, model)) for e in endpoints if e not in healthy),
        key=lambda item: item[1],  # sorted() is stable: ties keep the configured order
    )
    if strategy == "failover":
        order = healthy
    elif strategy == "weighted":
        order = weighted_order(healthy, weights or {}, rng or random.Random())
    elif strategy == "least-busy":
        order = least_busy_order(healthy, in_flight or (lambda _e: 0))
    else:
        raise ValueError(f"unknown routing strategy {strategy!r} (known: {', '.join(STRATEGIES)})")
    return Choice(order=tuple(order), cooling=tuple(cooling))


def weighted_order(
    endpoints: Sequence[str], weights: Mapping[str, float], rng: random.Random
) -> list[str]:
    """Draw endpoints one by one with probability proportional to weight, without
    replacement. A missing weight is 1; a zero weight is never drawn first."""
    pool = [(e, float(weights.get(e, 1.0))) for e in endpoints]
    if any(w < 0 for _, w in pool):
        raise ValueError("weights must not be negative")
    zero = [e for e, w in pool if w == 0]
    pool = [(e, w) for e, w in pool if w > 0]
    order: list[str] = []
    while pool:
        total = sum(w for _, w in pool)
        point = rng.random() * total
        index = len(pool) - 1  # float rounding can leave point == total: take the last
        for i, (_, w) in enumerate(pool):
            if point < w:
                index = i
                break
            point -= w
        order.append(pool.pop(index)[0])
    return order + zero


def least_busy_order(endpoints: Sequence[str], in_flight: Callable[[str], int]) -> list[str]:
    """Fewest in flight first; ``sorted`` is stable, so ties keep the configured order."""
    return sorted(endpoints, key=in_flight)
