"""What the recording addons keep per flow, and the small flow helpers they share.

One :class:`Capture` per recorded or replayed flow, written by the flow recorder (before the
router) and read by the record tap (after the translator).
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass

from mitmproxy import http

from llmitm.replay.capture import ClientRequest, Headers, RawHeaders, see_request
from llmitm.replay.keys import KeyOptions, MatchKey
from llmitm.replay.memo import RequestMemo
from llmitm.replay.model import Message
from llmitm.replay.pool import Hit
from llmitm.replay.tap import StreamTap
from llmitm.wire.redact import redact_headers, redact_url


def now_us() -> int:
    return time.time_ns() // 1000


def fields(headers: http.Headers) -> RawHeaders:
    """``headers`` as they are now, decoded only when read (a reference, not a copy)."""
    return RawHeaders(headers.fields)


@dataclass(frozen=True, slots=True)
class SentRequest:
    """The request the router sent upstream, as references to the flow's own values; made
    the recording's ``upstream_req`` leg (head redacted) by :meth:`Capture.see_sent`."""

    method: str
    url: str
    headers: Headers
    content: bytes | None


@dataclass(slots=True)
class Capture:
    """What the recorder learns about one flow between its hooks
    (a :class:`llmitm.replay.capture.Captured` once :meth:`see` has run)."""

    scope: str
    key: MatchKey | None
    """``None`` until :meth:`see` has run (record mode: at the flow's end, off the request
    path)."""
    client_req: Message | None
    started_us: int
    record: bool = False
    hit: Hit | None = None
    forwarded: bool = False
    upstream_req: Message | None = None
    """The upstream leg, its head redacted (made of :attr:`upstream_sent` by
    :meth:`see_sent`; the body is redacted when the record is built)."""
    upstream_sent: SentRequest | None = None
    upstream_status: int = 0
    upstream_headers: Headers = ()
    upstream_body: bytes | None = None
    tap: StreamTap | None = None
    done: bool = False
    served: bool = False
    request_clean: bool = False
    """The client's request body held nothing to redact (a translated answer echoes it)."""
    credential: str | None = None
    """The fingerprint of the credential the client sent."""
    recorded: str | None = None
    """The id of the interaction recorded from this flow, once it is."""
    unseen: ClientRequest | None = None
    """The client's request as it came, until :meth:`see` redacts and keys it."""
    key_options: KeyOptions | None = None
    fingerprint_key: bytes | None = None
    memo: RequestMemo | None = None
    """The recorder's parts of earlier bodies (a resent history is not walked again)."""

    def see(self) -> None:
        """Redact and key the client's request (a no-op once done): CPU-heavy for a big body,
        so record mode runs it off the event loop, once the flow has ended."""
        request, self.unseen = self.unseen, None
        if request is None:
            return
        options = self.key_options or KeyOptions()
        seen = see_request(request, options, self.fingerprint_key, self.memo)
        self.key, self.client_req = seen.key, seen.message
        self.request_clean, self.credential = seen.clean, seen.credential

    def see_sent(self) -> None:
        """Make :attr:`upstream_req` of what was sent upstream (off the event loop, with
        :meth:`see`; a no-op once done)."""
        sent, self.upstream_sent = self.upstream_sent, None
        if sent is not None:
            self.upstream_req = Message(
                headers=redact_headers(sent.headers),
                content=sent.content,
                method=sent.method,
                url=redact_url(sent.url),
            )


# Per-flow state lives beside the flow, not in flow.metadata: mitmproxy serialises metadata
# when it saves flows (-w, save_stream_file, mitmweb), and a Capture is not serialisable.
# Weak keys: a flow that ends in any way takes its capture with it.
_CAPTURES: weakref.WeakKeyDictionary[http.HTTPFlow, Capture] = weakref.WeakKeyDictionary()


def capture_of(flow: http.HTTPFlow) -> Capture | None:
    return _CAPTURES.get(flow)


def keep_capture(flow: http.HTTPFlow, capture: Capture) -> None:
    _CAPTURES[flow] = capture


def replay_hit(flow: http.HTTPFlow) -> bool:
    """Whether the recorder answers ``flow`` from a recording (some hits are served by
    :class:`~llmitm.addons.record.tap.LlmRecordTap`, after the router)."""
    capture = _CAPTURES.get(flow)
    return capture is not None and capture.hit is not None


def recording_id(flow: http.HTTPFlow) -> str | None:
    """The id of the interaction recorded from ``flow`` (``None``: not recorded, or not yet:
    it is recorded in :class:`~llmitm.addons.record.tap.LlmRecordTap`'s ``response`` or
    ``error`` hook)."""
    capture = _CAPTURES.get(flow)
    return None if capture is None else capture.recorded


def answer(
    flow: http.HTTPFlow,
    status: int,
    headers: list[tuple[str, str]],
    body: bytes,
    replay: str | None,
) -> None:
    """Answer ``flow`` here (``replay``: the ``x-llmitm-replay`` header's value)."""
    response = http.Response.make(status, body, [(k.encode(), v.encode()) for k, v in headers])
    if replay:
        response.headers["x-llmitm-replay"] = replay
    flow.response = response
