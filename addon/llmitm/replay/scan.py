"""The secret scan of ``rec check-secrets``, ``rec verify`` and ``rec export``, the last
line of defence behind the redactor: credential *patterns* (the redactor's own: ``sk-`` keys, JWTs,
``Bearer`` values) plus *high-entropy tokens* — long runs of base64/url-safe characters
whose Shannon entropy is what random key material has and prose, code, paths and names
have not.

Recordings legitimately hold long random-looking strings, so some are let through by shape
or by where they sit:

- our own placeholders (``<redacted>``, ``<uuid:1>``: they hold no token characters);
- provider ids (``resp_…``, ``msg_…``, ``call_…``, ``fc_…``, ``rs_…``, ``chatcmpl-…`` …) and
  hex strings of any length (48-hex Responses ids, sha256 digests in manifests and blob
  names): hex cannot be told from a digest, and hex credentials (Azure keys) are caught by
  header and field redaction instead;
- Fernet tokens (``gAAAAA…``: reasoning ``encrypted_content``);
- values of fields that carry opaque data by design: ``encrypted_content``, ``signature``,
  the folder format's ``base64``/``b64`` bodies, and base64 ``data:`` URLs (images, files).

Pure functions over text; no I/O.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Literal

from llmitm.wire.redact import find_secrets

MIN_TOKEN = 24
"""Shorter tokens are not scanned for entropy: too many ordinary identifiers are that long."""
ENTROPY_MARGIN = 0.8
"""A token is flagged when its entropy (bits per character) reaches this share of the most a
string of its length over its alphabet can have (``log2`` of the smaller of the two)."""

# Token characters: base64 and url-safe base64 (``=`` padding only at the end).
_TOKEN = re.compile(rf"[A-Za-z0-9+/_-]{{{MIN_TOKEN},}}={{0,2}}")
_HEX = re.compile(r"[0-9a-fA-F]+")
_ID_PREFIX = re.compile(
    r"(?:resp|msg|call|fc|rs|ctc|ws|item|run|thread|asst|file|toolu|chatcmpl|cmpl|req|evt|"
    r"batch|ft|ftjob|org|proj|user|sess|conv|vs|cntr|mcp|ig|lc|ci|cu|sp|gen)[_-]"
)
_FERNET = "gAAAAA"
# A value of one of these JSON fields (as it appears just before the token), or a data URL.
_OPAQUE_CONTEXT = re.compile(
    r"(?:\"(?:encrypted_content|signature|base64|b64|b64_json|data|image_url|file_data|"
    r"partial_image_b64|result|audio|blob|sha256|digest|etag|\w*_?id|system_fingerprint)"
    r"\"\s*:\s*\"|"
    r";base64,)$"
)
_CONTEXT = 40


@dataclass(frozen=True, slots=True)
class Finding:
    kind: Literal["pattern", "entropy"]
    value: str
    offset: int

    def label(self) -> str:
        """What is shown to the user: the kind, the first six characters, the length (never
        the whole secret: a scan's output goes to CI logs)."""
        return f"{self.kind} {self.value[:6]}…({len(self.value)} chars)"


def shannon_entropy(token: str) -> float:
    """Bits per character of ``token``'s own character distribution."""
    if not token:
        return 0.0
    total = len(token)
    return -sum(n / total * math.log2(n / total) for n in Counter(token).values())


def _alphabet(token: str) -> int:
    size = 0
    if any(c.islower() for c in token):
        size += 26
    if any(c.isupper() for c in token):
        size += 26
    if any(c.isdigit() for c in token):
        size += 10
    if any(c in "+/_-=" for c in token):
        size += 2
    return size


def looks_random(token: str) -> bool:
    """Whether ``token`` has the entropy of key material: it mixes lower case, upper case and
    digits (base64 of random bytes nearly always does at this length; words, paths and
    identifiers rarely do all three) and comes near the most entropy its length allows."""
    body = token.rstrip("=")
    if len(body) < MIN_TOKEN or _HEX.fullmatch(body):
        return False
    if not (
        any(c.islower() for c in body)
        and any(c.isupper() for c in body)
        and any(c.isdigit() for c in body)
    ):
        return False
    ceiling = math.log2(min(len(body), _alphabet(body)))
    return shannon_entropy(body) >= ENTROPY_MARGIN * ceiling


def _path_like(token: str) -> bool:
    """``skills/pdf-tools/SKILL``: segments each in one case (random base64 mixes cases within
    a segment almost always)."""
    parts = [part for part in token.split("/") if part]
    return len(parts) >= 2 and all(
        not any(c.isupper() for c in part) or not any(c.islower() for c in part) for part in parts
    )


def _allowed(token: str, before: str) -> bool:
    if token.startswith(_FERNET) or _ID_PREFIX.match(token) or _path_like(token):
        return True
    return bool(_OPAQUE_CONTEXT.search(before))


def high_entropy_tokens(text: str) -> list[Finding]:
    """Random-looking tokens of ``text`` that no allowance covers."""
    found = []
    for match in _TOKEN.finditer(text):
        token = match.group(0)
        if not looks_random(token):
            continue
        before = text[max(0, match.start() - _CONTEXT) : match.start()]
        if _allowed(token, before):
            continue
        found.append(Finding("entropy", token, match.start()))
    return found


def scan_patterns(text: str) -> list[Finding]:
    """The credential patterns of ``text`` (the redactor's), in order."""
    patterns = []
    at = 0
    for value in find_secrets(text):  # in order of appearance, so each is found after the last
        at = text.find(value, at)
        patterns.append(Finding("pattern", value, at))
        at += len(value)
    return patterns


def scan_text(text: str) -> list[Finding]:
    """Every credential-shaped value of ``text``: patterns first; an entropy finding inside a
    pattern's span is the same secret and is not repeated."""
    patterns = scan_patterns(text)
    spans = [(f.offset, f.offset + len(f.value)) for f in patterns]
    entropy = [
        f
        for f in high_entropy_tokens(text)
        if not any(start <= f.offset < end or f.offset <= start < f.offset + len(f.value)
                   for start, end in spans)
    ]  # fmt: skip
    return sorted([*patterns, *entropy], key=lambda f: f.offset)
