"""The head of a request mitmproxy sends the relay, read without h11 when it is plain.

Every relayed flow's request crosses the relay before its upstream request can start, and
h11 reads it through its event machinery (a receive buffer, a state machine, an event object
and header validation per line): measured with cProfile, a fifth of h11's share of a
failover request. mitmproxy writes these requests itself, so nearly all of them are plain:
a request line, ``name: value`` header lines, and a body framed by ``content-length`` (or
none). :func:`plain_head` reads exactly that, with h11's results (names lowercased, values
stripped of surrounding whitespace); anything else — chunked framing, a folded or malformed
line, a second ``content-length`` — answers ``None``, and the relay reads it with h11 as
before. Pure: bytes in, a parsed head out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_NAME = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
"""A header name: an HTTP token."""
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_BAD_TARGET = re.compile(rb"[\x00-\x20\x7f]")


@dataclass(slots=True)
class PlainHead:
    method: bytes
    target: bytes
    http_version: bytes
    """``b"1.1"`` or ``b"1.0"``, as h11 gives it."""
    headers: list[tuple[bytes, bytes]]
    body_length: int
    """Bytes of body after the head (``content-length``, or 0 without one)."""
    head_length: int
    """Bytes of the head, its blank line included."""


def plain_head(data: bytes, end: int) -> PlainHead | None:
    """The head in ``data[:end]`` (``end``: where its blank line ends), or ``None`` when it is
    not the plain kind this reads (h11 then reads it, and says what is wrong if anything)."""
    lines = data[: end - 4].split(b"\r\n")
    request_line = lines[0].split(b" ")
    if len(request_line) != 3:
        return None
    method, target, version = request_line
    if version == b"HTTP/1.1":
        http_version = b"1.1"
    elif version == b"HTTP/1.0":
        http_version = b"1.0"
    else:
        return None
    if not method.isalpha() or not method.isupper() or not target or _BAD_TARGET.search(target):
        return None
    headers: list[tuple[bytes, bytes]] = []
    length: int | None = None
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or _NAME.fullmatch(name) is None or _BAD_VALUE.search(value):
            return None  # a folded line, a stray CR or LF, no name: h11's to judge
        name = name.lower()
        value = value.strip(b" \t")
        if name == b"transfer-encoding":
            return None
        if name == b"content-length":
            if length is not None or not value.isdigit() or len(value) > 18:
                return None
            length = int(value)
        headers.append((name, value))
    return PlainHead(method, target, http_version, headers, length or 0, end)
