"""The console addon in mitmproxy's test harness: which mode it picks, the tap it puts on a
stream (and takes off again), the summary line of each flow, and the live display drawn on
the event loop."""

from __future__ import annotations

import asyncio
import io
import time

import orjson
import pytest
from mitmproxy import http
from mitmproxy.addons.termlog import TermLog
from mitmproxy.test import taddons, tflow, tutils
from rich.console import Console

from llmitm.addons.console import LlmConsole, resolve_mode
from llmitm.addons.console_watch import TIMED_CHUNKS, Observer
from llmitm.addons.stream_translator import FACTS_KEY
from llmitm.exchange.stream import StreamRewriter
from llmitm.translate.context import TranslationContext
from llmitm.translate.pipeline import StreamPipeline
from llmitm.view.live import TAIL_CHUNKS

CHAT_BODY = orjson.dumps({"model": "gpt-4o", "stream": True, "messages": []})


@pytest.mark.parametrize(
    ("option", "terminal", "quiet", "ui", "mode"),
    [
        ("auto", True, False, None, "live"),
        ("auto", False, False, None, "lines"),  # not a TTY
        ("auto", True, True, None, "off"),  # -q
        ("auto", True, False, "web", "off"),  # mitmweb shows flows itself
        ("live", False, False, None, "lines"),
        ("live", True, True, None, "live"),  # asked for explicitly
        ("lines", True, False, "web", "lines"),
        ("live", True, False, "console", "off"),  # mitmproxy's TUI owns the terminal
        ("off", True, False, None, "off"),
    ],
)
def test_the_mode(option: str, terminal: bool, quiet: bool, ui: str | None, mode: str) -> None:
    assert resolve_mode(option, terminal=terminal, quiet=quiet, ui=ui) == mode


def recording(**options: object) -> Console:
    return Console(file=io.StringIO(), record=True, width=160, height=30, **options)


def chat_flow() -> http.HTTPFlow:
    flow = tflow.tflow(req=tutils.treq(path="/v1/chat/completions", content=CHAT_BODY))
    flow.request.timestamp_start = 1_750_000_000.0
    return flow


def sse_response(flow: http.HTTPFlow, stream: object = True) -> None:
    flow.response = tutils.tresp(headers=http.Headers(content_type="text/event-stream"))
    flow.response.stream = stream  # type: ignore[assignment]


def chunk(delta: dict, **extra: object) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": extra.pop("finish", None)}
    return b"data: " + orjson.dumps({"model": "gpt-4o", "choices": [choice], **extra}) + b"\n\n"


class Upper:
    """A pipeline that hands each chunk on upper-cased and ends with ``END``."""

    finished = usage = response_id = final_response = None

    def __init__(self) -> None:
        self.seen: list[bytes] = []

    def start(self) -> bytes:
        return b""

    def feed(self, data: bytes) -> bytes:
        self.seen.append(data)
        return data.upper()

    def close(self) -> bytes:
        self.seen.append(b"")
        return b"END"


def test_lines_mode_watches_a_stream_and_prints_one_summary_line() -> None:
    out = recording()
    console = LlmConsole(out)
    with taddons.context(console):
        console.running()
        assert console.mode == "lines"  # a recording console is no terminal
        flow = chat_flow()
        console.request(flow)
        upper = Upper()
        rewriter = StreamRewriter(upper)  # type: ignore[arg-type]
        sse_response(flow, rewriter)
        console.responseheaders(flow)
        assert isinstance(console.taps[flow.id], Observer)
        body = chunk({"content": "Hello"}) + chunk(
            {}, finish="stop", usage={"prompt_tokens": 7, "completion_tokens": 2}
        )
        assert rewriter(body[:20]) == [body[:20].upper()]  # translated as without a console
        assert rewriter(body[20:]) == [body[20:].upper()]
        assert rewriter(b"") == [b"END"]
        assert flow.response.stream is rewriter  # watched, never wrapped
        assert upper.seen == [body[:20], body[20:], b""]
        console.response(flow)
        console.done()
    text = out.export_text()
    assert text.count("\n") == 1
    assert "gpt-4o → address" in text and "chat pass" in text and " 200 " in text
    assert "7→2 tok" in text and "×1" in text


