"""The response cache for live traffic: keys, what a request asks of it, what may be kept, and
the bounded in-memory store of answers (per process), all without I/O.

A request is looked up under the key replay uses (:func:`llmitm.replay.keys.match_key`) — but
with every value counting as sent (no volatile placeholders: a different date or id is a
different question for a cache, though not for a replay) and only the fields that cannot
change the answer left out (``user``, ``metadata``, ``safety_identifier``, the prompt cache's
key and retention, client metadata) — together with the route, the host and, unless the
route's cache is ``shared``, the fingerprint of the client's credential. ``stream`` and
``stream_options`` count, so a streamed and a non-streamed request, or a stream with and one
without its usage chunk, never share an answer: a hit is always in the client's own API and
shape, because it is what an identical request was answered with.

What a request asks (:class:`Directive`) comes from the ``x-llmitm-cache`` header (``use``,
``skip``, ``refresh``, optionally ``; ttl=30s``) or from an ``llmitm`` field in the body
(``extra_body={"llmitm": {"cache": "use"}}`` or ``{"cache": {"mode": "use", "ttl": "30s"}}``),
which :func:`strip_field` removes before the match key is made and the upstream sees the
body (in a body over 256 KiB, the field is looked for in its first and last 64 KiB, where
top-level fields are: :func:`mentions_field`). :func:`decide` combines it with the route's
settings: a route with ``cache`` uses it unless a request says ``skip`` (neither read nor
kept) or ``refresh`` (not read, kept); a route without one caches only the requests that say
``use`` or ``refresh``, with the default settings.

Only a complete answer is kept (:func:`answer_complete`): a 2xx that ended as it should (a
chat stream with its ``[DONE]`` or a finish reason, a Responses stream with
``response.completed``, a completed Response, a chat completion with choices) — never an
error, a 429, a cut or failed stream, a background request's queued answer, nor the answer
to a request in a ``conversation`` (a hit would not add its turn to the conversation). An answer
that holds sealed reasoning (``encrypted_content``) is served only to the credential that
filled it, also on a ``shared`` route (kept under that credential's key, so clients sharing a
route never replace each other's sealed answers).

A hit's body marks its usage as cached in OpenAI's terms (:func:`marked_body`): the whole
prompt was served from a cache, so ``prompt_tokens_details.cached_tokens`` (chat) or
``input_tokens_details.cached_tokens`` (Responses) equals the prompt's tokens; the output
tokens are the cached answer's, as the upstream counted them when it made it.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, get_args

import orjson

from llmitm.errors import InputError
from llmitm.replay.keys import KeyOptions, MatchKey, match_key
from llmitm.routing.config import CacheSettings, parse_duration
from llmitm.wire.sse import DONE_DATA, SSEDecoder, encode_event

CacheMode = Literal["use", "skip", "refresh"]
CACHE_MODES: tuple[str, ...] = get_args(CacheMode)
HEADER = "x-llmitm-cache"
"""The request header a client asks with, and the response header that says what happened
(``hit``, ``miss``, ``refresh``, ``skip``)."""
FIELD = "llmitm"
"""The body field the SDKs can send (``extra_body``); never forwarded upstream."""
ANONYMOUS = "anonymous"
"""Whose entries a request without a credential reads and fills."""

KEY_OPTIONS = KeyOptions(
    profile="strict",
    ignore=(
        "user",
        "metadata",
        "safety_identifier",
        "prompt_cache_key",
        "prompt_cache_retention",
        "client_metadata",
        "input.*.internal_chat_message_metadata_passthrough",
    ),
    volatile=False,
)
"""How the cache's match keys are made (see the module's docstring)."""


class CacheRequestError(InputError, ValueError):
    """A cache header or ``llmitm`` field llmitm cannot read; the message names it."""


@dataclass(frozen=True, slots=True)
class Directive:
    """What one request asks of the cache."""

    mode: CacheMode
    ttl: float | None = None
    """Seconds the answer this request fills is kept (``None``: the route's TTL)."""


def parse_header(value: str) -> Directive:
    """``use``, ``skip``, ``refresh``, each optionally with ``; ttl=30s`` (``ttl=30s`` alone
    means ``use``)."""
    mode: str | None = None
    ttl: float | None = None
    for part in value.replace(",", ";").split(";"):
        word = part.strip()
        if not word:
            continue
        name, eq, given = word.partition("=")
        name = name.strip().lower()
        if eq and name == "ttl":
            ttl = _ttl(given.strip(), f"the {HEADER} header's ttl")
        elif not eq and name in CACHE_MODES and mode is None:
            mode = name
        else:
            raise CacheRequestError(
                f"the {HEADER} header must be use, skip or refresh, optionally with "
                f"'; ttl=<duration>' (such as 'use; ttl=10m'); got {value!r}"
            )
    return Directive(mode or "use", ttl)  # type: ignore[arg-type]


def parse_field(value: Any) -> Directive | None:
    """The ``llmitm`` body field: ``{"cache": "use" | "skip" | "refresh" | true | false |
    {"mode": …, "ttl": …}}``; ``None`` when it says nothing of the cache."""
    if not isinstance(value, dict):
        raise CacheRequestError(
            f'the request\'s "{FIELD}" field must be an object such as {{"cache": "use"}}; '
            f"got {orjson.dumps(value).decode()[:80]}"
        )
    unknown = sorted(set(value) - {"cache"})
    if unknown:
        raise CacheRequestError(
            f'the request\'s "{FIELD}" field has unknown key(s) {", ".join(unknown)} (known: cache)'
        )
    cache = value.get("cache")
    where = f'"{FIELD}.cache"'
    if cache is None:
        return None
    if cache is True or cache is False:
        return Directive("use" if cache else "skip")
    if isinstance(cache, str) and cache in CACHE_MODES:
        return Directive(cache)  # type: ignore[arg-type]
    if isinstance(cache, dict):
        unknown = sorted(set(cache) - {"mode", "ttl"})
        mode = cache.get("mode", "use")
        if unknown or mode not in CACHE_MODES:
            raise CacheRequestError(
                f'{where} takes mode (use, skip or refresh) and ttl (such as "10m"); '
                f"got {orjson.dumps(cache).decode()[:120]}"
            )
        ttl = _ttl(cache["ttl"], f"{where}.ttl") if "ttl" in cache else None
        return Directive(mode, ttl)
    raise CacheRequestError(
        f'{where} must be "use", "skip", "refresh", true, false or {{"mode": …, "ttl": …}}; '
        f"got {orjson.dumps(cache).decode()[:80]}"
    )


def _ttl(value: Any, where: str) -> float:
    try:
        return parse_duration(value)
    except ValueError:
        raise CacheRequestError(
            f'{where} must be a duration such as "30s", "10m", "1h" or seconds; got {value!r}'
        ) from None


_FIELD_BYTES = b'"' + FIELD.encode() + b'"'
WHOLE_SCAN = 256 * 1024
"""Bodies up to this size are searched whole for the field; a larger one only in its first
and last :data:`EDGE_SCAN` bytes."""
EDGE_SCAN = 64 * 1024


def mentions_field(content: bytes) -> bool:
    """Whether the body may hold the ``llmitm`` field. A top-level field of a large body is at
    one of its edges — the SDKs' ``extra_body`` is merged in last, a hand-written body puts
    its own fields first — while the bulk is the conversation in between: searching all of a
    5 MB body would cost the request ~5 ms, its edges a few µs."""
    if len(content) <= WHOLE_SCAN:
        return _FIELD_BYTES in content
    return _FIELD_BYTES in content[:EDGE_SCAN] or _FIELD_BYTES in content[-EDGE_SCAN:]


def strip_field(content: bytes) -> tuple[bytes, Any] | None:
    """The body without its top-level ``llmitm`` field, and the field's value; ``None`` when
    it has none (the common case costs a byte search, see :func:`mentions_field`)."""
    if not mentions_field(content):
        return None
    try:
        body = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(body, dict) or FIELD not in body:
        return None
    value = body.pop(FIELD)
    return orjson.dumps(body), value


@dataclass(frozen=True, slots=True)
class Decision:
    """What the cache does for one request."""

    read: bool
    """Answer from the cache when it holds an answer."""
    write: bool
    """Keep the upstream's answer when it is complete."""
    settings: CacheSettings
    ttl: float

    @property
    def label(self) -> str:
        """The response header's value on a miss."""
        if self.read:
            return "miss"
        return "refresh" if self.write else "skip"


def decide(route: CacheSettings | None, directive: Directive | None) -> Decision | None:
    """The cache's part in one request (``None``: it takes none and says nothing)."""
    if route is None and (directive is None or directive.mode == "skip"):
        return None
    settings = route or CacheSettings()
    mode = directive.mode if directive is not None else "use"
    ttl = directive.ttl if directive is not None and directive.ttl is not None else settings.ttl
    return Decision(read=mode == "use", write=mode != "skip", settings=settings, ttl=ttl)


def refusal(body: Any) -> str | None:
    """Why a request's answer is never cached, whatever it asks (``None``: it may be)."""
    if not isinstance(body, dict):
        return "not a JSON object (the router answers what is wrong with it)"
    if body.get("background") is True:
        return "a background request's answer is a queued response, not the answer"
    if body.get("conversation") is not None:
        return "a request in a conversation adds its turn to it: a hit would not"
    return None


def cache_key(
    key: MatchKey, route: str, host: str, credential: str | None, settings: CacheSettings
) -> str:
    """The entry's key: the match key, the route and host, and whose it is."""
    who = "" if settings.scope == "shared" else (credential or ANONYMOUS)
    text = "\0".join((key.key, route, host.lower(), who))
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


def cache_keys(
    key: MatchKey, route: str, host: str, credential: str | None, settings: CacheSettings
) -> tuple[str, str]:
    """The key an answer everyone may get is kept under, and the key of one only
    ``credential`` may get (an answer with sealed reasoning): the same unless ``shared``, where
    each credential's sealed answers stay apart and never push out each other's."""
    own = cache_key(key, route, host, credential, replace(settings, scope="credential"))
    if settings.scope != "shared":
        return own, own
    return cache_key(key, route, host, credential, settings), own


def request_key(
    method: str,
    path: str,
    headers: Iterable[tuple[str, str]],
    content: bytes,
    host: str,
    parsed: dict[str, Any] | None = None,
) -> MatchKey:
    """The request's match key under the cache's options (the body without ``llmitm``;
    ``parsed``: that body already parsed)."""
    return match_key(method, path, headers, content, KEY_OPTIONS, host, parsed=parsed)


# --- answers ------------------------------------------------------------------------------


def _events(body: bytes) -> list[tuple[str | None, bytes]]:
    decoder = SSEDecoder()
    return [*decoder.feed(body), *decoder.close()]


def answer_complete(api: str, stream: bool, status: int, body: bytes) -> bool:
    """Whether an answer ended as it should, so that serving it again is honest."""
    if not 200 <= status < 300 or not body:
        return False
    if stream:
        return _stream_complete(api, _events(body))
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    if not isinstance(document, dict) or document.get("error"):
        return False
    if api == "responses":
        return document.get("status") == "completed"
    return isinstance(document.get("choices"), list) and bool(document["choices"])


def _stream_complete(api: str, events: list[tuple[str | None, bytes]]) -> bool:
    finished = False
    for _name, data in events:
        if data == DONE_DATA:
            finished = finished or api == "chat"
            continue
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            return False
        if not isinstance(event, dict) or event.get("error"):
            return False
        kind = event.get("type")
        if api == "responses":
            if kind in ("error", "response.failed", "response.incomplete"):
                return False
            finished = finished or kind == "response.completed"
        else:
            choices = event.get("choices")
            if isinstance(choices, list) and any(
                isinstance(c, dict) and c.get("finish_reason") for c in choices
            ):
                finished = True
    return finished


def _mark_usage(usage: Any) -> bool:
    """Set the cached-token detail of a usage object of either API to its prompt's tokens."""
    if not isinstance(usage, dict):
        return False
    for total, details in (("prompt_tokens", "prompt_tokens_details"),
                           ("input_tokens", "input_tokens_details")):  # fmt: skip
        tokens = usage.get(total)
        if isinstance(tokens, int) and not isinstance(tokens, bool):
            detail = usage.get(details)
            detail = dict(detail) if isinstance(detail, dict) else {}
            detail["cached_tokens"] = tokens
            usage[details] = detail
            return True
    return False


def marked_body(stream: bool, body: bytes) -> bytes:
    """The answer's body with its usage marked as cached (see the module's docstring);
    unchanged when it carries no usage."""
    if b'"usage"' not in body:
        return body
    if not stream:
        try:
            document = orjson.loads(body)
        except orjson.JSONDecodeError:
            return body
        if isinstance(document, dict) and _mark_usage(document.get("usage")):
            return orjson.dumps(document)
        return body
    out: list[bytes] = []
    for name, data in _events(body):
        if b'"usage"' in data:
            try:
                event = orjson.loads(data)
            except orjson.JSONDecodeError:
                event = None
            if isinstance(event, dict):
                response = event.get("response")
                holder = response if isinstance(response, dict) else event
                if _mark_usage(holder.get("usage")):
                    data = orjson.dumps(event)
        out.append(encode_event(name, data))
    return b"".join(out)


def holds_sealed_reasoning(body: bytes) -> bool:
    """Whether an answer carries reasoning sealed for its credential (``encrypted_content``)."""
    return b'"encrypted_content"' in body


# --- the store of answers -----------------------------------------------------------------


@dataclass(slots=True)
class Entry:
    """One cached answer, as a hit serves it."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes
    """The body with its usage marked as cached."""
    expires: float
    """When it stops being served (the injected clock's seconds)."""
    credential: str | None = None
    private: bool = False
    """Holds sealed reasoning: served only to :attr:`credential`."""
    tokens: tuple[int, int, int, int] | None = None
    """``(input, cached, output, reasoning)`` of the answer, for the hit's usage record."""
    model: str = ""
    endpoint: str = ""
    """The endpoint that made the answer."""


@dataclass(slots=True)
class CacheStats:
    hits: int = 0
    misses: int = 0
    stored: int = 0
    evicted: int = 0
    expired: int = 0


@dataclass(slots=True)
class ResponseCache:
    """Answers by route and key, each route bounded by its own ``max_entries`` (least
    recently used first out) and each entry by its TTL. One asyncio loop uses it, so every
    call is atomic; the clock is the caller's."""

    routes: dict[str, OrderedDict[str, Entry]] = field(default_factory=dict)
    stats: CacheStats = field(default_factory=CacheStats)

    def get(
        self, route: str, keys: Sequence[str], credential: str | None, now: float
    ) -> Entry | None:
        """The first live entry of ``keys`` that ``credential`` may be served (one hit or one
        miss however many keys were tried)."""
        entries = self.routes.get(route)
        for key in keys if entries is not None else ():
            assert entries is not None
            entry = entries.get(key)
            if entry is not None and now >= entry.expires:
                del entries[key]
                self.stats.expired += 1
                continue
            if entry is None or (entry.private and entry.credential != credential):
                continue
            entries.move_to_end(key)
            self.stats.hits += 1
            return entry
        self.stats.misses += 1
        return None

    def put(self, route: str, key: str, entry: Entry, max_entries: int) -> None:
        entries = self.routes.setdefault(route, OrderedDict())
        entries[key] = entry
        entries.move_to_end(key)
        self.stats.stored += 1
        while len(entries) > max_entries:
            entries.popitem(last=False)
            self.stats.evicted += 1

    def __len__(self) -> int:
        return sum(map(len, self.routes.values()))
