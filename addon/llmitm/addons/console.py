"""The live console: a rich panel per LLM stream in flight, one summary line per finished flow.

``llmitm_console``: ``live`` (panels refreshed in place, summary lines above them), ``lines``
(summary lines only), ``off``, or ``auto`` (the default): live on a terminal, lines when
stdout is not one, off with ``-q`` and in mitmproxy's own UIs (which show flows themselves,
with the llmitm content view). ``live`` without a terminal falls back to lines.

Cost on the proxy's hot path: the console watches the flow's stream owner (a plain relay
gets one that relays it as it is) with an :class:`Observer`, which times a stream's first
chunks and then becomes a plain ``list.append`` (a C call per chunk). Parsing and drawing
happen in one task on the event loop, a few times a second at most,
and less often when drawing gets expensive (drawing is kept to about 0.3% of a core), and
only streams with a panel on screen are parsed in full (the others until their first token,
and their last bytes at the end). Nothing is observed when the console is off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections import deque
from typing import Any
from urllib.parse import urlsplit

from mitmproxy import ctx, http
from mitmproxy.addonmanager import Loader
from rich.console import Group

from llmitm.addons.choices import check_choices
from llmitm.addons.patches.console_ui import front_end, redirect_output
from llmitm.addons.responses import FACTS_KEY
from llmitm.addons.sides import client_request
from llmitm.addons.state import FlowState, flow_state
from llmitm.addons.streams import flow_stream
from llmitm.exchange.request import client_model, parse_body
from llmitm.exchange.stream import StreamRewriter
from llmitm.view.conversation import assemble_body
from llmitm.view.live import TAIL_CHUNKS, FlowInfo, StreamWatch, Summary
from llmitm.view.panels import layout, live_view, summary_line
from llmitm.wire.paths import classify_path

logger = logging.getLogger(__name__)

MODES = ("auto", "live", "lines", "off")
RECORDING_KEY = "llmitm.recording"
"""Where the recorder (issue 6) leaves a flow's recording id for the summary line."""
MIN_INTERVAL_S = 0.25
MAX_INTERVAL_S = 2.0
DRAW_BUDGET = 0.003
"""The share of one core the live display may spend drawing (and reading what it draws);
slower draws refresh less often: 64 streams' rows take ~6 ms, so a refresh every two seconds."""
_now = time.time  # mitmproxy's timestamps are epoch seconds


def resolve_mode(option: str, *, terminal: bool, quiet: bool, ui: str | None) -> str:
    """The mode the console runs in. ``ui``: ``console`` (mitmproxy's TUI owns the terminal),
    ``web`` (mitmweb), ``None`` (mitmdump, llmitm run)."""
    if ui == "console":
        return "off"
    if option == "auto":
        if quiet or ui:
            return "off"
        option = "live"
    if option == "live" and (not terminal or ui):
        return "lines"
    return option


TIMED_CHUNKS = 64
"""Chunks of a stream timed one by one (the first token is among them, nearly always); later
chunks are timed when the console reads them."""


class Observer:
    """The observe hook put on llmitm's own rewriter: times and keeps a stream's first chunks,
    then replaces itself with a plain C-level ``append`` (to the watch's list, or in the lines
    mode to a bounded tail), so the rest of the stream costs one C call per chunk. The flow's
    stream callable stays the rewriter: nothing downstream (usage, cut streams) sees a wrapper.
    """

    __slots__ = (
        "_add_chunk",
        "_add_time",
        "left",
        "number",
        "pending",
        "rewriter",
        "sink",
        "tail",
        "watch",
    )

    def __init__(self, rewriter: StreamRewriter, watch: StreamWatch) -> None:
        self.rewriter = rewriter
        self.watch = watch
        self.pending = watch.pending
        self._add_time = watch.times.append
        self._add_chunk = watch.pending.append
        self.left = TIMED_CHUNKS
        # Until a panel shows the stream, only its last chunks are kept: holding (and later
        # walking) every chunk of dozens of unseen streams cost the proxy ~5% at 64 streams.
        self.tail: deque[bytes] = deque(maxlen=TAIL_CHUNKS)
        self.sink: Any = self.tail.append
        watch.follow, watch.unfollow = self.follow, self.unfollow
        self.number = rewriter.watch(self)

    def __call__(self, data: bytes) -> None:
        self._add_time(_now())
        self._add_chunk(data)
        self.left -= 1
        if not self.left:
            self.rewriter.rewatch(self.number, self.sink)

    def follow(self) -> None:
        """A panel shows the stream now: hand over every chunk from here on (the watch,
        having missed some, reassembles from the tail)."""
        if self.sink == self._add_chunk:
            return
        if self.tail:
            self.watch.behind = True
        self.merge()
        self.sink = self._add_chunk
        if not self.left:
            self.rewriter.rewatch(self.number, self.sink)

    def unfollow(self) -> None:
        """The stream lost its panel: keep only its last chunks again."""
        self.sink = self.tail.append
        if not self.left:
            self.rewriter.rewatch(self.number, self.sink)

    def merge(self) -> None:
        """Hand the kept tail to the watch, after the head (in order; untimed)."""
        if self.tail:
            self.pending += self.tail
            self.tail.clear()


