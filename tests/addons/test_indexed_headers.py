"""IndexedHeaders: the same answers as mitmproxy's Headers, kept right across mutations."""

from __future__ import annotations

from mitmproxy.http import Headers

from llmitm.addons.patches.headers import IndexedHeaders

FIELDS = (
    (b"Content-Type", b"text/event-stream"),
    (b"Transfer-Encoding", b"chunked"),
    (b"x-llmitm-endpoint", b"east"),
    (b"Via", b"a"),
    (b"via", b"b"),
)


def test_get_answers_like_headers_also_after_changes() -> None:
    plain, indexed = Headers(FIELDS), IndexedHeaders(FIELDS)
    for name in ("transfer-encoding", "TRANSFER-ENCODING", "via", "missing"):
        assert indexed.get(name, "d") == plain.get(name, "d")
    for headers in (plain, indexed):
        headers["transfer-encoding"] = "identity"
        headers.pop("content-type")
        headers.add("via", "c")
    for name in ("transfer-encoding", "content-type", "via"):
        assert indexed.get(name) == plain.get(name)
    assert indexed.get("via") == "a, b, c"
    assert bytes(indexed) == bytes(plain)
