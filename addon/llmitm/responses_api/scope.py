"""Whose stored state a request may see: the credential scope of the local Responses API.

OpenAI keeps a response inside the project that created it; anyone else gets a 404 as if
it did not exist. llmitm does the same per client credential: a record keeps the
:func:`creator` of the request that made it (an HMAC fingerprint, never the credential),
and a state call or a continuation reads with :func:`reader_credential`, which is that same
fingerprint — or ``None`` (any record) when the proxy is configured ``shared``, for a
single-tenant proxy whose clients use different keys for one team.

A request without a credential is ``"anonymous"``: key-less clients of one proxy share
their state with each other, and with no one else.
"""

from __future__ import annotations

from collections.abc import Iterable

from llmitm.replay.fingerprint import credential, fingerprint
from llmitm.routing.access import ResponsesScope

ANONYMOUS = "anonymous"


def creator(headers: Iterable[tuple[str, str]], key: bytes) -> str:
    """Who a request is, as stored with what it creates: the fingerprint of its credential
    under ``key``, or :data:`ANONYMOUS`."""
    sent = credential(headers)
    return ANONYMOUS if sent is None else fingerprint(key, sent)


def reader_credential(scope: ResponsesScope, creator: str) -> str | None:
    """The ``credential`` a request reads stored state with (``None``: everyone's)."""
    return None if scope == "shared" else creator
