"""Rich renderables of the live console: a panel per stream in flight, compact rows when the
terminal cannot hold a panel for each, and the one summary line a finished flow leaves.

Pure functions of the console's state and the time (passed in), so they are tested through a
recording console. Rendering cost is bounded by the screen, not by the streams: a panel only
ever lays out the tail of its text that fits.
"""

from __future__ import annotations

import io
import time
from collections.abc import Sequence

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.text import Text

from llmitm.view.conversation import Block, Conversation
from llmitm.view.live import StreamWatch, Summary
from llmitm.view.text import pretty_arguments

STYLES = {
    "text": "",
    "reasoning": "dim italic",
    "refusal": "red",
    "tool_call": "cyan",
    "tool_result": "green",
    "other": "dim",
}
MAX_PANEL_LINES = 6
MIN_PANEL_LINES = 1
_MEASURE = Console(width=1000, color_system=None, file=io.StringIO())
"""Only measures text for wrapping; never prints."""


def seconds(value: float | None) -> str:
    if value is None:
        return "–"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    return f"{value:.2f} s"


def _block_text(block: Block, budget: int) -> Text:
    if block.kind == "tool_call":
        arguments = block.text
        if len(arguments) <= budget:
            arguments = pretty_arguments(arguments)
        text = Text(f"⚙ {block.name or '?'}(", style="bold cyan")
        text.append(arguments[-budget:], style=STYLES["tool_call"])
        text.append(")", style="bold cyan")
        return text
    return Text(block.text[-budget:], style=STYLES.get(block.kind, ""))


def conversation_tail(conversation: Conversation, width: int, lines: int) -> Text:
    """The last ``lines`` lines (wrapped at ``width``) of the assistant's blocks, styled."""
    budget = max(1, width * lines)
    chosen: list[Text] = []
    used = 0
    for block in reversed(conversation.blocks):
        if used >= budget:
            break
        text = _block_text(block, budget - used)
        chosen.append(text)
        used += len(text.plain) + width  # a block starts on a line of its own
    if not chosen:
        waiting = "(waiting for the first token…)"
        if conversation.error:
            waiting = ""
        chosen.append(Text(waiting, style="dim"))
    if conversation.error:
        chosen.insert(0, Text(f"✖ {conversation.error}", style="bold red"))
    body = Text("\n").join(reversed(chosen))
    wrapped = body.wrap(_MEASURE, width)
    tail = wrapped[-lines:]
    return Text("\n").join(tail)


def stream_title(watch: StreamWatch) -> Text:
    info = watch.info
    title = Text()
    title.append(info.translation, style="bold")
    title.append(" · ")
    title.append(info.target, style="bold magenta")
    return title


def stream_facts(watch: StreamWatch, now: float) -> str:
    rate = watch.tokens_per_second(now)
    parts = [
        f"TTFT {seconds(watch.ttft())}",
        f"{rate:.0f} tok/s" if rate is not None else "– tok/s",
        seconds(watch.elapsed(now)),
    ]
    finish = watch.conversation.finish
    if finish:
        parts.append(finish)
    return " · ".join(parts)


def stream_panel(watch: StreamWatch, now: float, width: int, lines: int) -> Panel:
    inner = max(10, width - 4)
    return Panel(
        conversation_tail(watch.conversation, inner, lines),
        title=stream_title(watch),
        title_align="left",
        subtitle=stream_facts(watch, now),
        subtitle_align="right",
        border_style="red" if watch.conversation.error else "blue",
        width=width,
        height=lines + 2,
    )


def compact_row(watch: StreamWatch, now: float, width: int) -> Text:
    row = stream_title(watch)
    row.append(f"  {stream_facts(watch, now)}", style="dim")
    if watch.full:  # a stream without a panel is not assembled: its facts only
        row.append("  " + watch.conversation.text()[-width:].replace("\n", " "))
    row.truncate(width, overflow="ellipsis")
    return row


def layout(count: int, height: int) -> tuple[int, int]:
    """``(panels, lines)``: how many of ``count`` streams get a panel within ``height`` rows,
    and how many lines of text each panel shows; the rest get a row each."""
    height = max(3, height - 1)
    lines = min(MAX_PANEL_LINES, max(MIN_PANEL_LINES, height // max(1, count) - 2))
    panels = min(count, max(0, height // (lines + 2)))
    # Leave a row for each stream without a panel, then take back panels until all fit.
    while panels and panels * (lines + 2) + (count - panels) > height:
        panels -= 1
    return panels, lines


def live_view(
    watches: Sequence[StreamWatch], now: float, width: int, height: int
) -> RenderableType:
    """Panels for the streams in flight that fit in ``height`` rows (oldest first, each as
    tall as the space allows), compact rows for the rest, and a count of what did not fit."""
    if not watches:
        return Text("llmitm: no streams in flight", style="dim")
    panels, lines = layout(len(watches), height)
    parts: list[RenderableType] = [
        stream_panel(watch, now, width, lines) for watch in watches[:panels]
    ]
    rest = watches[panels:]
    room = max(3, height - 1) - panels * (lines + 2)
    shown = rest if len(rest) <= room else rest[: max(0, room - 1)]
    if shown:
        # One Text for all rows: rich lays out one renderable instead of dozens.
        rows = Text("\n").join(compact_row(watch, now, width) for watch in shown)
        rows.no_wrap = True
        rows.overflow = "ellipsis"
        parts.append(rows)
    if len(shown) < len(rest):
        parts.append(Text(f"… and {len(rest) - len(shown)} more streams", style="dim"))
    return Group(*parts)


def summary_line(summary: Summary) -> Text:
    """time, route, model → endpoint, translation, the client's path (→ the upstream's),
    status, TTFT, duration, tokens in/out, attempts, recorded id — one line per finished
    flow."""
    info = summary.info
    line = Text()
    line.append(time.strftime("%H:%M:%S", time.localtime(info.started)), style="dim")
    if info.route:
        line.append(f" [{info.route}]", style="dim")
    line.append(f" {info.target}", style="magenta")
    line.append(f" {info.translation}")
    if summary.client_path:
        line.append(f" {summary.client_path}")
        if summary.upstream_path and summary.upstream_path != summary.client_path:
            line.append(f"→{summary.upstream_path}", style="dim")
    line.append(f" {summary.status}", style="green" if summary.ok else "bold red")
    if summary.finish and summary.finish not in ("stop", "completed"):
        line.append(f" ({summary.finish})", style="yellow")
    line.append(f" TTFT {seconds(summary.ttft)}")
    line.append(f" {seconds(summary.duration)}")
    if summary.usage:
        line.append(f" {summary.usage[0]:,}→{summary.usage[2]:,} tok")
    else:
        line.append(" –→– tok", style="dim")
    line.append(f" ×{summary.attempts}", style="bold yellow" if summary.attempts > 1 else "dim")
    if summary.recorded:
        line.append(f" rec {summary.recorded}", style="cyan")
    return line
