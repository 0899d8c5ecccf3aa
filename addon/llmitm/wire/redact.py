"""The one redactor: credentials in headers, query strings, JSON bodies, text and SSE chunks
become placeholders before anything is written, matched or exported.

Placeholders, never deletion: a header or field keeps its name and its shape
(``authorization: Bearer <redacted>``), so a request still says *that* it carried a key and
the match key, computed from the redacted request, is the same whatever key a later run uses
(the same redaction runs at record and at replay, so redaction can never cause a miss).
Values are replaced by a fixed placeholder with no hash of the secret, so nothing derived
from a credential reaches disk either.

Pure functions over bytes, strings and JSON values; no I/O. :data:`REDACTION_VERSION` goes
into every recording so a change of rules can be detected.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import orjson

from llmitm.wire import depth

REDACTION_VERSION = 1
PLACEHOLDER = "<redacted>"

# Request headers whose value is a credential (lower-case names).
SECRET_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "api-key",
        "x-api-key",
        "ocp-apim-subscription-key",
        "cookie",
        "openai-organization",
        "openai-project",
        "x-goog-api-key",
        "anthropic-api-key",
    }
)
# Response headers that are never kept at all (they set state in a browser, not in a replay).
DROPPED_HEADERS = frozenset({"set-cookie", "set-cookie2"})
SECRET_QUERY = frozenset({"api-key", "api_key", "key", "sig", "token", "code", "access_token"})
SECRET_FIELD = re.compile(
    r"^(api_?key|password|passwd|secret|client_secret|access_token|refresh_token|"
    r"authorization|.*_api_key|.*_secret|.*_token|.*_credentials?)$",
    re.IGNORECASE,
)
# Fields whose names look secret but are counts or settings in the OpenAI APIs.
NOT_SECRET_FIELDS = frozenset({"max_tokens", "max_completion_tokens", "max_output_tokens"})
# SECRET_FIELD with its string value, in JSON bytes (for a body too deep to parse and walk).
# Its name stays within the key's quotes (``[^"]*`` where SECRET_FIELD has ``.*``).
_SECRET_FIELD_BYTES = re.compile(
    rb'"('
    + SECRET_FIELD.pattern.removeprefix("^(").removesuffix(")$").replace(".*", '[^"\\\\]*').encode()
    + rb')"(\s*:\s*)"(?:[^"\\]|\\.)+"',
    re.IGNORECASE,
)

# Credential shapes inside any string: OpenAI/Anthropic style keys (sk-, sk-proj-, sk-ant-),
# JWTs (Azure AD tokens), bearer values. Ordered: the first that matches a span wins.
_SECRET_PATTERNS: tuple[re.Pattern[str], ...] = (
    re.compile(r"\bBearer\s+(?!<redacted>)[A-Za-z0-9._~+/=-]{8,}"),
    re.compile(r"\bsk-(?:proj-|ant-|live-|test-)?[A-Za-z0-9_-]{16,}"),
    re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
)
_COMBINED = re.compile("|".join(f"(?:{p.pattern})" for p in _SECRET_PATTERNS))
_COMBINED_BYTES = re.compile(_COMBINED.pattern.encode())
# Every pattern starts with one of these literals. A search for one literal is fast while the
# combined regex costs ~25 ms per MB (it tries each alternative at every position), so a
# recorded stream without any of them — nearly all of them — is never scanned by it at all.
# Each with the index of one of its rarer bytes ("B", "-", "J"), used in bytes (every recorded
# stream): a single-byte find is memchr, ~50× faster than any scan for the literal, and most
# streams hold none of those bytes or only a few. Where one is common (the "-" of every
# "chatcmpl-" id), after _ANCHOR_TRIES hits the literal is scanned for from there.
_LITERALS = (("Bearer", 0), ("sk-", 2), ("eyJ", 2))
_FINDERS = tuple(re.compile(re.escape(literal)).search for literal, _ in _LITERALS)
_ANCHORED = tuple(
    (literal.encode(), at, re.compile(re.escape(literal).encode()).search)
    for literal, at in _LITERALS
)
_ANCHOR_TRIES = 16
_LITERAL_TEXTS = tuple(literal for literal, _ in _LITERALS)


def _maybe(text: str) -> bool:
    if len(text) < 512:  # a header, a field: ``in`` costs less than a regex call
        return any(map(text.__contains__, _LITERAL_TEXTS))
    return any(find(text) for find in _FINDERS)


def _holds(data: bytes, literal: bytes, at: int, scan: Callable[..., object]) -> bool:
    anchor = literal[at : at + 1]
    find, startswith = data.find, data.startswith
    hit = find(anchor, at)
    for _ in range(_ANCHOR_TRIES):
        if hit < 0:
            return False
        if startswith(literal, hit - at):
            return True
        hit = find(anchor, hit + 1)
    return hit >= 0 and scan(data, hit - at) is not None


def may_hold_secret(data: bytes) -> bool:
    """A cheap test: ``False`` guarantees nothing to redact."""
    return any(_holds(data, literal, at, scan) for literal, at, scan in _ANCHORED)


def _replace(match: re.Match[str]) -> str:
    return "Bearer " + PLACEHOLDER if match.group(0).startswith("Bearer") else PLACEHOLDER


def _replace_bytes(match: re.Match[bytes]) -> bytes:
    return b"Bearer <redacted>" if match.group(0).startswith(b"Bearer") else b"<redacted>"


def redact_text(text: str) -> str:
    """``text`` with every credential-shaped substring replaced."""
    return _COMBINED.sub(_replace, text) if _maybe(text) else text


def find_secrets(text: str) -> list[str]:
    """The credential-shaped substrings of ``text`` (for ``rec check-secrets``)."""
    return [m.group(0) for m in _COMBINED.finditer(text)]


def redact_header_value(name: str, value: str) -> str:
    lower = name.lower()
    if lower in SECRET_HEADERS:
        if value.startswith(("Bearer ", "bearer ")):
            return "Bearer " + PLACEHOLDER
        if value.startswith(("Basic ", "basic ")):
            return "Basic " + PLACEHOLDER
        return PLACEHOLDER if value else value
    return redact_text(value)


def redact_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """Headers in order with credential values replaced and cookie-setting ones dropped."""
    return [
        (name, redact_header_value(name, value))
        for name, value in headers
        if name.lower() not in DROPPED_HEADERS
    ]


def redact_url(url: str) -> str:
    """``url`` with secret query values (``api-key``, ``sig``, …) replaced, userinfo removed."""
    parts = urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2] if "@" in parts.netloc else parts.netloc
    if not parts.query and netloc == parts.netloc:
        return redact_text(url)
    pairs = [
        (k, PLACEHOLDER if k.lower() in SECRET_QUERY else redact_text(v))
        for k, v in parse_qsl(parts.query, keep_blank_values=True)
    ]
    query = urlencode(pairs, safe="<>") if pairs else parts.query
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


@functools.lru_cache(maxsize=4096)
def _secret_name(key: str) -> bool:
    """Whether a field of this name holds a credential (bodies repeat a few names a lot)."""
    return key not in NOT_SECRET_FIELDS and SECRET_FIELD.match(key) is not None


def redact_json(value: Any) -> Any:
    """A copy of a JSON value with secret-named fields and secret-shaped strings replaced."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if isinstance(key, str) and isinstance(item, str) and item and _secret_name(key):
                out[key] = PLACEHOLDER
            else:
                out[key] = redact_json(item)
        return out
    if isinstance(value, list):
        return [redact_json(item) for item in value]
    if isinstance(value, str):
        return redact_text(value)
    return value