def test_a_plain_relay_gets_a_stream_owner_that_relays_it_as_it_is() -> None:
    console = LlmConsole(recording())
    with taddons.context(console):
        console.running()
        flow = chat_flow()
        console.request(flow)
        sse_response(flow, True)
        console.responseheaders(flow)
        stream = flow.response.stream
        assert isinstance(stream, StreamRewriter) and stream.relays_as_is
        assert stream(b"data: {}\n\n") == [b"data: {}\n\n"]
        assert stream(b"") == []  # never b"" mid-stream; nothing at the end
        assert console.watches[flow.id].pending == [b"data: {}\n\n", b""]


def test_other_flows_and_buffered_bodies_are_not_tapped() -> None:
    out = recording()
    console = LlmConsole(out)
    with taddons.context(console):
        console.running()
        other = tflow.tflow(req=tutils.treq(path="/index.html"))
        console.request(other)
        sse_response(other)
        console.responseheaders(other)
        assert other.response.stream is True
        console.response(other)
        flow = chat_flow()
        console.request(flow)
        body = {"object": "chat.completion", "model": "gpt-4o", "choices": [],
                "usage": {"prompt_tokens": 3, "completion_tokens": 4}}  # fmt: skip
        flow.response = tutils.tresp(content=orjson.dumps(body))
        console.responseheaders(flow)
        assert not flow.response.stream
        console.response(flow)
    text = out.export_text()
    assert "index.html" not in text
    assert "3→4 tok" in text and "TTFT –" in text


def test_a_failed_flow_leaves_a_red_line_once() -> None:
    out = recording()
    console = LlmConsole(out)
    with taddons.context(console):
        console.running()
        flow = chat_flow()
        console.request(flow)
        sse_response(flow)
        console.responseheaders(flow)
        flow.response.stream(chunk({"content": "Hel"}))
        flow.error = tflow.terr("Client disconnected.")
        console.error(flow)
        console.error(flow)
    text = out.export_text()
    assert text.count("error: Client disconnected.") == 1


def test_the_summary_shows_the_attempts_failover_needed() -> None:
    out = recording()
    console = LlmConsole(out)
    with taddons.context(console):
        console.running()
        flow = chat_flow()
        console.request(flow)
        flow.response = tutils.tresp(content=b"{}")
        flow.metadata[FACTS_KEY] = {"endpoint": "west", "attempts": 3, "route": "r"}
        console.response(flow)
    assert "×3" in out.export_text()


def test_quiet_turns_it_off_and_nothing_is_tapped() -> None:
    console = LlmConsole(recording())
    with taddons.context(console, TermLog(out=io.StringIO())) as tctx:
        tctx.configure(console, termlog_verbosity="error")
        console.running()
        assert console.mode == "off"
        flow = chat_flow()
        console.request(flow)
        sse_response(flow)
        console.responseheaders(flow)
        assert flow.response.stream is True


async def test_live_mode_draws_streams_in_flight_on_the_event_loop() -> None:
    out = recording(force_terminal=True, force_interactive=True)
    console = LlmConsole(out)
    with taddons.context(console, TermLog(out=io.StringIO())):
        console.running()
        assert console.mode == "live"
        flow = chat_flow()
        console.request(flow)
        sse_response(flow)
        console.responseheaders(flow)
        flow.response.stream(chunk({"reasoning_content": "Thinking it over."}))
        flow.response.stream(chunk({"content": "Streaming live"}))
        await asyncio.sleep(0.4)  # one refresh
        drawn = out.export_text(clear=False)
        assert "chat pass · gpt-4o → address" in drawn
        assert "Thinking it over." in drawn and "Streaming live" in drawn
        flow.response.stream(b"")
        console.response(flow)
        assert console.watches == {}
        console.done()
    assert "TTFT" in out.export_text()


