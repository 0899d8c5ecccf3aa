"""Why a request gets the key it gets, and which recordings come nearest (``llmitm rec why``).

:func:`explain` retraces :func:`~llmitm.replay.keys.match_key` step by step: what the
redactor replaced, which fields the profile dropped, which ignore paths removed something,
which strings became numbered placeholders, and the canonical text that was hashed.
:func:`nearest` ranks recordings the way a replay miss picks its closest one (same scope,
same method and route, same model, then the similarity of canonical text) and keeps the best
few. :func:`parse_request` reads what a user hands in: a bare request body, a recorded
request leg, or a whole recording file. Pure functions; no I/O.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import orjson

from llmitm.errors import InputError
from llmitm.replay import folder as folder_format
from llmitm.replay.keys import (
    DROPPED_FIELDS,
    KeyOptions,
    MatchKey,
    canonical_body,
    match_key,
    volatile_values,
)
from llmitm.replay.model import Interaction
from llmitm.wire.redact import redact_body, redact_json

CHAT_PATH = "/v1/chat/completions"
RESPONSES_PATH = "/v1/responses"


class RequestError(InputError, ValueError):
    """A request file that cannot be read as a request."""


@dataclass(frozen=True, slots=True)
class Trace:
    key: MatchKey
    options: KeyOptions
    redacted: list[str] = field(default_factory=list)
    """Dotted paths whose value the redactor replaced."""
    dropped: list[str] = field(default_factory=list)
    """Top-level fields the profile dropped."""
    ignored: list[str] = field(default_factory=list)
    """Ignore paths that removed something (others matched nothing)."""
    unmatched_ignores: list[str] = field(default_factory=list)
    placeholders: list[tuple[str, str]] = field(default_factory=list)
    """(value, placeholder) of each volatile value."""


@dataclass(frozen=True, slots=True)
class Near:
    interaction: Interaction
    same_key: bool
    ratio: float


def parse_request(
    data: bytes, method: str | None = None, path: str | None = None
) -> tuple[str, str, list[tuple[str, str]], bytes]:
    """``(method, path, headers, body)`` of a request file: a recording file (its
    ``client_req``), a request leg (``method``, ``url``, ``headers``, ``body``), or a bare
    body (POST to ``path``, else the route its fields name: ``messages`` → chat completions,
    ``input`` → responses)."""
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise RequestError(f"not JSON ({exc})") from None
    if isinstance(value, dict) and isinstance(value.get("client_req"), dict):
        value = value["client_req"]
    if isinstance(value, dict) and "url" in value and ("body" in value or "method" in value):
        try:
            leg = folder_format.message_from_json(value)
        except (KeyError, TypeError, ValueError) as exc:
            raise RequestError(f"not a request leg ({exc})") from None
        parts = urlsplit(leg.url)
        url_path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return (method or leg.method or "POST"), (path or url_path), leg.headers, leg.body()
    if not isinstance(value, dict):
        raise RequestError("expected a JSON object: a request body, a request leg or a recording")
    if path is None:
        if "messages" in value:
            path = CHAT_PATH
        elif "input" in value:
            path = RESPONSES_PATH
        else:
            raise RequestError("cannot tell the route of this body: pass --path")
    return method or "POST", path, [], data


def _changed_paths(before: Any, after: Any, at: str = "") -> Iterator[str]:
    if isinstance(before, dict) and isinstance(after, dict):
        for name, item in before.items():
            yield from _changed_paths(item, after.get(name), f"{at}.{name}" if at else name)
    elif isinstance(before, list) and isinstance(after, list):
        for index, (item, other) in enumerate(zip(before, after, strict=False)):
            yield from _changed_paths(item, other, f"{at}.{index}" if at else str(index))
    elif before != after:
        yield at or "(body)"


def explain(
    method: str,
    path: str,
    headers: Iterable[tuple[str, str]],
    content: bytes,
    options: KeyOptions,
) -> Trace:
    """The key of a request and each step that made it."""
    headers = list(headers)
    key = match_key(method, path, headers, redact_body(content), options)  # as recorded
    try:
        body: Any = orjson.loads(content) if content else None
    except orjson.JSONDecodeError:
        body = None
    if not isinstance(body, (dict, list)):
        return Trace(key, options)
    clean = redact_json(body)
    redacted = list(_changed_paths(body, clean))
    dropped = [name for name in DROPPED_FIELDS[options.profile] if isinstance(clean, dict)
               and name in clean]  # fmt: skip
    bare = KeyOptions(profile=options.profile, headers=options.headers)
    reference = canonical_body(body, bare)
    ignored, unmatched = [], []
    for ignore in options.ignore:
        alone = KeyOptions(profile=options.profile, ignore=(ignore,), headers=options.headers)
        (ignored if canonical_body(body, alone) != reference else unmatched).append(ignore)
    placeholders = volatile_values(body, options)
    return Trace(key, options, redacted, dropped, ignored, unmatched, placeholders)


def ratio(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def nearest(
    interactions: Iterable[Interaction], scope: str, key: MatchKey, limit: int = 3
) -> list[Near]:
    """The ``limit`` recordings most like ``key`` in ``scope``: the same key first, then the
    same method and route, the same model, and the most similar canonical text."""
    ranked = []
    for interaction in interactions:
        if interaction.scope != scope:
            continue
        same_key = interaction.key == key.key
        same_route = interaction.method == key.method and interaction.route == key.route
        similar = ratio(interaction.canonical, key.canonical)
        rank = (same_key, same_route, interaction.model == key.model, similar)
        ranked.append((rank, Near(interaction, same_key, similar)))
    ranked.sort(key=lambda pair: pair[0], reverse=True)
    return [near for _, near in ranked[:limit]]
