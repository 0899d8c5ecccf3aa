"""Canonical, versioned match keys for recorded requests: what makes two requests "the
same call" for replay, and a version that changes whenever that rule does.

The key of a request is ``sha256(canonical)[:16]`` where ``canonical`` is sorted-key JSON of:
the method, the logical route (``chat.completions``, ``responses``, or the method and path of
any other API call), the model (the Azure deployment counts as the model), the query without
``api-version`` and credentials, an allow-list of headers (``openai-beta``), and the
*redacted* JSON body with the profile's volatile fields dropped and volatile values — uuids,
timestamps, dates, provider ids — replaced by numbered placeholders (``<uuid:1>``), numbered
by first appearance so that *which* value repeats where still counts, but not the value.

Profiles: ``default`` drops ``user``, ``metadata``, ``safety_identifier``,
``prompt_cache_key``, ``store``, ``stream_options``, Codex's per-item local metadata and
replaces provider ids; ``strict`` only
redacts (ids and uuids kept as sent); ``loose`` also drops sampling and length settings.
User ignore paths are dotted (``messages.0.content``, ``tools.*.description``).

Pure: the same function runs at record time and at replay time, on the redacted request, so
redaction can never cause a miss. :data:`MATCH_KEY_VERSION` is stored with every recording.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, get_args
from urllib.parse import parse_qsl

import orjson

from llmitm.wire import depth
from llmitm.wire.paths import classify_path
from llmitm.wire.prefix_hash import PrefixHasher
from llmitm.wire.redact import redact_body, redact_json
from llmitm.wire.spliced import spliced

MATCH_KEY_VERSION = 1

Profile = Literal["default", "strict", "loose"]
PROFILES: tuple[str, ...] = get_args(Profile)

_DEFAULT_DROP = (
    "user",
    "metadata",
    "safety_identifier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "store",
    "stream_options",
    "client_metadata",
)
_LOOSE_DROP = (
    *_DEFAULT_DROP,
    "temperature",
    "top_p",
    "seed",
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "frequency_penalty",
    "presence_penalty",
    "parallel_tool_calls",
    "reasoning",
)
# Nested client-side bookkeeping, dropped like the fields above: Codex stamps each input item
# with its local creation time (``internal_chat_message_metadata_passthrough.create_time``),
# which the model never sees and which differs on every run.
_DEFAULT_DROP_PATHS = (("input", "*", "internal_chat_message_metadata_passthrough"),)
DROPPED_PATHS: Mapping[str, tuple[tuple[str, ...], ...]] = {
    "default": _DEFAULT_DROP_PATHS,
    "strict": (),
    "loose": _DEFAULT_DROP_PATHS,
}
DROPPED_FIELDS: Mapping[str, tuple[str, ...]] = {
    "default": _DEFAULT_DROP,
    "strict": (),
    "loose": _LOOSE_DROP,
}
HEADER_ALLOW = ("openai-beta",)
QUERY_DROP = frozenset({"api-version", "api-key", "api_key", "key"})

# Volatile values, in the order they are tried. Timestamps before dates (a timestamp contains
# a date), uuids before provider ids (an id may end in a uuid).
_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_TIMESTAMP = r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"
_DATE = r"\b\d{4}-\d{2}-\d{2}\b"
_PROVIDER_ID = (
    r"\b(?:resp|msg|call|fc|rs|ctc|ws|item|run|thread|asst|file|toolu|chatcmpl|cmpl)"
    r"[_-][A-Za-z0-9_-]{6,}"
)
_VOLATILE_STRICT = re.compile(rf"(?P<uuid>{_UUID})|(?P<timestamp>{_TIMESTAMP})|(?P<date>{_DATE})")
_VOLATILE = re.compile(
    rf"(?P<uuid>{_UUID})|(?P<timestamp>{_TIMESTAMP})|(?P<date>{_DATE})|(?P<id>{_PROVIDER_ID})"
)


@dataclass(frozen=True, slots=True)
class KeyOptions:
    """How keys are computed: the profile, extra dotted ignore paths, extra header names."""

    profile: Profile = "default"
    ignore: tuple[str, ...] = ()
    headers: tuple[str, ...] = HEADER_ALLOW
    match_host: bool = False
    volatile: bool = True
    """Replace volatile values by numbered placeholders (``False``: every value counts as
    sent — the response cache's keys, where a different date or id is a different question)."""

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            raise ValueError(f"profile must be one of {', '.join(PROFILES)}, not {self.profile!r}")


@dataclass(frozen=True, slots=True)
class MatchKey:
    """A request's key, with what it was computed from (for logs, diffs and ``rec ls``)."""

    key: str
    method: str
    route: str
    model: str
    stream: bool
    canonical_utf8: bytes
    """The sorted-key JSON that was hashed, as the UTF-8 bytes it was hashed as: a resent
    history's is as long as the history, and goes to the store as bytes."""
    version: int = MATCH_KEY_VERSION

    @property
    def canonical(self) -> str:
        """The canonical text, for diffs and reports (decoded on each use: few need it)."""
        return self.canonical_utf8.decode()

    def label(self) -> str:
        return f"{self.method} {self.route} #{self.key[:8]}"


@dataclass(slots=True)
class Numbering:
    """Numbers volatile values by first appearance, per kind."""

    seen: dict[tuple[str, str], int] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    log: list[tuple[str, str, int]] | None = None
    """Every value numbered, in order, with its number (``None``: not kept) — what
    :mod:`llmitm.replay.memo` replays for a part of a body it has keyed before."""

    def number(self, kind: str, value: str) -> int:
        number = self.seen.get((kind, value))
        if number is None:
            number = self.counts.get(kind, 0) + 1
            self.counts[kind] = number
            self.seen[kind, value] = number
        if self.log is not None:
            self.log.append((kind, value, number))
        return number

    def placeholder(self, kind: str, value: str) -> str:
        return f"<{kind}:{self.number(kind, value)}>"


def route_of(method: str, path: str) -> tuple[str, str | None]:
    """The logical route of a request path, and the Azure deployment it names (if any).

    Create calls of both APIs map to one name whatever the path form (OpenAI, Azure classic,
    Azure v1, a gateway prefix); anything else is the path without query, from ``/v1`` or
    ``/openai`` on when present."""
    classified = classify_path(path) if method == "POST" else None
    if classified is not None:
        route = "chat.completions" if classified.api == "chat" else "responses"
        return route, classified.deployment
    bare = path.partition("?")[0]
    for marker in ("/openai/", "/v1/"):
        at = bare.find(marker)
        if at >= 0:
            bare = bare[at:]
            break
    return bare, None


def _drop_path(value: Any, parts: Sequence[str]) -> Any:
    if not parts:
        return value
    head, rest = parts[0], parts[1:]
    if isinstance(value, dict):
        if head == "*":
            return {k: _drop_path(v, rest) if rest else v for k, v in value.items()} if rest else {}
        if head not in value:
            return value
        if not rest:
            return {k: v for k, v in value.items() if k != head}
        return {**value, head: _drop_path(value[head], rest)}
    if isinstance(value, list):
        if head == "*":
            return [_drop_path(item, rest) for item in value] if rest else []
        if head.isdigit() and int(head) < len(value):
            index = int(head)
            if not rest:
                return value[:index] + value[index + 1 :]
            return [*value[:index], _drop_path(value[index], rest), *value[index + 1 :]]
    return value


_LOOKBACK = 8
"""How far into a volatile value its first ``-`` or ``_`` can be (``chatcmpl-``, a uuid's
first group): every kind holds one, so a match can only begin that close before one."""


def _next_match(pattern: re.Pattern[str], text: str, start: int) -> re.Match[str] | None:
    """``pattern.search(text, start)``, trying only the places a volatile value can begin.

    The regex tries each of its alternatives at every position — ~90 ns per character,
    hundreds of milliseconds for the few MB of history an agent resends each turn — while
    finding the next ``-`` or ``_`` is a memchr. Starts are tried in rising order, each once,
    so the first match is the one the search would find (``\b`` still sees the whole text)."""
    find, match = text.find, pattern.match
    dash, under = find("-", start), find("_", start)
    tried = start
    while dash >= 0 or under >= 0:
        sep = dash if under < 0 or 0 <= dash < under else under
        for at in range(max(tried, sep - _LOOKBACK), sep + 1):
            found = match(text, at)
            if found is not None:
                return found
        tried = sep + 1
        if sep == dash:
            dash = find("-", tried)
        else:
            under = find("_", tried)
    return None


def volatile_pattern(options: KeyOptions) -> re.Pattern[str]:
    """The volatile values ``options`` replaces by placeholders."""
    return _VOLATILE_STRICT if options.profile == "strict" else _VOLATILE


def with_placeholders(value: Any, pattern: re.Pattern[str], numbering: Numbering) -> Any:
    """``value`` with each volatile value replaced by its numbered placeholder (numbered in
    walk order: objects' keys as they are, arrays in order)."""
    if isinstance(value, str):
        found = _next_match(pattern, value, 0)
        if found is None:
            return value
        parts: list[str] = []
        last = 0
        while found is not None:
            parts.append(value[last : found.start()])
            parts.append(numbering.placeholder(found.lastgroup or "value", found.group(0)))
            last = found.end()
            found = _next_match(pattern, value, last)
        parts.append(value[last:])
        return "".join(parts)
    if isinstance(value, dict):
        return {k: with_placeholders(v, pattern, numbering) for k, v in value.items()}
    if isinstance(value, list):
        return [with_placeholders(item, pattern, numbering) for item in value]
    return value


def reduced(body: Any, options: KeyOptions, redacted: bool = False) -> Any:
    """The redacted body without the profile's dropped fields and the ignore paths
    (``redacted``: the body is redaction's output already, redacting it again changes
    nothing)."""
    if not redacted:
        body = redact_json(body)
    if isinstance(body, dict):
        drop = DROPPED_FIELDS[options.profile]
        body = {k: v for k, v in body.items() if k not in drop}
        for parts in DROPPED_PATHS[options.profile]:
            body = _drop_path(body, parts)
    for path in options.ignore:
        body = _drop_path(body, [part for part in path.split(".") if part])
    return body


def canonical_body(body: Any, options: KeyOptions, redacted: bool = False) -> Any:
    """The redacted body reduced to what identifies the request under ``options``."""
    if not options.volatile:
        return reduced(body, options, redacted)
    return with_placeholders(
        reduced(body, options, redacted), volatile_pattern(options), Numbering()
    )


def volatile_values(body: Any, options: KeyOptions) -> list[tuple[str, str]]:
    """``(value, placeholder)`` for each volatile value :func:`canonical_body` replaces, in
    numbering order (``llmitm rec why`` shows them)."""
    numbering = Numbering()
    with_placeholders(reduced(body, options), volatile_pattern(options), numbering)
    return [(value, f"<{kind}:{number}>") for (kind, value), number in numbering.seen.items()]


_FORMS = PrefixHasher()
"""The sha256 states of recent keys' texts (their next turn's is hashed from there)."""
_TEXT = orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2
"""How a key's text is spelt."""
_ITEM_LINE = b"\n" + b" " * 6
"""A line break inside an item of the body's conversation array, which the text indents three
levels deep (the fields, ``body``, the array)."""


class ItemTexts(NamedTuple):
    """A canonical body's conversation array (``body[name]``), each item spelt by
    :func:`item_text`."""

    name: str
    texts: list[bytes]


def item_text(form: Any) -> bytes:
    """An item's canonical form as a key's text spells it in the body's conversation array.

    The text is sorted-key JSON indented by two spaces a level, and JSON puts no raw line
    break inside a string: the item spelt alone, its line breaks indented three levels more,
    is the item spelt in place."""
    return orjson.dumps(form, option=_TEXT).replace(b"\n", _ITEM_LINE)


def _spelt(fields: dict[str, Any], items: ItemTexts | None) -> bytes:
    """The key's text of ``fields``: the conversation array spliced in from its items' texts
    (a resent item's is kept with its part in the memo: spelling the whole history again
    each turn re-encoded every string of it)."""
    array = None if items is None else fields["body"].get(items.name)
    if items is not None and type(array) is list and len(array) == len(items.texts):
        text = spliced(
            fields,
            ("body", items.name),
            items.texts,
            option=_TEXT,
            separator=b"," + _ITEM_LINE,
            opening=b"[" + _ITEM_LINE,
            closing=b"\n    ]",
        )
        if text is not None:
            return text
    return orjson.dumps(fields, option=_TEXT)


def match_key(
    method: str,
    url_path: str,
    headers: Iterable[tuple[str, str]],
    content: bytes | None,
    options: KeyOptions = KeyOptions(),
    host: str = "",
    *,
    parsed: dict[str, Any] | None = None,
    redacted: bool = False,
    canonical: Any = None,
    item_texts: ItemTexts | None = None,
) -> MatchKey:
    """The key of one client request (``url_path`` with its query; headers as sent;
    ``parsed``: ``content`` already parsed as a JSON object, not parsed again;
    ``redacted``: ``content`` is :func:`~llmitm.wire.redact.redact_body`'s output, so its
    walk is not done twice — the key is the same either way; ``canonical``: with ``parsed``,
    :func:`canonical_body` of it under ``options``, made already — by
    :class:`~llmitm.replay.memo.RequestMemo`, which also checked its depth, and spelt the
    items of its conversation array, ``item_texts``)."""
    method = method.upper()
    route, deployment = route_of(method, url_path)
    query = url_path.partition("?")[2]
    pairs = sorted(
        (k, v) for k, v in parse_qsl(query, keep_blank_values=True) if k.lower() not in QUERY_DROP
    )
    wanted = {name.lower() for name in options.headers}
    kept = sorted((k.lower(), v) for k, v in headers if k.lower() in wanted)
    body: Any = parsed
    text = ""
    if content and body is None:
        try:
            body = orjson.loads(content)
        except orjson.JSONDecodeError:
            text = _bytes_identity(content)
    model = deployment or ""
    stream = False
    if isinstance(body, dict):
        if isinstance(body.get("model"), str) and not deployment:
            model = body["model"]
        stream = body.get("stream") is True
    if body is not None and canonical is None and depth.exceeds(body):
        # Nested deeper than llmitm takes (the 400 it gets is recorded too): too deep to
        # reduce and write, so its bytes are its identity.
        body, text = None, _bytes_identity(content or b"")
    if body is None:
        canonical = text
    elif canonical is None:
        canonical = canonical_body(body, options, redacted)
        item_texts = None
    if type(canonical) is not dict:
        item_texts = None
    fields: dict[str, Any] = {
        "method": method,
        "route": route,
        "model": model,
        "query": [list(pair) for pair in pairs],
        "headers": [list(pair) for pair in kept],
        "body": canonical,
    }
    if options.match_host:
        fields["host"] = host.lower()
    form = _spelt(fields, item_texts)
    # The bytes of the text, hashed from where they differ from a recent key's (a resent
    # history's text is the last turn's with a few items more).
    digest = _FORMS.digest(form).hex()[:16]
    return MatchKey(digest, method, route, model, stream, form)


def _bytes_identity(content: bytes) -> str:
    """A body that is not reduced field by field: the hash of its redacted bytes."""
    return "sha256:" + hashlib.sha256(redact_body(content) or b"").hexdigest()


def parse_ignore(value: str) -> tuple[str, ...]:
    """``a.b, c`` → ``("a.b", "c")`` (the option's comma-separated form)."""
    return tuple(part.strip() for part in value.split(",") if part.strip())