def test_lines_mode_keeps_a_long_streams_head_and_tail_only() -> None:
    out = recording()
    console = LlmConsole(out)
    with taddons.context(console):
        console.running()
        flow = chat_flow()
        console.request(flow)
        sse_response(flow)
        console.responseheaders(flow)
        stream = flow.response.stream
        observer = console.taps[flow.id]
        assert isinstance(stream, StreamRewriter) and stream.relays_as_is
        stream(chunk({"role": "assistant", "content": ""}))
        for n in range(2000):
            stream(chunk({"content": f" w{n}"}))
        assert len(observer.pending) == TIMED_CHUNKS  # bounded: the head, timed…
        assert len(observer.tail) == TAIL_CHUNKS  # …and the last chunks
        stream(chunk({}, finish="stop", usage={"prompt_tokens": 11, "completion_tokens": 2000}))
        stream(b"")
        console.response(flow)
        # A stream that breaks off: its last chunks still tell the summary what happened.
        broken = chat_flow()
        console.request(broken)
        sse_response(broken)
        console.responseheaders(broken)
        for n in range(400):
            broken.response.stream(chunk({"content": f" w{n}"}))
        broken.response.stream(chunk({}, error={"message": "upstream overloaded"}))
        broken.error = tflow.terr("Connection killed.")
        console.error(broken)
    first, second = out.export_text().splitlines()
    assert "11→2,000 tok" in first and "TTFT " in first and "TTFT –" not in first
    assert "✖ upstream overloaded" in second and "error: Connection killed." in second


@pytest.mark.parametrize("mode", ["live", "lines"])
async def test_llmitms_rewriter_is_observed_not_wrapped(mode: str) -> None:
    out = recording(force_terminal=True, force_interactive=True) if mode == "live" else recording()
    console = LlmConsole(out)
    with taddons.context(console, TermLog(out=io.StringIO())) as tctx:
        tctx.configure(console, llmitm_console=mode)
        console.running()
        flow = chat_flow()
        console.request(flow)
        rewriter = StreamRewriter(StreamPipeline("chat-to-responses", TranslationContext()))
        sse_response(flow, rewriter)
        console.responseheaders(flow)
        watch = console.watches[flow.id]
        chunks = [chunk({"role": "assistant", "content": ""})]
        chunks += [chunk({"content": f" w{n}"}) for n in range(300)]
        chunks += [chunk({}, finish="stop", usage={"prompt_tokens": 4, "completion_tokens": 300})]
        sent = b""
        for data in [*chunks, b""]:
            stream = flow.response.stream
            sent += b"".join(stream(data))
        assert flow.response.stream is rewriter  # never wrapped: cut streams, usage see it
        assert rewriter.observe is not None and not isinstance(rewriter.observe, Observer)
        assert len(watch.times) == TIMED_CHUNKS  # timed by the observer, then as drained
        assert b"response.completed" in sent  # the client's stream is whole
        console.response(flow)
        console.done()
    (line,) = [line for line in out.export_text().splitlines() if "tok" in line]
    assert "4→300 tok" in line and "TTFT " in line and "TTFT –" not in line


async def test_an_unseen_stream_keeps_only_its_tail_until_a_panel_shows_it() -> None:
    out = recording(force_terminal=True, force_interactive=True)
    console = LlmConsole(out)
    with taddons.context(console, TermLog(out=io.StringIO())) as tctx:
        tctx.configure(console, llmitm_console="live")
        console.running()
        flow = chat_flow()
        console.request(flow)
        rewriter = StreamRewriter(StreamPipeline("chat-to-responses", TranslationContext()))
        sse_response(flow, rewriter)
        console.responseheaders(flow)
        watch = console.watches[flow.id]
        head = [chunk({"role": "assistant", "content": ""})]
        head += [chunk({"content": f" w{n}"}) for n in range(300)]
        for data in head:
            rewriter(data)
        # Unseen: the first chunks (timed, for TTFT) and a bounded tail, not all 301.
        assert len(watch.pending) == TIMED_CHUNKS
        now = time.time()
        watch.drain(now)
        assert watch.first_token is not None and not watch.full
        watch.promote(now + 1)  # a panel shows it now: every chunk from here on
        assert watch.full and watch.behind is False
        assert watch.conversation.text().endswith(" w299")  # reassembled from the tail
        for n in range(300, 320):
            rewriter(chunk({"content": f" w{n}"}))
        watch.drain(now + 2)
        assert watch.conversation.text().endswith(" w319")
        assert watch.tokens_per_second(now + 2) == pytest.approx(20.0)  # 20 events in 1 s
        watch.demote(now + 3)  # more streams than panels: back to the tail
        for n in range(320, 400):
            rewriter(chunk({"content": f" w{n}"}))
        assert not watch.full and watch.pending == []
        rewriter(chunk({}, finish="stop", usage={"prompt_tokens": 4, "completion_tokens": 400}))
        rewriter(b"")
        console.response(flow)  # the tail is handed over and the end assembled from it
        console.done()
    (line,) = [line for line in out.export_text().splitlines() if "tok" in line]
    assert "4→400 tok" in line
