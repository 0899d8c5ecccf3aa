"""mitmproxy's layers without an event queue until one is paused with an event waiting.

Every layer of a connection (``mitmproxy.proxy.layer.Layer``: the proxy mode, the HTTP
layer, each stream, the HTTP/1 server and client, the next-layer placeholder) makes a
``collections.deque`` for the events that arrive while it waits on a hook. An empty deque
is 760 bytes, a flow has six or seven layers, and almost none of them ever queues an event:
that was ~4.5 KiB of every open flow, a tenth of what plain mitmdump holds per stream.

:func:`install` replaces the attribute with a descriptor that makes the deque when it is
first needed. mitmproxy only appends to the queue while the layer is paused (reading it then
makes and keeps the deque); otherwise it only tests, iterates and pops from it, which an
empty tuple serves. Assigning an empty queue (``Layer.__init__`` does) keeps nothing. It is
pinned by ``mitmproxy < 13``; :func:`install` checks on a probe layer that the attribute is
the empty deque it expects before it applies, and otherwise logs once and leaves
mitmproxy's layers as they are.
"""

from __future__ import annotations

import collections
import types
from typing import Any

from llmitm.addons.patches.fallback import degrade

PATCH = "layer event queues made when needed"

_KEY = "_paused_event_queue"
"""Where a layer's deque is kept: under mitmproxy's own name in the layer's ``__dict__`` (the
class's descriptor is what reads it), so a layer made before the patch keeps its queue."""
_NONE_WAITING: tuple[Any, ...] = ()

try:
    from mitmproxy.proxy.layer import Layer

    MISSING: str | None = None
except ImportError as exc:  # moved in this mitmproxy
    MISSING = str(exc)


class _EventQueue:
    """``Layer._paused_event_queue``, made on the first read while the layer is paused."""

    def __get__(self, layer: Any, owner: type | None = None) -> Any:
        if layer is None:
            return self
        queue = layer.__dict__.get(_KEY)
        if queue is None:
            if layer._paused is None:
                return _NONE_WAITING
            queue = layer.__dict__[_KEY] = collections.deque()
        return queue

    def __set__(self, layer: Any, queue: Any) -> None:
        if queue:
            layer.__dict__[_KEY] = queue
        else:
            layer.__dict__.pop(_KEY, None)


def _probe_queue() -> Any:
    """The queue a new layer starts with (``Layer.__init__`` on a minimal context)."""

    class _Probe(Layer):  # type: ignore[misc]
        def _handle_event(self, event: Any) -> Any:
            yield from ()

    context = types.SimpleNamespace(layers=[], options=types.SimpleNamespace())
    probe = _Probe(context)  # type: ignore[arg-type]
    return probe.__dict__.get(_KEY), probe


def install() -> bool:
    """Apply once per process; ``False``, with one warning, when this mitmproxy's layers do
    not start with the empty deque the patch stands in for."""
    if MISSING is not None:
        degrade(PATCH, f"mitmproxy.proxy.layer.Layer ({MISSING})", "every layer keeps a deque")
        return False
    if isinstance(Layer.__dict__.get("_paused_event_queue"), _EventQueue):
        return True
    try:
        queue, probe = _probe_queue()
    except Exception as exc:  # a changed constructor: mitmproxy's layers as they are
        degrade(PATCH, f"a Layer that starts as expected ({exc!r})", "every layer keeps a deque")
        return False
    if type(queue) is not collections.deque or queue or probe._paused is not None:
        degrade(PATCH, "Layer._paused_event_queue as an empty deque", "every layer keeps a deque")
        return False
    Layer._paused_event_queue = _EventQueue()  # type: ignore[assignment]
    return True