def secret_field(key: str, value: Any) -> bool:
    """Whether ``value``, the field ``key`` of an object, is replaced whole (a non-empty
    string in a secret-named field)."""
    return isinstance(value, str) and bool(value) and _secret_name(key)


def redact_fields(value: Any) -> Any:
    """``value`` with only its secret-named fields replaced, the same object when none is
    (for a body none of whose strings can hold a credential's shape)."""
    if isinstance(value, dict):
        out: dict[str, Any] | None = None
        for key, item in value.items():
            if isinstance(item, str):
                if not (item and _secret_name(key)):
                    continue
                new: Any = PLACEHOLDER
            elif isinstance(item, (dict, list)):
                new = redact_fields(item)
                if new is item:
                    continue
            else:
                continue
            if out is None:
                out = dict(value)
            out[key] = new
        return value if out is None else out
    if isinstance(value, list):
        copied: list[Any] | None = None
        for index, item in enumerate(value):
            if isinstance(item, (dict, list)):
                new = redact_fields(item)
                if new is not item:
                    if copied is None:
                        copied = list(value)
                    copied[index] = new
        return value if copied is None else copied
    return value


def _replace_field_bytes(match: re.Match[bytes]) -> bytes:
    if match[1].decode().lower() in NOT_SECRET_FIELDS:
        return match[0]
    return b'"' + match[1] + b'"' + match[2] + b'"' + PLACEHOLDER.encode() + b'"'