def call_paths(flow: http.HTTPFlow) -> tuple[str, str]:
    """The path the client called and the one llmitm called upstream (queries left out:
    they may hold a key)."""
    upstream = urlsplit(flow.request.path).path
    client = client_request(flow)
    state = flow_state(flow)
    routed = state.routed if state is not None else None
    if routed is not None and routed.upstream_request is not None:
        upstream = urlsplit(routed.upstream_request.url).path  # the flow names the relay
    return (urlsplit(client.path).path if client is not None else upstream), upstream


def flow_info(flow: http.HTTPFlow) -> FlowInfo | None:
    """What the console says about a flow, or ``None`` for flows that are not LLM calls."""
    state = flow_state(flow)
    started = flow.request.timestamp_start or _now()
    if isinstance(state, FlowState):
        plan = state.plan
        return FlowInfo(
            client_api=plan.client_api,
            upstream_api=plan.upstream_api,
            model=state.context.model or plan.upstream_model,
            endpoint=plan.endpoint.name,
            upstream_model=plan.upstream_model,
            route=plan.route,
            started=started,
        )
    classified = classify_path(flow.request.path)
    if classified is None:
        return None
    try:
        model = client_model(parse_body(flow.request.get_content(strict=False) or b""), None)
    except Exception:
        model = ""
    return FlowInfo(
        client_api=classified.api,
        upstream_api=classified.api,
        model=model or classified.deployment or "",
        endpoint=flow.request.pretty_host,
        started=started,
    )


