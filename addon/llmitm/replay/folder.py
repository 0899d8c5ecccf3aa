"""The ``recordings/`` folder: a manifest plus one pretty JSON file per interaction.

    recordings/manifest.json
    recordings/<scope-slug>-<sha1(scope)[:8]>/0000-chat.completions-4a77c0e1.json
    recordings/_blobs/<sha256>.json

Files are sorted-key JSON with a two-space indent and a trailing newline; names depend only
on the scope, the interaction's position in its scope and its key, so an unchanged re-record
rewrites identical files. JSON bodies are embedded as values (diffs stay line-wise), other
text as ``text``, anything else as ``base64``; a stream is a list of ``{"t_ms", "raw"}``
pieces (``b64`` instead of ``raw`` for a piece that is not UTF-8 on its own). Volatile
response headers (dates, request ids, rate-limit resets) are left out of files. Only the
pure conversions, names and manifest checks live here; :mod:`llmitm.store.folder` reads and
writes the files with them.

Format 2 (format 1 folders still read: they have no blobs and exact times):

- **Blobs.** A JSON value of an interaction file (a long system prompt, a tool list, a whole
  body or leg) whose compact JSON is over 16 KB and that occurs more than once in the folder
  is stored once, as ``_blobs/<sha256 of its compact JSON>.json``, and replaced where it
  occurs by ``{"$blob": "<sha256>"}``; readers put it back before anything else.
- **Timing.** ``coarse`` (default) rounds chunk offsets, time to first byte and duration to
  10 ms, ``exact`` keeps microseconds, ``none`` writes zeros: a re-record of the same calls
  then rewrites the same bytes. The manifest says which.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import orjson

from llmitm import __version__
from llmitm.errors import UserError
from llmitm.replay.keys import MATCH_KEY_VERSION
from llmitm.replay.model import LEGS, Interaction, Message
from llmitm.wire.redact import REDACTION_VERSION

FORMAT_VERSION = 2
READABLE_FORMATS = frozenset({1, 2})
MANIFEST = "manifest.json"
BLOBS = "_blobs"
BLOB_KEY = "$blob"
BLOB_MIN_BYTES = 16 * 1024
TIMINGS = ("coarse", "exact", "none")
COARSE_US = 10_000
VOLATILE_HEADERS = frozenset(
    {
        "date",
        "x-request-id",
        "apim-request-id",
        "openai-processing-ms",
        "cf-ray",
        "set-cookie",
        "req-cost-time",
        "x-envoy-upstream-service-time",
        "content-length",
    }
)
_VOLATILE_PREFIXES = ("x-ms-", "x-ratelimit-reset")
# Request headers that change from run to run or machine to machine and never match anything:
# SDK telemetry, connection handling, tracing.
VOLATILE_REQUEST_HEADERS = frozenset(
    {
        "host",
        "connection",
        "accept-encoding",
        "user-agent",
        "traceparent",
        "tracestate",
        "idempotency-key",
        "x-request-id",
    }
)
_VOLATILE_REQUEST_PREFIXES = ("x-stainless-",)


class FolderError(UserError, ValueError):
    """A recordings folder that cannot be read (missing, wrong version, broken file)."""


def _stable_headers(headers: Iterable[tuple[str, str]], request: bool) -> list[str]:
    """``name: value`` lines without the headers that only churn a reviewed diff."""
    out = []
    for name, value in headers:
        lower = name.lower()
        if lower in VOLATILE_HEADERS or lower.startswith(_VOLATILE_PREFIXES):
            continue
        if request and (
            lower in VOLATILE_REQUEST_HEADERS or lower.startswith(_VOLATILE_REQUEST_PREFIXES)
        ):
            continue
        out.append(f"{name}: {value}")
    return out


def encode_body(content: bytes) -> dict[str, Any]:
    """A body as a file value: JSON embedded as JSON when it decodes back to the same bytes
    (compact as orjson writes it, or with a two-space indent: ``"layout": "indent"``), else
    text, else base64 — a replay from a folder is byte for byte the recording."""
    if not content:
        return {"text": ""}
    try:
        value = orjson.loads(content)
    except orjson.JSONDecodeError:
        value = _NOT_JSON
    if value is not _NOT_JSON:
        if orjson.dumps(value) == content:
            return {"json": value}
        if orjson.dumps(value, option=orjson.OPT_INDENT_2) == content:
            return {"json": value, "layout": "indent"}
    try:
        return {"text": content.decode("utf-8")}
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(content).decode()}


_NOT_JSON = object()


def decode_body(value: dict[str, Any]) -> bytes:
    if "json" in value:
        option = orjson.OPT_INDENT_2 if value.get("layout") == "indent" else 0
        return orjson.dumps(value["json"], option=option)
    if "base64" in value:
        return base64.b64decode(value["base64"])
    return str(value.get("text", "")).encode()


def export_ms(t_us: int, timing: str = "exact") -> float | int:
    """A time in a file, in milliseconds: to the microsecond (``exact``), to 10 ms
    (``coarse``: what a reviewed diff can bear) or 0 (``none``)."""
    if timing == "coarse":
        return round(t_us / COARSE_US) * (COARSE_US // 1000)
    if timing == "none":
        return 0
    if timing != "exact":
        raise ValueError(f"export timing {timing!r}: one of {', '.join(TIMINGS)}")
    return round(t_us / 1000, 3)


def message_to_json(message: Message, timing: str = "exact") -> dict[str, Any]:
    out: dict[str, Any] = {"headers": _stable_headers(message.headers, bool(message.method))}
    if message.method:
        out["method"] = message.method
        out["url"] = message.url
    else:
        out["status"] = message.status
    if message.chunks is not None:
        chunks = []
        for t_us, data in message.chunks:
            t_ms = export_ms(t_us, timing)
            try:
                chunks.append({"t_ms": t_ms, "raw": data.decode("utf-8")})
            except UnicodeDecodeError:
                chunks.append({"t_ms": t_ms, "b64": base64.b64encode(data).decode()})
        out["chunks"] = chunks
    else:
        out["body"] = encode_body(message.content or b"")
    return _sorted(out)


def _header(line: Any) -> tuple[str, str]:
    if isinstance(line, str):
        name, _, rest = line.partition(":")
        return name.strip(), rest.strip()
    name, rest = line  # [name, value], as hand-written files may have it
    return str(name), str(rest)


def message_from_json(value: dict[str, Any]) -> Message:
    message = Message(
        headers=[_header(line) for line in value.get("headers", [])],
        method=str(value.get("method", "")),
        url=str(value.get("url", "")),
        status=int(value.get("status", 0)),
    )
    if "chunks" in value:
        message.chunks = [
            (
                round(float(c["t_ms"]) * 1000),
                base64.b64decode(c["b64"]) if "b64" in c else str(c.get("raw", "")).encode(),
            )
            for c in value["chunks"]
        ]
    else:
        message.content = decode_body(value.get("body", {}))
    return message


def interaction_to_json(interaction: Interaction, timing: str = "exact") -> dict[str, Any]:
    """An interaction as a file's JSON (``exact`` times unless told: ``rec show`` and secret
    scans see everything; :func:`llmitm.store.folder.write_folder` passes its own)."""
    try:
        canonical: Any = orjson.loads(interaction.canonical_utf8)
    except orjson.JSONDecodeError:
        canonical = interaction.canonical
    out: dict[str, Any] = {
        "format": FORMAT_VERSION,
        "id": interaction.id,
        "scope": interaction.scope,
        "key": interaction.key,
        "key_version": interaction.key_version,
        "method": interaction.method,
        "route": interaction.route,
        "model": interaction.model,
        "stream": interaction.stream,
        "status": interaction.status,
        "endpoint": interaction.endpoint,
        "plan": interaction.plan,
        "ttfb_ms": None if interaction.ttfb_us is None else export_ms(interaction.ttfb_us, timing),
        "duration_ms": (
            None if interaction.duration_us is None else export_ms(interaction.duration_us, timing)
        ),
        "truncated": interaction.truncated,
        "error": interaction.error,
        "request_canonical": canonical,
    }
    if interaction.minted:
        out["minted"] = interaction.minted
    for leg in LEGS:
        message = interaction.legs.get(leg)
        if message is not None:
            out[leg] = message_to_json(message, timing)
    return _sorted(out)


def interaction_from_json(value: dict[str, Any], order: int = 0) -> Interaction:
    if value.get("format") not in READABLE_FORMATS:
        raise FolderError(
            f"format {value.get('format')!r}, this llmitm reads {_readable()} (and writes "
            f"{FORMAT_VERSION})"
        )
    canonical = value.get("request_canonical")
    canonical_utf8 = (
        orjson.dumps(canonical, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2)
        if not isinstance(canonical, str)
        else canonical.encode()
    )
    ttfb, duration = value.get("ttfb_ms"), value.get("duration_ms")
    interaction = Interaction(
        id=str(value["id"]),
        scope=str(value["scope"]),
        key=str(value["key"]),
        key_version=int(value.get("key_version", MATCH_KEY_VERSION)),
        method=str(value.get("method", "POST")),
        route=str(value.get("route", "")),
        model=str(value.get("model", "")),
        stream=bool(value.get("stream", False)),
        canonical_utf8=canonical_utf8,
        started_us=order,  # files carry no wall-clock time: their order is their name's
        status=int(value.get("status", 0)),
        endpoint=str(value.get("endpoint", "")),
        plan=str(value.get("plan", "")),
        ttfb_us=None if ttfb is None else round(float(ttfb) * 1000),
        duration_us=None if duration is None else round(float(duration) * 1000),
        truncated=value.get("truncated"),
        error=value.get("error"),
        mode="folder",
    )
    minted = value.get("minted")
    if isinstance(minted, dict):
        interaction.minted = {str(k): list(v) for k, v in minted.items() if isinstance(v, list)}
    for leg in LEGS:
        if leg in value:
            interaction.legs[leg] = message_from_json(value[leg])
    return interaction


def scope_dir(scope: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", scope).strip("_")[:60] or "scope"
    return f"{slug}-{hashlib.sha1(scope.encode()).hexdigest()[:8]}"


def file_name(index: int, interaction: Interaction) -> str:
    route = re.sub(r"[^A-Za-z0-9.]+", "_", interaction.route).strip("_") or "call"
    return f"{index:04d}-{route[:40]}-{interaction.key[:8]}.json"


def dumps_pretty(value: Any) -> bytes:
    """Two-space indented JSON and a newline. Keys are sorted by the builders of the file's
    own objects, not here: recorded JSON bodies inside keep their key order (their bytes)."""
    return orjson.dumps(value, option=orjson.OPT_INDENT_2) + b"\n"


def _sorted(value: dict[str, Any]) -> dict[str, Any]:
    return dict(sorted(value.items()))


def share_blobs(
    files: list[dict[str, Any]], min_bytes: int = BLOB_MIN_BYTES
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Files with every value over ``min_bytes`` (compact JSON) that occurs more than once
    across them replaced by a ``{"$blob": sha256}`` reference, and the blobs by hash.

    Innermost first: a shared system prompt becomes one blob even where the messages around
    it differ (or only their key order, as in a body and its canonical form); a container is
    a blob of its own only if it is still over ``min_bytes`` with its shared parts replaced
    (a long tool list), and may then refer to other blobs."""
    counts: Counter[bytes] = Counter()

    def big(node: Any) -> bytes | None:
        if not isinstance(node, (str, list, dict)):
            return None
        data = orjson.dumps(node)
        return data if len(data) > min_bytes else None

    def count(node: Any) -> None:
        # A value is never smaller than one inside it: below the threshold, stop looking.
        data = big(node)
        if data is None:
            return
        counts[hashlib.sha256(data).digest()] += 1
        for child in _children(node):
            count(child)

    def replace(node: Any, blobs: dict[str, Any]) -> Any:
        # Equal values are replaced alike, so a value's count is also its replaced form's.
        data = big(node)
        if data is None:
            return node
        shared = counts[hashlib.sha256(data).digest()] > 1
        if isinstance(node, dict):
            node = {key: replace(value, blobs) for key, value in node.items()}
        elif isinstance(node, list):
            node = [replace(value, blobs) for value in node]
        if not shared:
            return node
        data = orjson.dumps(node)
        if len(data) <= min_bytes:
            return node
        digest = hashlib.sha256(data).hexdigest()
        blobs[digest] = node
        return {BLOB_KEY: digest}

    for file in files:
        for value in file.values():  # the file itself is never a blob
            count(value)
    blobs: dict[str, Any] = {}
    out = [{key: replace(value, blobs) for key, value in file.items()} for file in files]
    return out, blobs