def redact_body(content: bytes | None) -> bytes | None:
    """A body with its credentials replaced: JSON bodies field by field (re-serialised only
    when something changed, so a clean body stays byte for byte), anything else as bytes."""
    if not content:
        return content
    stripped = content.lstrip()
    if stripped[:1] in (b"{", b"["):
        try:
            parsed = orjson.loads(content)
        except orjson.JSONDecodeError:
            parsed = None
        if parsed is not None and depth.exceeds(parsed):
            # Nested deeper than llmitm takes (it answers a 400): the walk over its fields
            # would run out of stack and orjson could not write it again, so its fields are
            # redacted in the bytes.
            content = _SECRET_FIELD_BYTES.sub(_replace_field_bytes, content)
        elif parsed is not None and (b"\\u" in content or may_hold_secret(content)):
            redacted = redact_json(parsed)
            return content if redacted == parsed else orjson.dumps(redacted)
        elif parsed is not None:
            # No string can hold a credential's shape (none of its literals is in the bytes,
            # and no \u escape can spell one): only secret-named fields are left to replace,
            # without walking every string or comparing copies (a few MB of agent history).
            redacted = redact_fields(parsed)
            return content if redacted is parsed else orjson.dumps(redacted)
    return _COMBINED_BYTES.sub(_replace_bytes, content) if may_hold_secret(content) else content


def redact_chunks(chunks: Sequence[tuple[int, bytes]]) -> list[tuple[int, bytes]]:
    """Streamed pieces with credentials replaced, split again at the same places.

    A secret may straddle two pieces, so the stream is redacted whole; each piece then ends
    where it ended before, moved to the end of a replacement that covers its old end (a piece
    can become empty; it keeps its time so the timeline stays whole)."""
    if not chunks:
        return list(chunks)
    joined = b"".join(data for _, data in chunks)
    if not may_hold_secret(joined) or not _COMBINED_BYTES.search(joined):
        return list(chunks)
    ends: list[int] = []
    total = 0
    for _, data in chunks:
        total += len(data)
        ends.append(total)
    pieces: list[bytes] = []
    shift: list[tuple[int, int, int]] = []  # (old_start, old_end, new_end) per replacement
    last = 0
    out_len = 0
    for match in _COMBINED_BYTES.finditer(joined):
        start, end = match.span()
        pieces.append(joined[last:start])
        out_len += start - last
        replacement = _replace_bytes(match)
        pieces.append(replacement)
        out_len += len(replacement)
        shift.append((start, end, out_len))
        last = end
    pieces.append(joined[last:])
    redacted = b"".join(pieces)

    def new_position(old: int) -> int:
        delta = 0
        for start, end, new_end in shift:
            if old <= start:
                break
            if old < end:
                return new_end  # inside a replaced secret: the piece ends after the placeholder
            delta = new_end - end
        return old + delta

    out: list[tuple[int, bytes]] = []
    previous = 0
    for (t_us, _), end in zip(chunks, ends, strict=True):
        new_end = new_position(end)
        out.append((t_us, redacted[previous:new_end]))
        previous = new_end
    return out
