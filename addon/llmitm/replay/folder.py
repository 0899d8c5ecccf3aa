"""The ``recordings/`` folder: a manifest plus one pretty JSON file per interaction.

    recordings/manifest.json
    recordings/<scope-slug>-<sha1(scope)[:8]>/0000-chat.completions-4a77c0e1.json

Files are sorted-key JSON with a two-space indent and a trailing newline; names depend only
on the scope, the interaction's position in its scope and its key, so an unchanged re-record
rewrites identical files. JSON bodies are embedded as values (diffs stay line-wise), other
text as ``text``, anything else as ``base64``; a stream is a list of ``{"t_ms", "raw"}``
pieces (``b64`` instead of ``raw`` for a piece that is not UTF-8 on its own). Volatile
response headers (dates, request ids, rate-limit resets) are left out of files. Pure
conversion functions plus :func:`write_folder` / :func:`read_folder`.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson

from llmitm import __version__
from llmitm.replay.keys import MATCH_KEY_VERSION
from llmitm.replay.model import LEGS, Interaction, Message
from llmitm.replay.redact import REDACTION_VERSION

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
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


class FolderError(ValueError):
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


def message_to_json(message: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"headers": _stable_headers(message.headers, bool(message.method))}
    if message.method:
        out["method"] = message.method
        out["url"] = message.url
    else:
        out["status"] = message.status
    if message.chunks is not None:
        chunks = []
        for t_us, data in message.chunks:
            try:
                chunks.append({"t_ms": round(t_us / 1000, 3), "raw": data.decode("utf-8")})
            except UnicodeDecodeError:
                chunks.append(
                    {"t_ms": round(t_us / 1000, 3), "b64": base64.b64encode(data).decode()}
                )
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


def interaction_to_json(interaction: Interaction) -> dict[str, Any]:
    try:
        canonical: Any = orjson.loads(interaction.canonical)
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
        "ttfb_ms": None if interaction.ttfb_us is None else round(interaction.ttfb_us / 1000, 3),
        "duration_ms": (
            None if interaction.duration_us is None else round(interaction.duration_us / 1000, 3)
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
            out[leg] = message_to_json(message)
    return _sorted(out)


def interaction_from_json(value: dict[str, Any], order: int = 0) -> Interaction:
    if value.get("format") != FORMAT_VERSION:
        raise FolderError(f"format {value.get('format')!r}, this llmitm reads {FORMAT_VERSION}")
    canonical = value.get("request_canonical")
    canonical_text = (
        orjson.dumps(canonical, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2).decode()
        if not isinstance(canonical, str)
        else canonical
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
        canonical=canonical_text,
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


def write_folder(
    folder: Path, interactions: Iterable[Interaction], settings: dict[str, Any] | None = None
) -> list[Path]:
    """Write ``interactions`` as the whole content of ``folder`` (files of earlier runs that
    are not rewritten are removed); return the files written."""
    folder.mkdir(parents=True, exist_ok=True)
    by_scope: dict[str, list[Interaction]] = {}
    for interaction in sorted(interactions, key=lambda i: (i.started_us, i.id)):
        by_scope.setdefault(interaction.scope, []).append(interaction)
    written: list[Path] = []
    index_entries = []
    for scope in sorted(by_scope):
        directory = folder / scope_dir(scope)
        directory.mkdir(exist_ok=True)
        for index, interaction in enumerate(by_scope[scope]):
            path = directory / file_name(index, interaction)
            data = dumps_pretty(interaction_to_json(interaction))
            if not path.is_file() or path.read_bytes() != data:
                path.write_bytes(data)
            written.append(path)
            index_entries.append(str(path.relative_to(folder)))
    keep = set(written)
    for stale in folder.glob("*/*.json"):
        if stale not in keep:
            stale.unlink()
    for directory in folder.iterdir():
        if directory.is_dir() and not any(directory.iterdir()):
            directory.rmdir()
    manifest = {
        "format_version": FORMAT_VERSION,
        "match_key_version": MATCH_KEY_VERSION,
        "redaction_version": REDACTION_VERSION,
        "llmitm_version": __version__,
        "settings": settings or {},
        "interactions": index_entries,
    }
    (folder / MANIFEST).write_bytes(dumps_pretty(_sorted(manifest)))
    return written


def read_manifest(folder: Path) -> dict[str, Any]:
    path = folder / MANIFEST
    if not path.is_file():
        raise FolderError(f"{folder}: no {MANIFEST} (not a recordings folder)")
    try:
        manifest = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise FolderError(f"{path}: not JSON ({exc})") from None
    if manifest.get("format_version") != FORMAT_VERSION:
        raise FolderError(
            f"{path}: format_version {manifest.get('format_version')!r}; this llmitm reads "
            f"{FORMAT_VERSION}"
        )
    if manifest.get("match_key_version") != MATCH_KEY_VERSION:
        raise FolderError(
            f"{path}: match_key_version {manifest.get('match_key_version')!r}; this llmitm "
            f"computes {MATCH_KEY_VERSION} — re-record, or re-key with `llmitm rec import` "
            "and `llmitm rec export`"
        )
    return manifest


def read_folder(folder: Path) -> list[Interaction]:
    """Every interaction of a recordings folder, in scope and file order."""
    manifest = read_manifest(folder)
    interactions = []
    for order, name in enumerate(manifest.get("interactions", [])):
        path = folder / name
        try:
            value = orjson.loads(path.read_bytes())
            interaction = interaction_from_json(value, order)
            interaction.source = str(path)
            interactions.append(interaction)
        except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise FolderError(f"{path}: {exc}") from None
    return interactions


def folder_path_of(folder: Path, interaction: Interaction, index: int) -> str:
    """Where ``interaction`` lives (or would live) in ``folder``: for miss reports."""
    return str(folder / scope_dir(interaction.scope) / file_name(index, interaction))