def _children(node: Any) -> Iterable[Any]:
    if isinstance(node, dict):
        return node.values()
    if isinstance(node, list):
        return node
    return ()


def _blob_ref(node: Any) -> str | None:
    if isinstance(node, dict) and len(node) == 1 and isinstance(node.get(BLOB_KEY), str):
        return node[BLOB_KEY]
    return None


def blob_refs(node: Any) -> set[str]:
    """The blob hashes a file's JSON refers to."""
    ref = _blob_ref(node)
    if ref is not None:
        return {ref}
    found: set[str] = set()
    for child in _children(node):
        found |= blob_refs(child)
    return found


def resolve_blobs(node: Any, load: Callable[[str], Any]) -> Any:
    """``node`` with every blob reference replaced by the blob (``load`` reads one)."""
    ref = _blob_ref(node)
    if ref is not None:
        return load(ref)
    if isinstance(node, dict):
        return {key: resolve_blobs(value, load) for key, value in node.items()}
    if isinstance(node, list):
        return [resolve_blobs(value, load) for value in node]
    return node


def new_manifest(
    interactions: list[str], settings: dict[str, Any] | None, timing: str
) -> dict[str, Any]:
    """The manifest of a folder holding ``interactions`` (file names relative to it, in
    order): the versions a reader checks, and how the folder was written."""
    return _sorted(
        {
            "format_version": FORMAT_VERSION,
            "match_key_version": MATCH_KEY_VERSION,
            "redaction_version": REDACTION_VERSION,
            "llmitm_version": __version__,
            "settings": settings or {},
            "timing": timing,
            "interactions": interactions,
        }
    )


