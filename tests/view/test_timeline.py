"""The stream timeline renderer (for ``llmitm rec show --timeline``) through rich's recording
console: the first byte and first token, the density of events, and stalls."""

from __future__ import annotations

import orjson
from rich.console import Console

from llmitm.view.timeline import (
    TimedEvent,
    classify,
    events_from_chunks,
    facts,
    strip,
    timeline,
)


def chat(delta: dict, **extra: object) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": None}
    return b"data: " + orjson.dumps({"choices": [choice], **extra}) + b"\n\n"


def render(renderable: object, width: int = 100) -> str:
    console = Console(record=True, width=width, color_system="truecolor")
    console.print(renderable)
    return console.export_text()


def stalled_stream() -> list[tuple[float, bytes]]:
    """Role at 0.1 s, reasoning from 0.4 s, text from 0.8 s, a 2.5 s stall, more text."""
    chunks = [(0.1, chat({"role": "assistant"}))]
    chunks += [(0.4 + n * 0.02, chat({"reasoning_content": "hm"})) for n in range(10)]
    chunks += [(0.8 + n * 0.02, chat({"content": "word "})) for n in range(20)]
    chunks += [(3.7 + n * 0.02, chat({"content": "more "})) for n in range(20)]
    chunks += [(4.2, b"data: [DONE]\n\n")]
    return chunks


def test_events_take_the_time_of_the_chunk_that_completed_them() -> None:
    frame = chat({"content": "Hi"})
    events = events_from_chunks([(0.5, frame[:10]), (0.9, frame[10:] + b"data: [DONE]")])
    assert [(e.at, e.kind, e.name) for e in events] == [
        (0.9, "content", "chunk"),
        (0.9, "meta", "[DONE]"),  # flushed at the end, without its blank line
    ]


def test_both_apis_are_classified() -> None:
    assert classify({"type": "response.output_text.delta"}) == (
        "content",
        "response.output_text.delta",
    )
    assert classify({"type": "response.reasoning_summary_text.delta"})[0] == "reasoning"
    assert classify({"type": "response.function_call_arguments.delta"})[0] == "tool"
    assert classify({"type": "response.failed"})[0] == "error"
    assert classify({"choices": [{"delta": {"tool_calls": [{}]}}]})[0] == "tool"
    assert classify({"error": {"message": "x"}, "choices": []})[0] == "error"
    assert classify([1, 2]) == ("meta", "?")


def test_facts_find_ttft_and_the_stall() -> None:
    found = facts(events_from_chunks(stalled_stream()), stall=1.0)
    assert found.first_byte == 0.1
    assert found.ttft == 0.4  # reasoning counts as the first token
    assert len(found.gaps) == 1
    (gap,) = found.gaps
    assert round(gap.start, 2) == 1.18 and round(gap.end, 2) == 3.7
    assert found.longest == gap
    assert found.end == 4.2


def test_the_timeline_draws_ttft_density_and_stalls() -> None:
    text = render(timeline(events_from_chunks(stalled_stream()), width=84), width=140)
    lines = text.splitlines()
    assert lines[0].startswith("52 events in 4.20 s · first byte 100 ms · TTFT 400 ms")
    assert "longest gap 2.52 s at 1.18 s" in lines[0]
    density, markers, axis = lines[1], lines[2], lines[3]
    assert len(density) <= 84 and "█" in density
    slot = 4.2 / 84
    assert markers.index("▲") == int(0.4 / slot)  # under the first token
    stall = markers.index("━")
    assert int(1.18 / slot) < stall < int(3.7 / slot)
    assert set(density[stall : int(3.7 / slot)]) == {" "}  # nothing happened there
    assert axis.startswith("0") and axis.rstrip().endswith("4.20 s")
    assert "1 stall(s) ≥ 1.00 s: 2.52 s from 1.18 s to 3.70 s" in text
    assert "10 reasoning" in text and "40 content" in text


def test_colours_say_what_dominates_a_slot() -> None:
    events = [TimedEvent(0.1, "reasoning", "x"), TimedEvent(0.9, "content", "y")]
    density = strip(events, facts(events), 10).renderables[0]
    styles = {str(span.style) for span in density.spans}
    assert styles == {"magenta", "green"}


def test_no_stall_and_no_events() -> None:
    steady = [TimedEvent(n / 10, "content", "c") for n in range(20)]
    assert "no stall ≥ 1.00 s" in render(timeline(steady))
    assert "no events recorded" in render(timeline([]))
    only_meta = [TimedEvent(0.2, "meta", "response.created")]
    assert "TTFT –" in render(timeline(only_meta))
