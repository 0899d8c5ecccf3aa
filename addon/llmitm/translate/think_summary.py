"""Raw reasoning text shown to a Responses client as reasoning summary events.

Responses servers that run open models (llama.cpp, LM Studio, vLLM) stream a model's raw
chain of thought as ``response.reasoning_text.*`` events inside a ``reasoning`` item's
``content``. Several clients show only the summary spelling (``reasoning_summary_part.*`` and
``reasoning_summary_text.*``, the item's ``summary``): the Vercel AI SDK and LangChain ignore
the raw one. Asked for (an endpoint's ``reasoning_summary``), :class:`ReasoningAsSummary`
rewrites the normaliser's conformant output, event by event:

- a ``reasoning_text`` part's ``content_part.added``/``done`` → ``reasoning_summary_part.*``;
- ``reasoning_text.delta``/``done`` → ``reasoning_summary_text.delta``/``done``;
- a reasoning item's ``content`` (in ``output_item.done`` and the terminal Response) → its
  ``summary``.

Summary indexes are given per item in the order parts start, so an upstream that sends its
own summary too keeps both apart. Every event is renumbered, since parts gain events.
:func:`response_reasoning_as_summary` does the same for a whole Response body.
"""

from __future__ import annotations

from typing import Any

from llmitm.translate.protocol import EventTranslator
from llmitm.wire.errors import ApiError

Event = dict[str, Any]

_TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})


class _Reasoning:
    """One reasoning item's parts as the client sees them: summary parts in order."""

    __slots__ = ("closed", "slots", "texts")

    def __init__(self) -> None:
        self.slots: dict[tuple[str, int], int] = {}
        """(``text`` or ``summary``, the upstream's index) → the client's summary index."""
        self.texts: list[list[str]] = []
        self.closed: set[int] = set()


class ReasoningAsSummary:
    """Wraps a Responses normaliser; its raw reasoning comes out as summary events."""

    fast_frame = None
    fast_chunk = None

    def __init__(self, inner: EventTranslator) -> None:
        self.inner = inner
        self._seq = 0
        self._items: dict[str, _Reasoning] = {}

    @property
    def finished(self) -> bool:
        return self.inner.finished

    @property
    def usage(self) -> dict[str, Any] | None:
        return self.inner.usage

    @property
    def error(self) -> ApiError | None:
        return getattr(self.inner, "error", None)

    @property
    def response_id(self) -> str | None:
        return self.inner.response_id

    def fold(self) -> None:
        fold = getattr(self.inner, "fold", None)
        if fold is not None:
            fold()

    @property
    def final_response(self) -> dict[str, Any] | None:
        return self.inner.final_response

    def feed(self, event: dict[str, Any]) -> list[Event]:
        return self._rewrite(self.inner.feed(event))

    def close(self) -> list[Event]:
        return self._rewrite(self.inner.close())

    def fail(self, error: ApiError) -> list[Event]:
        return self._rewrite(self.inner.fail(error))

    # -- rewriting ------------------------------------------------------------------------

    def _rewrite(self, events: list[Event]) -> list[Event]:
        out: list[Event] = []
        for event in events:
            self._event(event, out)
        for event in out:
            event["sequence_number"] = self._seq
            self._seq += 1
        return out

    def _event(self, event: Event, out: list[Event]) -> None:
        event_type = event.get("type")
        item_id = event.get("item_id")
        if event_type == "response.output_item.added":
            item = event.get("item")
            if isinstance(item, dict) and item.get("type") == "reasoning":
                self._items[item.get("id")] = _Reasoning()
        elif event_type == "response.output_item.done":
            item = event.get("item")
            state = self._items.get(item.get("id")) if isinstance(item, dict) else None
            if state is not None:
                self._close_all(event["item"]["id"], event.get("output_index"), state, out)
                event["item"] = _item_as_summary(event["item"], state)
        elif event_type in _TERMINAL:
            response = event.get("response")
            if isinstance(response, dict) and isinstance(response.get("output"), list):
                response["output"] = [
                    _item_as_summary(item, self._items.get(item.get("id")))
                    if isinstance(item, dict)
                    else item
                    for item in response["output"]
                ]
        elif item_id in self._items and self._reasoning_event(
            self._items[item_id], event_type, event, out
        ):
            return
        out.append(event)

    def _reasoning_event(
        self, state: _Reasoning, event_type: Any, event: Event, out: list[Event]
    ) -> bool:
        """Rewrite one event of a reasoning item into ``out``; ``False``: it goes as it is."""
        ids = {"item_id": event["item_id"], "output_index": event.get("output_index")}
        if event_type == "response.content_part.added" and _raw_part(event.get("part")):
            self._slot(state, "text", event.get("content_index", 0), ids, out)
        elif event_type == "response.reasoning_text.delta":
            slot = self._slot(state, "text", event.get("content_index", 0), ids, out)
            delta = event.get("delta") or ""
            state.texts[slot].append(delta)
            out.append(_ev("response.reasoning_summary_text.delta", ids, slot, delta=delta))
        elif event_type == "response.reasoning_text.done":
            slot = self._slot(state, "text", event.get("content_index", 0), ids, out)
            text = event.get("text")
            if isinstance(text, str):
                state.texts[slot] = [text]
            text = _text(state, slot)
            out.append(_ev("response.reasoning_summary_text.done", ids, slot, text=text))
        elif event_type == "response.content_part.done" and _raw_part(event.get("part")):
            slot = self._slot(state, "text", event.get("content_index", 0), ids, out)
            self._close(state, slot, ids, out)
        elif isinstance(event_type, str) and event_type.startswith("response.reasoning_summary_"):
            # The upstream's own summary: its indexes move past the raw parts' slots.
            index = event.get("summary_index", 0)
            slot = state.slots.get(("summary", index))
            if slot is None:
                slot = state.slots[("summary", index)] = len(state.texts)
                state.texts.append([])
            event["summary_index"] = slot
            if event_type == "response.reasoning_summary_text.delta":
                state.texts[slot].append(event.get("delta") or "")
            elif event_type == "response.reasoning_summary_text.done" and isinstance(
                event.get("text"), str
            ):
                state.texts[slot] = [event["text"]]
            elif event_type == "response.reasoning_summary_part.done":
                state.closed.add(slot)
            return False
        else:
            return False
        return True

    def _slot(
        self, state: _Reasoning, kind: str, index: Any, ids: dict[str, Any], out: list[Event]
    ) -> int:
        """The client's summary index of an upstream part; its ``part.added`` on first use."""
        key = (kind, index if isinstance(index, int) else 0)
        slot = state.slots.get(key)
        if slot is None:
            slot = state.slots[key] = len(state.texts)
            state.texts.append([])
            part = {"type": "summary_text", "text": ""}
            out.append(_ev("response.reasoning_summary_part.added", ids, slot, part=part))
        return slot

    def _close(self, state: _Reasoning, slot: int, ids: dict[str, Any], out: list[Event]) -> None:
        if slot in state.closed:
            return
        state.closed.add(slot)
        part = {"type": "summary_text", "text": _text(state, slot)}
        out.append(_ev("response.reasoning_summary_part.done", ids, slot, part=part))

    def _close_all(
        self, item_id: str, output_index: Any, state: _Reasoning, out: list[Event]
    ) -> None:
        """Parts the upstream left open when its item ended (the normaliser closes items, but
        a raw part's ``content_part.done`` may be all that was missing)."""
        ids = {"item_id": item_id, "output_index": output_index}
        for (kind, _index), slot in state.slots.items():
            if kind == "text" and slot not in state.closed:
                self._close(state, slot, ids, out)


