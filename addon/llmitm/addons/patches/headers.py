"""Response headers whose ``get`` is a dict lookup, for streamed flows.

mitmproxy reads ``transfer-encoding`` from the response headers for every chunk it sends an
HTTP/1 client, and ``Headers.get`` scans and decodes every field each time: a cost per event
that grows with each header (the three ``x-llmitm-*`` facts included). :class:`IndexedHeaders`
keeps an index that it rebuilds whenever the fields change. That relies on how mitmproxy's
``Headers`` stores them — one ``fields`` tuple, replaced (never changed in place) on every
mutation — which :func:`check` verifies once at start-up; when it does not hold,
:func:`indexed_headers` hands back the plain headers and each chunk pays the scan.
"""

from __future__ import annotations

from typing import Any

from mitmproxy import http

from llmitm.addons.patches.fallback import degrade

PATCH = "indexed response headers"

usable = True
"""Whether :func:`indexed_headers` indexes (false after a failed :func:`check`)."""


class IndexedHeaders(http.Headers):
    """``Headers`` with a dict behind ``get``; everything else is ``Headers``' own."""

    _seen: tuple[tuple[bytes, bytes], ...] | None = None
    _index: dict[str, str] | None = None

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        fields = self.fields
        if fields is not self._seen or self._index is None:
            index: dict[str, str] = {}
            for name_bytes, value_bytes in fields:
                name = name_bytes.decode("latin-1").lower()
                value = value_bytes.decode("utf-8", "surrogateescape")
                index[name] = f"{index[name]}, {value}" if name in index else value
            self._index, self._seen = index, fields
        return self._index.get(key.lower() if isinstance(key, str) else key, default)


def _holds() -> bool:
    """Every mutation gives the headers a new ``fields`` tuple, and the index follows it."""
    try:
        probe = IndexedHeaders([(b"Transfer-Encoding", b"chunked")])
        before = probe.fields
        seen = probe.get("transfer-encoding")
        probe["transfer-encoding"] = "identity"
        return (
            isinstance(before, tuple)
            and seen == "chunked"
            and probe.fields is not before
            and probe.get("Transfer-Encoding") == "identity"
        )
    except Exception:  # any change of Headers' shape means the index cannot be trusted
        return False


def check() -> bool:
    """The start-up check; logs once when the index cannot be kept right."""
    global usable
    usable = _holds()
    if not usable:
        degrade(
            PATCH,
            "headers that replace their fields tuple on each change",
            "streamed responses keep mitmproxy's own headers (a field scan per chunk)",
        )
    return usable


def indexed_headers(headers: http.Headers) -> http.Headers:
    """``headers`` with an indexed ``get``, or themselves when the check failed."""
    return IndexedHeaders(headers.fields) if usable else headers
