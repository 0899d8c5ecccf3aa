"""``llmitm rec show``: one recording as the conversation it holds (the content view's
rendering of what the client sent and got), its legs' heads and bodies (``--raw``), its full
JSON (``--json``) or its stream's timeline (``--timeline``)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

from llmitm.cli.rec.common import add_source_options, find, summary
from llmitm.replay import folder as folder_format
from llmitm.replay.model import LEGS, Interaction, Message
from llmitm.view.document import read_document
from llmitm.view.text import conversation_text
from llmitm.view.timeline import events_from_chunks
from llmitm.view.timeline import timeline as draw_timeline
from llmitm.wire.sse import SSEDecoder, SSEEvent


def add_parser(sub: Any) -> None:
    show = sub.add_parser(
        "show",
        help="one recording: its conversation, its raw legs, its JSON, or its stream's timeline",
        description="Show one recording: by default the conversation the client sent and got.",
        epilog="example: llmitm rec show 66196a2f   (an id prefix rec ls printed)",
    )
    add_source_options(show)
    show.add_argument("id", help="a recording's id, or a prefix only it starts with")
    view = show.add_mutually_exclusive_group()
    view.add_argument("--raw", action="store_true", help="each leg's head, headers and body")
    view.add_argument("--json", action="store_true", help="the recording as a folder stores it")
    show.add_argument("--timeline", action="store_true", help="each streamed event with t+ms")


async def command(args: argparse.Namespace, console: Console) -> int:
    interaction = await find(args, args.id)
    if args.timeline:
        return _show_timeline(args, interaction, console)
    value = folder_format.interaction_to_json(interaction)
    if args.json:
        sys.stdout.buffer.write(folder_format.dumps_pretty(value))
        return 0
    if args.raw:
        _show_raw(interaction, console)
        return 0
    console.print(conversation(interaction), markup=False, soft_wrap=True, end="")
    return 0


def conversation(interaction: Interaction) -> str:
    """The recording as people read it: one line about the call, then what the client sent
    and what it got, each rendered as the content view renders a body."""
    call = f"{interaction.method} {interaction.route}" + (" (stream)" if interaction.stream else "")
    lines = [
        f"{interaction.id} · {interaction.scope} · {call} · model {interaction.model or '-'} "
        f"· {interaction.plan or 'passthrough'} · HTTP {interaction.status}"
        + (f" · cut: {interaction.truncated}" if interaction.truncated else ""),
    ]
    for title, leg in (("client sent", "client_req"), ("client got", "client_resp")):
        message = interaction.legs.get(leg)
        if leg == "client_resp" and message is None:
            message = interaction.legs.get("upstream_resp")
        lines += ["", f"══ {title} " + "═" * 50]
        lines.append(_rendered(message))
    lines.append("(headers and bodies of all four legs: --raw)")
    return "\n".join(lines) + "\n"


def _rendered(message: Message | None) -> str:
    if message is None:
        return "(not recorded)"
    body = message.body()
    found = read_document(body)
    if found is None:
        return f"({len(body)} bytes that are no Chat Completions or Responses body; see --raw)"
    return conversation_text(found, events=False).rstrip("\n")


def _show_raw(interaction: Interaction, console: Console) -> None:
    for key, item in summary(interaction).items():
        console.print(f"[bold]{key:>13}[/]  {item}")
    for leg in LEGS:
        message = interaction.legs.get(leg)
        if message is None:
            continue
        what = f"{message.method} {message.url}" if message.method else f"HTTP {message.status}"
        body = message.body()
        pieces = f", {len(message.chunks)} piece(s)" if message.chunks is not None else ""
        console.print(f"\n[bold]── {leg}[/]  {what} ({len(body)} bytes{pieces})")
        for name, value in message.headers:
            console.print(f"{name}: {value}", markup=False, soft_wrap=True)
        if body:
            console.print("")
            console.print(body.decode("utf-8", "replace"), markup=False, soft_wrap=True)


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
