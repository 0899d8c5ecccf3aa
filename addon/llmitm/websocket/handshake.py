"""The opening handshake of a WebSocket llmitm serves itself, and the refusal that sends a
client back to HTTPS.

Codex falls back from its WebSocket transport to HTTPS POSTs at once when the upgrade is
answered ``426 Upgrade Required``; any other refusal makes it retry for seconds first.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable

import orjson

from llmitm.wire.errors import ApiError, openai_error_body

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
# The handshake's own headers; they mean nothing on the HTTP calls made for the socket.
SOCKET_HEADERS = frozenset(
    {
        "upgrade",
        "connection",
        "sec-websocket-key",
        "sec-websocket-version",
        "sec-websocket-extensions",
        "sec-websocket-protocol",
        "sec-websocket-accept",
    }
)
_BETA_HEADER = "openai-beta"
_BETA_FEATURE = "responses_websockets"


def is_upgrade(headers: Iterable[tuple[str, str]]) -> bool:
    """Whether a request's headers ask to upgrade to a WebSocket."""
    for name, value in headers:
        if name.lower() == "upgrade" and value.strip().lower() == "websocket":
            return True
    return False


def accept_key(client_key: str) -> str:
    """``Sec-WebSocket-Accept`` for the client's ``Sec-WebSocket-Key`` (RFC 6455 §4.2.2)."""
    digest = hashlib.sha1(client_key.strip().encode("ascii") + _GUID).digest()
    return base64.b64encode(digest).decode("ascii")


def switching_protocols(client_key: str) -> bytes:
    """The ``101`` head that opens the socket (no extension, no subprotocol)."""
    return (
        b"HTTP/1.1 101 Switching Protocols\r\n"
        b"upgrade: websocket\r\n"
        b"connection: Upgrade\r\n"
        b"sec-websocket-accept: " + accept_key(client_key).encode("ascii") + b"\r\n\r\n"
    )


def refusal(reason: str) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and OpenAI-shaped body that refuse the upgrade so the client uses
    HTTPS right away."""
    error = ApiError(
        message=f"llmitm does not serve this WebSocket ({reason}); use HTTPS.",
        type="invalid_request_error",
        code="websocket_not_served",
        status=426,
    )
    return 426, {"content-type": "application/json"}, orjson.dumps(openai_error_body(error))


def call_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The handshake's headers as they go on each HTTP call made for the socket: the
    client's credentials and metadata, without the handshake's own headers and without the
    beta flag that asked for the socket."""
    kept: list[tuple[str, str]] = []
    for name, value in headers:
        lower = name.lower()
        if lower in SOCKET_HEADERS or lower in ("content-length", "content-type", "accept"):
            continue
        if lower == _BETA_HEADER:
            value = ",".join(
                part for part in value.split(",") if not part.strip().startswith(_BETA_FEATURE)
            )
            if not value.strip():
                continue
        kept.append((name, value))
    kept.append(("content-type", "application/json"))
    kept.append(("accept", "text/event-stream"))
    return kept