class LlmConsole:
    name = "llmitm_console"

    def __init__(self, out: Any = None) -> None:
        self._given_out = out  # a rich Console (tests record one); default: stdout
        self.mode = "off"
        self.infos: dict[str, FlowInfo] = {}
        self.watches: dict[str, StreamWatch] = {}
        self.taps: dict[str, Observer] = {}
        self._lines: list[Any] = []  # summary lines waiting for the live display's refresh
        self._running = False
        self._out: Any = None  # rich Console
        self._live: Any = None  # rich Live
        self._task: asyncio.Task[None] | None = None
        self._restore: list[tuple[object, str, object]] = []

    def load(self, loader: Loader) -> None:
        loader.add_option(
            "llmitm_console",
            str,
            "auto",
            "llmitm's console: live (a panel per stream in flight), lines (a summary line "
            "per flow), off; auto: live on a terminal, lines otherwise, off with -q and in "
            "mitmproxy's own UIs.",
            choices=list(MODES),
        )

    def configure(self, updated: set[str]) -> None:
        check_choices(updated, {"llmitm_console": MODES})
        if self._running and updated & {"llmitm_console", "termlog_verbosity"}:
            self._stop()
            self._start()

    def running(self) -> None:
        self._running = True
        self._start()

    def done(self) -> None:
        self._running = False
        self._stop()

    # --- flows

    def request(self, flow: http.HTTPFlow) -> None:
        if self.mode == "off":
            return
        try:
            info = flow_info(flow)
        except Exception:
            logger.debug("llmitm console: cannot describe %s", flow.id, exc_info=True)
            return
        if info is not None:
            self.infos[flow.id] = info

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        response = flow.response
        info = self.infos.get(flow.id)
        if info is None or response is None or not response.stream:
            return
        if not response.headers.get("content-type", "").startswith("text/event-stream"):
            return
        stream = flow_stream(flow)
        if stream is None:
            return
        watch = StreamWatch(info, full=False)  # the live display promotes what it shows
        self.watches[flow.id] = watch
        self.taps[flow.id] = Observer(stream, watch)

    def response(self, flow: http.HTTPFlow) -> None:
        info = self.infos.pop(flow.id, None)
        watch = self.watches.pop(flow.id, None)
        tap = self.taps.pop(flow.id, None)
        if tap is not None:
            tap.merge()
        if info is None:
            return
        try:
            self._print(self._summary(flow, info, watch))
        except Exception:
            logger.exception("llmitm console: cannot summarise %s", flow.request.pretty_url)

    def error(self, flow: http.HTTPFlow) -> None:
        self.response(flow)  # once: response() forgets the flow

    def _summary(self, flow: http.HTTPFlow, info: FlowInfo, watch: StreamWatch | None) -> Summary:
        response = flow.response
        facts = flow.metadata.get(FACTS_KEY) or {}
        attempts = facts.get("attempts", 1)  # failover's count, set with the response's head
        summary = Summary(
            info=info,
            status="",
            ok=True,
            duration=None,
            attempts=attempts if isinstance(attempts, int) else 1,
            recorded=flow.metadata.get(RECORDING_KEY),
        )
        summary.client_path, summary.upstream_path = call_paths(flow)
        end = (response.timestamp_end if response else None) or _now()
        summary.duration = max(0.0, end - info.started)
        if response is not None:
            summary.status = str(response.status_code)
            summary.ok = response.status_code < 400
        if watch is not None:
            conversation = watch.finish(end)
            summary.ttft = watch.ttft()
        elif response is not None and response.raw_content:
            conversation = _body_conversation(response)
        else:
            conversation = None
        if conversation is not None:
            summary.usage = conversation.usage
            summary.finish = conversation.finish
            if conversation.error:
                summary.ok = False
                summary.status += f" ✖ {conversation.error}"
        if flow.error is not None:
            summary.ok = False
            summary.status = f"{summary.status} error: {flow.error.msg}".strip()
        return summary

    # --- output

    def _print(self, summary: Summary) -> None:
        if self._live is not None:
            # Printed with the next refresh: each print above a live display redraws it.
            self._lines.append(summary_line(summary))
        elif self._out is not None:
            self._out.print(summary_line(summary), soft_wrap=True, highlight=False)

    def _flush_lines(self) -> None:
        if self._lines and self._out is not None:
            lines, self._lines = self._lines, []
            self._out.print(Group(*lines), soft_wrap=True, highlight=False)

    def _start(self) -> None:
        from rich.console import Console

        ui = front_end(ctx.master)
        out = self._given_out or Console(file=sys.stdout, highlight=False)
        options = ctx.options
        quiet = "termlog_verbosity" in options and options.termlog_verbosity == "error"
        self.mode = resolve_mode(
            options.llmitm_console, terminal=out.is_interactive, quiet=quiet, ui=ui
        )
        if self.mode == "off":
            return
        self._out = out
        if self.mode != "live":
            return
        from rich.live import Live

        self._live = Live(console=out, auto_refresh=False, redirect_stdout=True)
        self._live.start()
        self._redirect_mitmproxy_output()
        self._task = asyncio.get_running_loop().create_task(self._refresh())

    def _stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        for owner, attribute, value in reversed(self._restore):
            setattr(owner, attribute, value)
        self._restore.clear()
        self._flush_lines()
        if self._live is not None:
            with contextlib.suppress(Exception):
                self._live.update("", refresh=True)
                self._live.stop()
            self._live = None
        self._out = None
        self.mode = "off"

    def _redirect_mitmproxy_output(self) -> None:
        """mitmdump's log and flow lines go to the stdout they saw at start-up, which would
        write through the live display: send them through rich's proxy for stdout, which
        prints them above it."""
        self._restore += redirect_output(ctx.master, sys.stdout)

    async def _refresh(self) -> None:
        # Every tick drains the watches (cheap, and chunks are not held longer than a tick);
        # drawing waits until its cost fits the budget.
        next_draw = 0.0
        shown = False
        drawing = True
        while True:
            await asyncio.sleep(MIN_INTERVAL_S)
            started = time.thread_time()
            now = _now()
            watches = list(self.watches.values())
            if not drawing or now < next_draw:
                for watch in watches:
                    watch.drain(now)
                if not drawing:
                    self._flush_lines()
                continue
            try:
                size = self._live.console.size
                panels, _lines = layout(len(watches), size.height)
                for index, watch in enumerate(watches):
                    if index < panels and not watch.full:
                        watch.promote(now)
                    elif index >= panels and watch.full:
                        watch.demote(now)  # more streams than panels now
                    else:
                        watch.drain(now)
                self._flush_lines()
                if not watches and not shown:
                    continue
                self._live.update(live_view(watches, now, size.width, size.height), refresh=True)
                shown = bool(watches)
            except Exception:
                logger.exception("llmitm console: drawing failed; only summary lines from now")
                drawing = False
                continue
            cost = time.thread_time() - started
            next_draw = now + min(MAX_INTERVAL_S, max(MIN_INTERVAL_S, cost / DRAW_BUDGET))


def _body_conversation(response: http.Response) -> Any:
    content = response.get_content(strict=False) or b""
    if not content.lstrip().startswith(b"{"):
        return None
    import orjson

    try:
        return assemble_body(orjson.loads(content))
    except orjson.JSONDecodeError:
        return None
