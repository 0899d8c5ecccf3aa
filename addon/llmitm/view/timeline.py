"""A stream's events drawn against time, for ``llmitm rec show --timeline``: when the first
byte and the first token came, how the events spread, where the stream stalled.

Sans-IO: timed chunks (seconds since the request started, bytes as they arrived — what a
recording keeps) in, a rich renderable out.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from llmitm.view.panels import seconds
from llmitm.wire.sse import DONE_DATA, SSEDecoder

Kind = Literal["content", "reasoning", "tool", "error", "meta"]
KIND_STYLES: dict[Kind, str] = {
    "content": "green",
    "reasoning": "magenta",
    "tool": "cyan",
    "error": "bold red",
    "meta": "blue",
}
BARS = " ▁▂▃▄▅▆▇█"
DEFAULT_STALL_S = 1.0


@dataclass(frozen=True, slots=True)
class TimedEvent:
    at: float
    """Seconds since the request started."""
    kind: Kind
    name: str


_RESPONSES_KINDS: dict[str, Kind] = {
    "response.output_text.delta": "content",
    "response.refusal.delta": "content",
    "response.reasoning_text.delta": "reasoning",
    "response.reasoning_summary_text.delta": "reasoning",
    "response.function_call_arguments.delta": "tool",
    "response.custom_tool_call_input.delta": "tool",
    "response.failed": "error",
    "error": "error",
}


def classify(event: Any) -> tuple[Kind, str]:
    """What one parsed event of either API carries."""
    if not isinstance(event, dict):
        return "meta", "?"
    event_type = event.get("type")
    if isinstance(event_type, str):
        return _RESPONSES_KINDS.get(event_type, "meta"), event_type
    if event.get("error"):
        return "error", "error"
    for choice in event.get("choices") or ():
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if not isinstance(delta, dict):
            continue
        if delta.get("tool_calls"):
            return "tool", "chunk"
        if delta.get("reasoning_content") or delta.get("reasoning"):
            return "reasoning", "chunk"
        if delta.get("content") or delta.get("refusal"):
            return "content", "chunk"
    return "meta", "chunk"


def events_from_chunks(chunks: Iterable[tuple[float, bytes]]) -> list[TimedEvent]:
    """Timed SSE chunks (split anywhere) into timed events: an event is as late as the
    chunk that completed it."""
    decoder = SSEDecoder()
    events: list[TimedEvent] = []
    last = 0.0
    for at, data in chunks:
        last = at
        for _name, payload in decoder.feed(data):
            events.append(_event(at, payload))
    events += [_event(last, payload) for _name, payload in decoder.close()]
    return events


def _event(at: float, payload: bytes) -> TimedEvent:
    if payload == DONE_DATA:
        return TimedEvent(at, "meta", "[DONE]")
    try:
        kind, name = classify(orjson.loads(payload))
    except orjson.JSONDecodeError:
        kind, name = "error", "(malformed)"
    return TimedEvent(at, kind, name)


@dataclass(frozen=True, slots=True)
class Gap:
    start: float
    end: float

    @property
    def length(self) -> float:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class Facts:
    first_byte: float | None
    ttft: float | None
    end: float
    gaps: list[Gap]
    """Silences after the first token of at least the stall threshold, longest first."""
    longest: Gap | None
    median_gap: float | None


def facts(events: Sequence[TimedEvent], stall: float = DEFAULT_STALL_S) -> Facts:
    first_byte = events[0].at if events else None
    ttft = next((e.at for e in events if e.kind in ("content", "reasoning", "tool")), None)
    end = events[-1].at if events else 0.0
    after = [e.at for e in events if ttft is not None and e.at >= ttft]
    gaps = [Gap(a, b) for a, b in itertools.pairwise(after) if b > a]
    longest = max(gaps, key=lambda gap: gap.length, default=None)
    intervals = [b - a for a, b in itertools.pairwise(after)]
    return Facts(
        first_byte=first_byte,
        ttft=ttft,
        end=end,
        gaps=sorted((g for g in gaps if g.length >= stall), key=lambda g: -g.length),
        longest=longest,
        median_gap=statistics.median(intervals) if intervals else None,
    )


def strip(events: Sequence[TimedEvent], found: Facts, width: int) -> Group:
    """Three rows: event density per time slot (coloured by what dominates it), markers
    (▲ first token, ━ stalls), and the time axis."""
    span = max(found.end, 1e-3)
    slot = span / width

    def column(at: float) -> int:
        return min(width - 1, int(at / slot))

    counts = [0] * width
    kinds: list[dict[Kind, int]] = [{} for _ in range(width)]
    for event in events:
        index = column(event.at)
        counts[index] += 1
        kinds[index][event.kind] = kinds[index].get(event.kind, 0) + 1
    peak = max(counts) or 1
    density = Text()
    for count, seen in zip(counts, kinds, strict=True):
        if not count:
            density.append(" ")
            continue
        level = max(1, round(count / peak * (len(BARS) - 1)))
        dominant: Kind = "error" if "error" in seen else max(seen, key=seen.__getitem__)
        density.append(BARS[level], style=KIND_STYLES[dominant])
    marks = [" "] * width
    styles = [""] * width
    for gap in found.gaps:
        for index in range(column(gap.start) + 1, column(gap.end)):
            marks[index], styles[index] = "━", "bold red"
    if found.ttft is not None:
        marks[column(found.ttft)], styles[column(found.ttft)] = "▲", "bold yellow"
    markers = Text()
    for mark, style in zip(marks, styles, strict=True):
        markers.append(mark, style=style)
    left, right = "0", seconds(found.end)
    axis = Text(left + " " * max(1, width - len(left) - len(right)) + right, style="dim")
    return Group(density, markers, axis)


def timeline(
    events: Sequence[TimedEvent], *, width: int = 72, stall: float = DEFAULT_STALL_S
) -> RenderableType:
    """The whole picture: a facts line, the strip, a legend and the stalls."""
    if not events:
        return Text("no events recorded", style="dim")
    found = facts(events, stall)
    head = Text()
    head.append(f"{len(events)} events in {seconds(found.end)}")
    head.append(f" · first byte {seconds(found.first_byte)}")
    head.append(f" · TTFT {seconds(found.ttft)}", style="bold yellow")
    if found.median_gap is not None:
        head.append(f" · median gap {seconds(found.median_gap)}")
    if found.longest is not None:
        head.append(
            f" · longest gap {seconds(found.longest.length)} at {seconds(found.longest.start)}"
        )
    stalls = Text()
    if found.gaps:
        stalls.append(f"{len(found.gaps)} stall(s) ≥ {seconds(stall)}: ", style="bold red")
        stalls.append(
            ", ".join(
                f"{seconds(g.length)} from {seconds(g.start)} to {seconds(g.end)}"
                for g in found.gaps
            )
        )
    else:
        stalls.append(f"no stall ≥ {seconds(stall)}", style="dim")
    legend = Text()
    legend.append("legend: ", style="dim")
    for kind, style in KIND_STYLES.items():
        legend.append(f"■ {kind} ", style=style)
    legend.append("▲ first token ", style="bold yellow")
    legend.append("━ stall", style="bold red")
    parts: list[RenderableType] = [head, strip(events, found, width), legend, stalls]
    tally = Table.grid(padding=(0, 2))
    counted: dict[Kind, int] = {}
    for event in events:
        counted[event.kind] = counted.get(event.kind, 0) + 1
    tally.add_row(*(Text(f"{n} {kind}", style=KIND_STYLES[kind]) for kind, n in counted.items()))
    parts.append(tally)
    return Group(*parts)
