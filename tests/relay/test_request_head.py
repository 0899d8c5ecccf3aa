"""The relay's own reading of a plain request head gives what h11 gives, and leaves every
other head to h11."""

from __future__ import annotations

import h11
import pytest

from llmitm.relay.request_head import plain_head


def _h11(data: bytes) -> h11.Request:
    connection = h11.Connection(h11.SERVER)
    connection.receive_data(data)
    event = connection.next_event()
    assert isinstance(event, h11.Request)
    return event


PLAIN = [
    b"POST /llmitm-relay/abc HTTP/1.1\r\nHost: 127.0.0.1:5\r\nContent-Length: 2\r\n"
    b"X-Odd:   spaced value \t\r\nAccept-Encoding: identity\r\n\r\nhi",
    b"GET /llmitm-relay/t HTTP/1.1\r\nhost: x\r\nupgrade: websocket\r\nconnection: Upgrade\r\n"
    b"sec-websocket-key: abc==\r\n\r\n",
    b"POST http://127.0.0.1:5/llmitm-relay/t HTTP/1.0\r\nhost: x\r\ncontent-length: 0\r\n\r\n",
    b"HEAD /llmitm-relay/t HTTP/1.1\r\nhost: x\r\nempty:\r\n\r\n",
]


@pytest.mark.parametrize("data", PLAIN)
def test_a_plain_head_reads_as_h11_reads_it(data: bytes) -> None:
    end = data.index(b"\r\n\r\n") + 4
    head = plain_head(data, end)
    assert head is not None
    event = _h11(data)
    assert (head.method, head.target, head.http_version) == (
        event.method,
        event.target,
        event.http_version,
    )
    assert head.headers == list(event.headers)
    assert head.head_length == end
    assert head.body_length == len(data) - end


NOT_PLAIN = [
    b"POST /t HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n",
    b"POST /t HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\ncontent-length: 2\r\n\r\n",
    b"POST /t HTTP/1.1\r\nhost: x\r\ncontent-length: -1\r\n\r\n",
    b"POST /t HTTP/1.1\r\nhost: x\r\n folded\r\n\r\n",
    b"POST /t HTTP/1.1\r\nbad name: x\r\n\r\n",
    b"POST /t HTTP/1.1\r\nname: a\rb\r\n\r\n",
    b"POST /t HTTP/2\r\nhost: x\r\n\r\n",
    b"POST  /t HTTP/1.1\r\nhost: x\r\n\r\n",
    b"\r\nPOST /t HTTP/1.1\r\nhost: x\r\n\r\n",
]


@pytest.mark.parametrize("data", NOT_PLAIN)
def test_any_other_head_is_left_to_h11(data: bytes) -> None:
    assert plain_head(data, data.index(b"\r\n\r\n") + 4) is None
