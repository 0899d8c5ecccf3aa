"""The live console: a rich panel per LLM stream in flight, one summary line per finished flow.

``llmitm_console``: ``live`` (panels refreshed in place, summary lines above them), ``lines``
(summary lines only), ``off``, or ``auto`` (the default): live on a terminal, lines when
stdout is not one, off with ``-q`` and in mitmproxy's own UIs (which show flows themselves,
with the llmitm content view). ``live`` without a terminal falls back to lines.

Cost on the proxy's hot path: the console watches the flow's stream owner (a plain relay
gets one that relays it as it is) with an :class:`~llmitm.addons.console_watch.Observer`,
which times a stream's first chunks and then becomes a plain ``list.append`` (a C call per
chunk). Drawing is :mod:`llmitm.addons.console_live`'s, and only streams with a panel on
screen are parsed in full (the others until their first token, and their last bytes at the
end). Nothing is observed when the console is off.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

from mitmproxy import ctx, http
from mitmproxy.addonmanager import Loader

from llmitm.addons.choices import check_choices
from llmitm.addons.console_live import LiveDisplay
from llmitm.addons.console_watch import Observer, call_paths, flow_info
from llmitm.addons.patches.console_ui import front_end
from llmitm.addons.record import recording_id
from llmitm.addons.stream_translator import FACTS_KEY
from llmitm.addons.streams import flow_stream
from llmitm.view.conversation import assemble_body
from llmitm.view.live import FlowInfo, StreamWatch, Summary
from llmitm.view.panels import summary_line

logger = logging.getLogger(__name__)

MODES = ("auto", "live", "lines", "off")
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


class LlmConsole:
    name = "llmitm_console"

    def __init__(self, out: Any = None) -> None:
        self._given_out = out  # a rich Console (tests record one); default: stdout
        self.mode = "off"
        self.infos: dict[str, FlowInfo] = {}
        self.watches: dict[str, StreamWatch] = {}
        self.taps: dict[str, Observer] = {}
        self._running = False
        self._out: Any = None  # rich Console
        self._display: LiveDisplay | None = None

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
            recorded=recording_id(flow),
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
        if self._display is not None:
            self._display.print(summary_line(summary))
        elif self._out is not None:
            self._out.print(summary_line(summary), soft_wrap=True, highlight=False)

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
        if self.mode == "live":
            self._display = LiveDisplay(out, self.watches)
            self._display.start(ctx.master)

    def _stop(self) -> None:
        if self._display is not None:
            self._display.stop()
            self._display = None
        self._out = None
        self.mode = "off"


def _body_conversation(response: http.Response) -> Any:
    content = response.get_content(strict=False) or b""
    if not content.lstrip().startswith(b"{"):
        return None
    import orjson

    try:
        return assemble_body(orjson.loads(content))
    except orjson.JSONDecodeError:
        return None
