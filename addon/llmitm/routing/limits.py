"""Concurrency caps: requests in flight per endpoint and per endpoint-model, and the queue of
requests waiting for a free slot.

This module owns the in-flight counters. Every request that goes upstream holds a
:class:`Lease`; the counter goes down when the lease is released, and releasing is
idempotent, so a ``finally`` and an error hook that both release cannot drive a counter
negative or free someone else's slot (LiteLLM's and nomyo's leaked-counter bugs came from
exactly such double or missing decrements). ``least-busy`` reads :meth:`Limiter.in_flight`.

Waiting is described as data (:class:`WaitPolicy`) and implemented without asyncio so the
core stays sans-IO: a request that finds every candidate full joins a bounded FIFO with a
callback; when a slot frees, the limiter acquires it *for* the first waiter that can use it
and hands the lease over (no barging: a newcomer cannot take a slot a waiter was owed).

How the proxy's async layer waits (one event loop, so no locks are needed)::

    lease = acquire_first(limiter, order, model)
    if lease is None:
        fut = loop.create_future()
        def deliver(lease: Lease) -> bool:
            if fut.done():           # timed out or cancelled a moment ago
                return False         # the limiter takes the lease back, tries the next waiter
            fut.set_result(lease)
            return True
        waiter = limiter.enqueue([(e, model) for e in order], deliver)
        if waiter is None:           # queue full: 429 with Retry-After now
            ...
        try:
            lease = await asyncio.wait_for(fut, limiter.wait.timeout)
        except TimeoutError:         # 429 with Retry-After: wait.retry_after
            waiter.cancel()
            ...
    try:
        ...                          # the upstream exchange
    finally:
        lease.release()              # on every path: success, error, abort, cut

:attr:`Limiter.version` grows on every release, for callers that prefer polling.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

Key = tuple[str, str | None]


@dataclass(frozen=True, slots=True)
class WaitPolicy:
    """What a request does when every candidate is at its cap."""

    max_waiters: int = 0
    """How many requests may wait at once; 0 answers at once (429)."""
    timeout: float = 0.0
    """Seconds a request waits for a slot before it gets its 429."""
    retry_after: float = 1.0
    """The ``Retry-After`` of that 429."""

    def __post_init__(self) -> None:
        if self.max_waiters < 0 or self.timeout < 0 or self.retry_after < 0:
            raise ValueError("wait policy values must not be negative")


@dataclass(eq=False, slots=True)
class Lease:
    """One request's slot on an endpoint (and endpoint-model); release it exactly once —
    or as many times as you like: only the first release counts."""

    endpoint: str
    model: str | None
    _limiter: Limiter = field(repr=False)
    released: bool = False
    _then: Callable[[], None] | None = field(default=None, repr=False)

    def release(self) -> bool:
        """Free the slot; ``True`` if this call freed it, ``False`` if it was already free."""
        if self.released:
            return False
        self.released = True
        self._limiter._release(self)
        if self._then is not None:
            self._then()
        return True

    def then(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once, when the slot is released (a fleet's shared slot is freed
        with it)."""
        self._then = callback

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@dataclass(eq=False, slots=True)
class Waiter:
    """A queued request: the slots it can use, in preference order, and how to hand it one."""

    candidates: tuple[Key, ...]
    deliver: Callable[[Lease], bool]
    _limiter: Limiter = field(repr=False)
    done: bool = False

    def cancel(self) -> None:
        """Leave the queue (idempotent; a no-op once a lease was delivered)."""
        if not self.done:
            self.done = True
            self._limiter._waiters.remove(self)


