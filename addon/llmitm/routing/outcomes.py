"""What one upstream attempt ended with, and how long the upstream asked us to stay away.

This module owns the shared vocabulary of the routing core: :class:`Outcome` (the kind of
ending, the HTTP status, the upstream's ``Retry-After``, whether the client had already been
sent a byte) and :func:`parse_retry_after`; :func:`direct_outcome` and
:func:`transport_outcome` classify the direct path's single attempt as mitmproxy saw it.
``health`` turns outcomes into cooldowns, ``attempts`` turns them into retry decisions; both
read the same object so they never disagree about what a 429 or a timeout was.

Pure: headers and times in, values out. ``wall_now`` (seconds since the epoch) is passed in
because a ``Retry-After`` HTTP-date is an absolute wall-clock time; everything else in the
routing core runs on a monotonic clock.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC
from email.utils import parsedate_to_datetime
from typing import Literal

OutcomeKind = Literal[
    "success",
    "connect_error",  # refused, reset or DNS failure before anything was sent back
    "timeout",  # no first byte in time (also an upstream 408)
    "rate_limited",  # 429
    "server_error",  # 5xx
    "client_error",  # any other 4xx: the request is wrong, not the endpoint
    "cut",  # the upstream ended the body early, after the first byte
    "aborted",  # the client went away; nobody's fault upstream
]
OUTCOME_KINDS: tuple[str, ...] = OutcomeKind.__args__  # type: ignore[attr-defined]

Headers = Mapping[str, str] | Iterable[tuple[str, str]]


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one attempt ended."""

    kind: OutcomeKind
    status: int | None = None
    retry_after: float | None = None
    """Seconds the upstream asked us to wait (already parsed, never negative)."""
    after_first_byte: bool = False
    """True once any byte of the response reached the client: from then on nothing is
    retried, because the client has seen a status line and maybe part of a stream."""
    message: str = ""
    """A short human reason (the upstream's error message, ``connection refused``…)."""

    @property
    def failed(self) -> bool:
        """Whether the endpoint misbehaved (what health counts against it)."""
        return self.kind in {"connect_error", "timeout", "rate_limited", "server_error", "cut"}


def outcome_for_status(
    status: int,
    headers: Headers = (),
    *,
    wall_now: float | None = None,
    message: str = "",
    after_first_byte: bool = False,
) -> Outcome:
    """Classify an upstream HTTP response by its status (and its Retry-After headers)."""
    kind: OutcomeKind
    if status < 400:
        kind = "success"
    elif status == 429:
        kind = "rate_limited"
    elif status == 408:
        kind = "timeout"  # the upstream timed out waiting for us: retrying may succeed
    elif status >= 500:
        kind = "server_error"
    else:
        kind = "client_error"
    retry_after = None
    if kind in {"rate_limited", "server_error", "timeout"}:  # 503 also carries Retry-After
        retry_after = parse_retry_after(headers, wall_now=wall_now)
    return Outcome(
        kind=kind,
        status=status,
        retry_after=retry_after,
        after_first_byte=after_first_byte,
        message=message,
    )


def direct_outcome(
    status: int, headers: Headers, *, cut: str | None, wall_now: float | None
) -> Outcome:
    """How a direct attempt ended once its answer is in: ``cut`` is why the upstream broke
    off its stream, if it did (after the first byte, so never retried)."""
    if cut is not None:
        return Outcome("cut", after_first_byte=True, message=cut)
    return outcome_for_status(status, headers, wall_now=wall_now)


def transport_outcome(message: str, *, got_head: bool, streamed: bool) -> Outcome | None:
    """The endpoint's failure behind a direct flow's transport error ``message``, or
    ``None`` when it is not the endpoint's: the client went away, or a stream had begun
    (its end is reported as a cut)."""
    if "client" in message.lower() or (got_head and streamed):
        return None
    # mitmproxy could not reach the endpoint, lost it before the head, or before the end of
    # a plain body (the client got llmitm's 502 for all three).
    return Outcome("connect_error" if not got_head else "server_error", message=message)


def _header(headers: Headers, name: str) -> str | None:
    # Works for dicts, mitmproxy's case-insensitive Headers and lists of pairs alike.
    items = headers.items() if isinstance(headers, Mapping) else headers
    for key, value in items:
        if key.lower() == name:
            return value
    return None


def parse_retry_after(headers: Headers, *, wall_now: float | None = None) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After``; ``None`` when absent or
    unreadable.

    ``retry-after-ms`` (Azure, OpenAI) wins because it is the more precise of the two when
    both are sent. ``Retry-After`` is delta-seconds (a decimal is accepted too: some servers
    send ``1.5``) or an HTTP-date, read against ``wall_now``; a date in the past means 0.
    Capping is the caller's business (``health`` caps cooldowns, ``attempts`` the budget).
    """
    raw_ms = _header(headers, "retry-after-ms")
    if raw_ms is not None:
        value = _number(raw_ms)
        if value is not None:
            return value / 1000.0
    raw = _header(headers, "retry-after")
    if raw is None:
        return None
    value = _number(raw)
    if value is not None:
        return value
    if wall_now is None:
        return None  # a date needs a wall clock to mean anything
    try:
        when = parsedate_to_datetime(raw.strip())
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # "-0000" parses naive; RFC 9110 dates are GMT regardless
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - wall_now)


def _number(raw: str) -> float | None:
    try:
        value = float(raw.strip())
    except ValueError:
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return value
