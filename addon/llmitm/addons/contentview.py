"""The ``llmitm`` content view in mitmproxy's UIs: a body or SSE stream of either API shown as
the assembled conversation (messages, reasoning, tool calls with pretty arguments, usage,
finish status). mitmproxy's own views (Raw, JSON) stay one click away in the view menu.

Registered by the ``LlmContentview`` addon on load. In mitmproxy and mitmweb it also turns on
``store_streamed_bodies``: a streamed body is otherwise not kept, so there would be nothing to
show. Bad input never raises into mitmproxy: the view falls back to the raw text.
"""

from __future__ import annotations

import logging

from mitmproxy import contentviews, ctx, http
from mitmproxy.addonmanager import Loader
from mitmproxy.contentviews import Contentview, Metadata

from llmitm.view.document import looks_like_json, looks_like_stream, read_document
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


class LlmitmContentview(Contentview):
    """Chat Completions and Responses bodies and streams as a conversation."""

    @property
    def name(self) -> str:
        return "llmitm"

    def prettify(self, data: bytes, metadata: Metadata) -> str:
        try:
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
