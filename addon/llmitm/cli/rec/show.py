"""``llmitm rec show``: one recording, as its legs, its full JSON, or its stream's timeline."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

from llmitm.cli.rec.common import add_source_options, find, summary
from llmitm.replay import folder as folder_format
from llmitm.replay.model import Interaction
from llmitm.view.timeline import events_from_chunks
from llmitm.view.timeline import timeline as draw_timeline
from llmitm.wire.sse import SSEDecoder, SSEEvent


def add_parser(sub: Any) -> None:
    show = sub.add_parser("show", help="one recording: its legs, or its stream's timeline")
    add_source_options(show)
    show.add_argument("id")
    show.add_argument("--timeline", action="store_true", help="each streamed event with t+ms")
    show.add_argument("--json", action="store_true")


async def command(args: argparse.Namespace, console: Console) -> int:
    interaction = await find(args, args.id)
    if args.timeline:
        return _show_timeline(args, interaction, console)
    value = folder_format.interaction_to_json(interaction)
    if args.json:
        sys.stdout.buffer.write(folder_format.dumps_pretty(value))
        return 0
    head = summary(interaction)
    for key, item in head.items():
        console.print(f"[bold]{key:>13}[/]  {item}")
    for leg in ("client_req", "upstream_req", "upstream_resp", "client_resp"):
        message = interaction.legs.get(leg)
        if message is None:
            continue
        what = f"{message.method} {message.url}" if message.method else f"HTTP {message.status}"
        size = len(message.body())
        pieces = f", {len(message.chunks)} piece(s)" if message.chunks is not None else ""
        console.print(f"[bold]{leg:>13}[/]  {what} ({size} bytes{pieces})")
    return 0


def _show_timeline(args: argparse.Namespace, interaction: Interaction, console: Console) -> int:
    events = timeline(interaction)
    if args.json:
        rows = [{"t_ms": round(t * 1000, 3), "event": e.decode("utf-8", "replace")}
                for t, e in events]  # fmt: skip
        sys.stdout.buffer.write(orjson.dumps(rows) + b"\n")
        return 0
    # The picture first (TTFT, density, stalls), then every event with its time.
    message = interaction.legs.get("client_resp") or interaction.legs.get("upstream_resp")
    chunks = [(t_us / 1e6, data) for t_us, data in (message.chunks or [])] if message else []
    console.print(draw_timeline(events_from_chunks(chunks), width=max(40, console.width - 8)))
    table = Table(title=f"{interaction.id}: {len(events)} event(s)")
    table.add_column("t+ms", justify="right")
    table.add_column("gap", justify="right")
    table.add_column("event")
    previous = 0.0
    for t, event in events:
        text = event.decode("utf-8", "replace")
        table.add_row(f"{t * 1000:.1f}", f"{(t - previous) * 1000:.1f}", text[:160])
        previous = t
    console.print(table)
    return 0


def timeline(interaction: Interaction) -> list[tuple[float, bytes]]:
    """(offset in seconds, one SSE event's bytes) of the stream the client got — what a
    timeline renderer draws. Events split across pieces take the offset of their last piece."""
    message = interaction.legs.get("client_resp") or interaction.legs.get("upstream_resp")
    if message is None or message.chunks is None:
        return []
    decoder = SSEDecoder()
    events: list[tuple[float, bytes]] = []
    for t_us, data in message.chunks:
        for event in decoder.feed(data):
            events.append((t_us / 1e6, _event_bytes(event)))
    return events


def _event_bytes(event: SSEEvent) -> bytes:
    name, data = event
    return (f"event: {name}\n".encode() if name else b"") + b"data: " + data
