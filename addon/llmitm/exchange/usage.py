"""The tokens one planned flow consumed, from wherever its upstream reported them.

Non-streamed bodies of either API carry a top-level ``usage``; a stream's pipeline knows the
usage once it has ended (translators read it from the terminal event or the trailing usage
chunk, also when the client did not ask to see it; the passthrough guard reads the last
chunks). Everything comes out as ``(input, cached, output, reasoning)``, and becomes the
one :func:`usage_record` shape whoever made the upstream call (a flow, or a background run
that no flow carries).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import ClassVar

import orjson

from llmitm.exchange.response import StreamOutcome
from llmitm.translate.protocol import StreamFacts
from llmitm.wire.usage import usage_tokens

Tokens = tuple[int, int, int, int]


@dataclass(frozen=True, slots=True)
class UsageRecord:
    """The tokens one upstream response consumed.

    ``at`` should be timezone-aware; a naive datetime is taken as UTC (a hook must not
    raise over it). Use ``""`` for a value llmitm does not know (no route matched, no
    model in the body).
    """

    kind: ClassVar[str] = "usage"

    at: datetime
    endpoint: str
    model: str
    route: str
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0


def body_tokens(content: bytes | None) -> Tokens | None:
    """Usage of a chat completion or Response object body; ``None`` without one."""
    if not content or b'"usage"' not in content:
        return None
    try:
        body = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
    return usage_tokens(body.get("usage")) if isinstance(body, dict) else None


def stream_tokens(stream: StreamFacts | StreamOutcome) -> Tokens | None:
    """Usage of a stream that has ended; ``None`` when the upstream sent none."""
    return usage_tokens(stream.usage)


def usage_record(
    tokens: Tokens, *, endpoint: str, model: str, route: str, at: datetime | None = None
) -> UsageRecord:
    """The accounting row for ``tokens`` an upstream call consumed (``at``: now)."""
    input_tokens, cached, output, reasoning = tokens
    return UsageRecord(
        at=at if at is not None else datetime.now(UTC),
        endpoint=endpoint,
        model=model,
        route=route,
        input_tokens=input_tokens,
        cached_tokens=cached,
        output_tokens=output,
        reasoning_tokens=reasoning,
    )