def _readable() -> str:
    return " and ".join(str(v) for v in sorted(READABLE_FORMATS))


def check_manifest(manifest: Any, path: Path, *, any_key_version: bool = False) -> dict[str, Any]:
    """``manifest`` (read from ``path``) if this llmitm can read the folder; ``any_key_version``
    also takes one written under another match key version (``rec migrate`` re-keys it)."""
    if not isinstance(manifest, dict):
        raise FolderError(f"{path}: not a recordings manifest (a JSON object)")
    if manifest.get("format_version") not in READABLE_FORMATS:
        raise FolderError(
            f"{path}: format_version {manifest.get('format_version')!r}; this llmitm reads "
            f"{_readable()}"
        )
    if not any_key_version and manifest.get("match_key_version") != MATCH_KEY_VERSION:
        raise FolderError(
            f"{path}: match_key_version {manifest.get('match_key_version')!r}; this llmitm "
            f"computes {MATCH_KEY_VERSION} — run `llmitm rec migrate {path.parent}` (or "
            "re-record)"
        )
    return manifest


def folder_path_of(folder: Path, interaction: Interaction, index: int) -> str:
    """Where ``interaction`` lives (or would live) in ``folder``: for miss reports."""
    return str(folder / scope_dir(interaction.scope) / file_name(index, interaction))