def _ev(event_type: str, ids: dict[str, Any], slot: int, **fields: Any) -> Event:
    return {"type": event_type, "sequence_number": 0, **ids, "summary_index": slot, **fields}


def _text(state: _Reasoning, slot: int) -> str:
    return "".join(state.texts[slot])


def _raw_part(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") == "reasoning_text"


def _item_as_summary(item: dict[str, Any], state: _Reasoning | None) -> dict[str, Any]:
    """A reasoning item with its raw ``content`` moved into ``summary`` (other items as
    they are). With what streamed (``state``), the summary follows the streamed order."""
    if item.get("type") != "reasoning":
        return item
    content = item.get("content")
    raw = [part for part in content if _raw_part(part)] if isinstance(content, list) else []
    streamed = state is not None and any(kind == "text" for kind, _ in state.slots)
    if not raw and not streamed:
        return item
    rest = [part for part in content or [] if not _raw_part(part)]
    new = {key: value for key, value in item.items() if key != "content"}
    if rest:
        new["content"] = rest
    if streamed:
        new["summary"] = [
            {"type": "summary_text", "text": "".join(texts)}
            for texts in state.texts  # type: ignore[union-attr]
        ]
    else:
        summary = item.get("summary") if isinstance(item.get("summary"), list) else []
        new["summary"] = [
            *summary,
            *({"type": "summary_text", "text": part.get("text") or ""} for part in raw),
        ]
    return new


def response_reasoning_as_summary(response: dict[str, Any]) -> bool:
    """A whole Response body's reasoning items with their raw text as summary, in place;
    whether any changed."""
    output = response.get("output")
    if not isinstance(output, list):
        return False
    changed = False
    for position, item in enumerate(output):
        if isinstance(item, dict):
            new = _item_as_summary(item, None)
            if new is not item:
                output[position] = new
                changed = True
    return changed
