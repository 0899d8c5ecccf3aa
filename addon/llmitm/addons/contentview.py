"""The ``llmitm`` content view in mitmproxy's UIs: a body or SSE stream of either API shown as
the assembled conversation (messages, reasoning, tool calls with pretty arguments, usage,
finish status). mitmproxy's own views (Raw, JSON) stay one click away in the view menu.
On a flow llmitm translated it shows both sides, labelled (:mod:`llmitm.view.sides`): the
request tab what the client sent and what went upstream, the response tab what the upstream
answered and what the client got (:mod:`llmitm.addons.sides` keeps the upstream's side).

Registered by the ``LlmContentview`` addon on load. In mitmproxy and mitmweb it also turns on
``store_streamed_bodies``: a streamed body is otherwise not kept, so there would be nothing to
show. Bad input never raises into mitmproxy: the view falls back to the raw text.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from mitmproxy import contentviews, ctx, http
from mitmproxy.addonmanager import Loader
from mitmproxy.contentviews import Contentview, Metadata

from llmitm.exchange.sides import SIDES_KEY, UpstreamSide
from llmitm.view.document import looks_like_json, looks_like_stream, read_document
from llmitm.view.sides import (
    CLIENT_GOT,
    CLIENT_SENT,
    SENT_UPSTREAM,
    UPSTREAM_ANSWERED,
    Section,
    sides_text,
)
from llmitm.view.text import conversation_text
from llmitm.wire.paths import classify_path

logger = logging.getLogger(__name__)

PRIORITY = 2.0
"""Above mitmproxy's JSON view (1) for LLM API bodies, so "auto" picks this one."""


def _api_path(metadata: Metadata) -> bool:
    flow = metadata.flow
    if not isinstance(flow, http.HTTPFlow):
        return False
    try:
        return classify_path(flow.request.path) is not None
    except Exception:
        return False


_OBJECT_MARKERS = (b'"chat.completion', b'"object":"response"', b'"object": "response"')


def _has_object(data: bytes) -> bool:
    """A body that names its OpenAI object type, wherever it came from (a saved flow, a
    proxied path llmitm does not classify)."""
    return any(marker in data for marker in _OBJECT_MARKERS)


def _upstream_side(metadata: Metadata) -> UpstreamSide | None:
    """The upstream's side of the flow the message belongs to (live or loaded from a file)."""
    flow = metadata.flow
    if not isinstance(flow, http.HTTPFlow) or metadata.http_message is None:
        return None
    return UpstreamSide.from_state(flow.metadata.get(SIDES_KEY))


def _content_type(headers: Sequence[tuple[str, str]]) -> str:
    return next((value for name, value in headers if name.lower() == "content-type"), "")


def both_sides(data: bytes, message: http.Message, side: UpstreamSide) -> str:
    """The request tab: client sent, sent upstream; the response tab: upstream answered,
    client got (``data`` is the tab's own body, the client's)."""
    if isinstance(message, http.Request):
        sent = side.request
        client_line = f"{message.method} {message.pretty_url}"
        upstream_line = f"{sent.method} {sent.url}"
        return sides_text(
            [
                Section(CLIENT_SENT, side.client_api, client_line, data),
                Section(SENT_UPSTREAM, side.upstream_api, upstream_line, sent.body, sent.headers),
            ]
        )
    assert isinstance(message, http.Response)
    sections = []
    answered = side.response
    if answered is not None:
        kind = _content_type(answered.headers)
        line = f"{answered.status} {kind}".strip() + f" from {side.endpoint}"
        sections.append(
            Section(
                UPSTREAM_ANSWERED,
                side.upstream_api,
                line,
                answered.body,
                answered.headers,
                answered.left_out,
                answered.kept,
            )
        )
    line = f"{message.status_code} {message.headers.get('content-type', '')}".strip()
    sections.append(Section(CLIENT_GOT, side.client_api, line, data))
    return sides_text(sections)


class LlmitmContentview(Contentview):
    """Chat Completions and Responses bodies and streams as a conversation."""

    @property
    def name(self) -> str:
        return "llmitm"

    def prettify(self, data: bytes, metadata: Metadata) -> str:
        try:
            side = _upstream_side(metadata)
            if side is not None and metadata.http_message is not None:
                return both_sides(data, metadata.http_message, side)
            conversation = read_document(data)
            if conversation is not None:
                return conversation_text(conversation)
            why = "not a Chat Completions or Responses body"
        except Exception as exc:  # never into mitmproxy: show the bytes instead
            logger.debug("llmitm view failed", exc_info=True)
            why = f"could not read it ({type(exc).__name__})"
        return f"llmitm: {why}; shown raw.\n\n" + data.decode("utf-8", "replace")

    def render_priority(self, data: bytes, metadata: Metadata) -> float:
        try:
            if _upstream_side(metadata) is not None:
                return PRIORITY  # a flow llmitm translated: both of its sides
            if not data:
                return -1
            content_type = (metadata.content_type or "").lower()
            if content_type.startswith("text/event-stream"):
                return PRIORITY if looks_like_stream(data) else -1
            if (
                ("json" in content_type or not content_type)
                and looks_like_json(data)
                and (_api_path(metadata) or _has_object(data))
            ):
                return PRIORITY
        except Exception:
            logger.debug("llmitm view: render_priority failed", exc_info=True)
        return -1


VIEW = LlmitmContentview()


class LlmContentview:
    name = "llmitm_contentview"

    def load(self, loader: Loader) -> None:
        contentviews.add(VIEW)

    def running(self) -> None:
        # mitmproxy and mitmweb keep flows for people to look at (their master has a "view"
        # addon; mitmdump's has not): keep streamed bodies there too, or the view has nothing.
        options = ctx.options
        if (
            ctx.master.addons.get("view") is not None
            and "store_streamed_bodies" in options
            and not options.store_streamed_bodies
        ):
            ctx.options.update(store_streamed_bodies=True)
            logger.info("llmitm: store_streamed_bodies on, so streamed bodies can be viewed")
