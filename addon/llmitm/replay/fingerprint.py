"""Which credential a recorded request carried, without keeping it: an HMAC fingerprint.

A recording keeps ``authorization: Bearer <redacted>``, which says *that* a key was sent but
not *which* — and "which key did CI use when it recorded this 401?" is a fair question. The
fingerprint is HMAC-SHA256 of the credential under a random 256-bit key made with the store's
schema and kept only in that (owner-only) database: one key always gives one fingerprint in
that database, and the fingerprint reveals nothing about the key (a plain hash of a short
token could be brute-forced; this cannot without the database's own key). It stays in the
database: folders, HAR and flow exports never carry it.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

CREDENTIAL_HEADERS = (
    "authorization",
    "api-key",
    "x-api-key",
    "ocp-apim-subscription-key",
    "x-goog-api-key",
    "anthropic-api-key",
)
"""Where clients put their credential, in the order one is looked for."""
PREFIX = "hmac:"


def credential(headers: Iterable[tuple[str, str]]) -> str | None:
    """The request's credential (a bearer token without its scheme), if it sent one."""
    found = {name.lower(): value for name, value in headers if name.lower() in CREDENTIAL_HEADERS}
    for name in CREDENTIAL_HEADERS:
        value = found.get(name, "").strip()
        scheme, _, token = value.partition(" ")
        if name == "authorization" and token and scheme.lower() in ("bearer", "basic"):
            value = token.strip()
        if value:
            return value
    return None


def fingerprint(key: bytes, credential: str) -> str:
    """``hmac:`` and 16 hex digits: short to read, long enough never to collide by chance."""
    digest = hmac.new(key, credential.encode("utf-8", "surrogateescape"), hashlib.sha256)
    return PREFIX + digest.hexdigest()[:16]
