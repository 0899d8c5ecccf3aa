"""What a replay hit answers: the client's status, headers and body, computed without I/O.

``from upstream`` (the default) runs the recorded upstream response through today's
translator — the same :class:`~llmitm.exchange.stream.StreamRewriter` and body translation a
live flow gets, fed the recorded pieces at their recorded split points — so a replay in CI
also tests translation. ``from client`` serves the recorded client response as it was.
Headers come from the recorded client response (what the client saw), without framing.

A miss answers with :func:`miss_error`: a 400 in OpenAI's error shape that the SDKs do not
retry (``x-should-retry: false``) and whose message says everything needed to fix it. Its
status is the caller's (``llmitm_miss_status``): a 5xx stands out in a test's output
but is what the SDKs retry — the header still tells them not to. Under
``llmitm_strict_drift``, a hit whose upstream request llmitm builds differently today answers
with :func:`drift_error`, a 400 of the same shape that names the recording.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from llmitm.exchange.response import stream_pipeline, translate_body
from llmitm.exchange.stream import StreamRewriter, decoder_for
from llmitm.replay.model import Interaction, Message
from llmitm.replay.pool import Miss
from llmitm.routing.plan import Plan
from llmitm.translate.context import TranslationContext
from llmitm.wire.errors import ApiError, openai_error_body

FRAMING = frozenset({"content-length", "transfer-encoding", "content-encoding", "connection"})


@dataclass(slots=True)
class Answer:
    status: int
    headers: list[tuple[str, str]]
    body: bytes
    chunks: list[tuple[int, bytes]] | None = None
    """The client's pieces with the recorded offsets, for paced replay (``None``: whole)."""


def _headers(message: Message | None, content_type: str | None = None) -> list[tuple[str, str]]:
    headers = [(k, v) for k, v in (message.headers if message else []) if k.lower() not in FRAMING]
    if content_type is not None:
        headers = [(k, v) for k, v in headers if k.lower() != "content-type"]
        headers.append(("content-type", content_type))
    return headers


def verbatim(interaction: Interaction) -> Answer:
    """The recorded client response, byte for byte."""
    message = interaction.answer("client_resp")
    if message is None:
        raise ValueError(f"recording {interaction.id} has no response")
    return Answer(message.status, _headers(message), message.body(), message.chunks)


def from_upstream(
    interaction: Interaction,
    plan: Plan | None,
    context: TranslationContext | None,
    *,
    strip_usage: bool = False,
) -> Answer:
    """The recorded upstream response as today's llmitm would hand it to the client
    (``strip_usage``: drop the usage chunk llmitm asked for on the client's behalf)."""
    upstream = interaction.legs.get("upstream_resp")
    if upstream is None:
        return verbatim(interaction)
    client = interaction.legs.get("client_resp")
    if plan is None or context is None:
        # Today's routes leave this call alone: nothing would change what the upstream sends
        # back, and what the client got then is what it gets now (a recording that llmitm
        # translated, or whose usage chunk it asked for and stripped, included).
        return verbatim(interaction)
    is_sse = upstream.header("content-type").lower().startswith("text/event-stream")
    if upstream.chunks is not None and upstream.status < 400 and is_sse:
        rewriter = StreamRewriter(
            stream_pipeline(plan, context, strip_usage=strip_usage),
            decoder_for(upstream.header("content-encoding")),
        )
        chunks: list[tuple[int, bytes]] = []
        last = 0
        for t_us, data in upstream.chunks:
            last = t_us
            out = b"".join(rewriter(data))
            if out:
                chunks.append((t_us, out))
        tail = b"".join(rewriter(b""))
        if tail:
            chunks.append((last, tail))
        body = b"".join(data for _, data in chunks)
        return Answer(upstream.status, _headers(client, "text/event-stream"), body, chunks)
    translated = translate_body(upstream.status, upstream.body(), plan, context)
    if translated is None:
        return Answer(upstream.status, _headers(client or upstream), upstream.body())
    status, body = translated
    return Answer(status, _headers(client, "application/json"), body)


MISS_ADVICE = (
    "See the difference with `llmitm rec diff --last-miss`; record it with "
    "--set llmitm_record=replay-or-record, or ignore a field with llmitm_match_ignore."
)
"""What a miss tells the user to do; a host with its own switches (the pytest plugin's
``--llmitm-record-mode`` and marker) says it its own way (``llmitm_miss_advice``)."""


def miss_message(miss: Miss, where: str | None, advice: str = "") -> str:
    key = miss.key
    closest = miss.closest
    parts = [
        f"llmitm replay miss: {miss.describe()}.",
        f"Request: {key.method} {key.route} model={key.model or '-'} key={key.key} "
        f"(match key v{key.version}), scope={miss.scope!r}.",
    ]
    if closest is not None:
        parts.append(f"Closest recording: {closest.id} ({where or closest.source or 'db'}).")
    parts.append(advice or MISS_ADVICE)
    return " ".join(parts)


def miss_error(
    miss: Miss, where: str | None = None, status: int = 400, advice: str = ""
) -> tuple[int, list[tuple[str, str]], bytes]:
    """Status, headers and body of the answer to a strict miss."""
    error = ApiError(
        message=miss_message(miss, where, advice),
        type="llmitm_replay_miss",
        code="replay_miss" if miss.reason != "exhausted" else "replay_exhausted",
        status=status,
    )
    return status, _refusal_headers("miss"), orjson.dumps(openai_error_body(error))


def drift_message(interaction: Interaction, diff: list[str], where: str | None) -> str:
    changed = sum(1 for line in diff if line[:1] in "+-" and line[:3] not in ("---", "+++"))
    return (
        f"llmitm replay drift: recording {interaction.id} "
        f"({where or interaction.source or 'db'}; {interaction.method} {interaction.route} "
        f"model={interaction.model or '-'}, scope={interaction.scope!r}) matched, but the "
        f"upstream request llmitm builds from it today differs from the recorded one "
        f"({changed} changed line(s)), so its recorded answer may no longer be what the "
        "upstream would say. See the difference with `llmitm rec diff --last-miss` (or the "
        "proxy's log); re-record it with --set llmitm_record=rewrite, or serve it anyway "
        "without llmitm_strict_drift."
    )


def drift_error(
    interaction: Interaction, diff: list[str], where: str | None = None
) -> tuple[int, list[tuple[str, str]], bytes]:
    """Status, headers and body of the answer to a hit refused for drift."""
    error = ApiError(
        message=drift_message(interaction, diff, where),
        type="llmitm_replay_drift",
        code="replay_drift",
        status=400,
    )
    return 400, _refusal_headers("drift"), orjson.dumps(openai_error_body(error))


def _refusal_headers(kind: str) -> list[tuple[str, str]]:
    return [
        ("content-type", "application/json"),
        ("x-should-retry", "false"),
        ("x-llmitm-replay", kind),
    ]