class Limiter:
    """In-flight counters and caps. ``None`` or a missing entry means no cap."""

    def __init__(
        self,
        endpoint_caps: Mapping[str, int | None] | None = None,
        model_caps: Mapping[tuple[str, str], int | None] | None = None,
        wait: WaitPolicy | None = None,
    ) -> None:
        self._caps: dict[Key, int] = {}
        for name, cap in (endpoint_caps or {}).items():
            if cap is not None:
                self._caps[(name, None)] = _checked(cap)
        for (name, model), cap in (model_caps or {}).items():
            if cap is not None:
                self._caps[(name, model)] = _checked(cap)
        self.wait = wait or WaitPolicy()
        self._counts: dict[Key, int] = {}
        self._waiters: deque[Waiter] = deque()
        self.version = 0
        """Grows on every release: a cheap "something may have freed up" signal."""

    # --- counting -----------------------------------------------------------------------

    def cap(self, endpoint: str, model: str | None = None) -> int | None:
        return self._caps.get((endpoint, model))

    def capped(self, endpoint: str, model: str | None = None) -> bool:
        """Whether a cap applies to a request on ``endpoint`` for ``model``."""
        if (endpoint, None) in self._caps:
            return True
        return model is not None and (endpoint, model) in self._caps

    def in_flight(self, endpoint: str, model: str | None = None) -> int:
        """Requests in flight on ``endpoint`` (all models), or on one endpoint-model."""
        return self._counts.get((endpoint, model), 0)

    def has_room(self, endpoint: str, model: str | None = None) -> bool:
        keys: list[Key] = [(endpoint, None)]
        if model is not None:
            keys.append((endpoint, model))
        for key in keys:
            cap = self._caps.get(key)
            if cap is not None and self._counts.get(key, 0) >= cap:
                return False
        return True

    def try_acquire(self, endpoint: str, model: str | None = None) -> Lease | None:
        """A lease if both the endpoint and the endpoint-model are under their caps."""
        if not self.has_room(endpoint, model):
            return None
        return self._take(endpoint, model)

    def _take(self, endpoint: str, model: str | None) -> Lease:
        self._bump((endpoint, None), 1)
        if model is not None:
            self._bump((endpoint, model), 1)
        return Lease(endpoint, model, self)

    def _release(self, lease: Lease) -> None:
        self._bump((lease.endpoint, None), -1)
        if lease.model is not None:
            self._bump((lease.endpoint, lease.model), -1)
        self.version += 1
        self._serve_waiters()

    def _bump(self, key: Key, delta: int) -> None:
        value = self._counts.get(key, 0) + delta
        if value < 0:  # unreachable while leases are the only way in and out
            raise AssertionError(f"in-flight count of {key} went negative")
        if value:
            self._counts[key] = value
        else:
            del self._counts[key]  # keep the table as small as the load

    def total_in_flight(self) -> int:
        return sum(n for (_, model), n in self._counts.items() if model is None)

    # --- waiting ------------------------------------------------------------------------

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def enqueue(self, candidates: Iterable[Key], deliver: Callable[[Lease], bool]) -> Waiter | None:
        """Wait for a slot on any of ``candidates``; ``None`` when the queue is full.

        ``deliver(lease)`` is called (synchronously, from a release) with a lease already
        acquired for the waiter. It returns ``False`` if the waiter no longer wants it (it
        timed out in the meantime); the limiter then releases that lease itself.
        """
        if len(self._waiters) >= self.wait.max_waiters:
            return None
        waiter = Waiter(tuple(candidates), deliver, self)
        self._waiters.append(waiter)
        # A slot may already be free (the caller raced a release): serve at once.
        self._serve_waiters()
        return waiter

    def _serve_waiters(self) -> None:
        # First waiter (FIFO) that has a free candidate gets it. A waiter whose candidates
        # are all full does not block the ones behind it that want other endpoints.
        progress = True
        while progress and self._waiters:
            progress = False
            for waiter in list(self._waiters):
                lease = next(
                    (
                        self._take(endpoint, model)
                        for endpoint, model in waiter.candidates
                        if self.has_room(endpoint, model)
                    ),
                    None,
                )
                if lease is None:
                    continue
                waiter.done = True
                self._waiters.remove(waiter)
                if not waiter.deliver(lease):
                    # Unwanted: give the slot back without recursing into this loop.
                    lease.released = True
                    self._bump((lease.endpoint, None), -1)
                    if lease.model is not None:
                        self._bump((lease.endpoint, lease.model), -1)
                progress = True
                break


def acquire_first(limiter: Limiter, order: Sequence[str], model: str | None = None) -> Lease | None:
    """A lease on the first endpoint of ``order`` with room ("over the cap goes to the next
    eligible endpoint"); ``None`` if all are full."""
    for endpoint in order:
        lease = limiter.try_acquire(endpoint, model)
        if lease is not None:
            return lease
    return None


def _checked(cap: int) -> int:
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise ValueError(f"a concurrency cap must be a positive integer, got {cap!r}")
    return cap
