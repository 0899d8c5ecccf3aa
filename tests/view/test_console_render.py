"""The live console's rendering, through rich's recording console: a text stream, reasoning
then text, parallel tool calls, an error mid-stream, 20 concurrent streams; and the summary
line. Streams are fed as the tap hands them over: timed chunks, split anywhere."""

from __future__ import annotations

import orjson
from rich.console import Console
from rich.text import Text

from llmitm.view.live import FlowInfo, StreamWatch, Summary
from llmitm.view.panels import conversation_tail, live_view, stream_panel, summary_line

T0 = 1_750_000_000.0


def chat_chunk(delta: dict, finish: str | None = None, **extra: object) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "gpt-4o"}
    return b"data: " + orjson.dumps({**chunk, "choices": [choice], **extra}) + b"\n\n"


def responses_event(event: dict) -> bytes:
    return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


def watch(
    client: str = "chat", upstream: str = "chat", model: str = "gpt-4o", endpoint: str = "openai"
) -> StreamWatch:
    info = FlowInfo(client, upstream, model, endpoint, route="default", started=T0)
    return StreamWatch(info)


def feed(w: StreamWatch, chunks: list[bytes], start: float = 0.3, step: float = 0.1) -> None:
    for index, chunk in enumerate(chunks):
        w.add(T0 + start + index * step, chunk)
    w.drain()


def render(renderable: object, width: int = 80, height: int = 40) -> str:
    console = Console(record=True, width=width, height=height, color_system="truecolor")
    console.print(renderable)
    return console.export_text()


def styles_of(text: Text, needle: str) -> set[str]:
    """The styles of the spans that cover ``needle`` in ``text``."""
    start = text.plain.index(needle)
    end = start + len(needle)
    return {str(span.style) for span in text.spans if span.start <= start and span.end >= end}


def test_a_text_stream_shows_its_text_ttft_and_rate() -> None:
    w = watch()
    role, hello = chat_chunk({"role": "assistant", "content": ""}), chat_chunk({"content": "Hé"})
    rest = chat_chunk({"content": "llo from the"}) + chat_chunk({"content": " fake upstream."})
    split = hello.index("é".encode()) + 1  # inside the UTF-8 sequence
    # Split anywhere, as the upstream's reads are: the first delta completes in the third.
    chunks = [role[:7], role[7:] + hello[:split], hello[split:] + rest[:50], rest[50:]]
    feed(w, chunks, start=0.25)
    now = T0 + 1.0
    text = render(stream_panel(w, now, 80, 4))
    assert "chat pass · gpt-4o → openai" in text
    assert "Héllo from the fake upstream." in text
    assert "TTFT 450 ms" in text  # when the chunk with the first content delta arrived
    assert "tok/s" in text and "1.00 s" in text
    # The stream ends: usage replaces the delta count in the rate, finish shows.
    feed(
        w,
        [
            chat_chunk({}, "stop"),
            chat_chunk({}, usage={"prompt_tokens": 5, "completion_tokens": 40}),
            b"data: [DONE]\n\n",
            b"",
        ],
        start=0.75,
    )
    assert w.ended is not None
    assert w.tokens_per_second(now) == 40 / (w.ended - w.first_token)
    assert "stop" in render(stream_panel(w, now, 80, 4))


def test_reasoning_then_text_reasoning_is_dimmed() -> None:
    w = watch("chat", "responses", endpoint="azure")
    feed(
        w,
        [
            responses_event({"type": "response.created", "response": {"model": "o4-mini"}}),
            responses_event(
                {"type": "response.output_item.added", "output_index": 0,
                 "item": {"type": "reasoning", "id": "rs_1"}}
            ),
            responses_event(
                {"type": "response.reasoning_summary_text.delta", "item_id": "rs_1",
                 "output_index": 0, "summary_index": 0, "delta": "The user wants a greeting."}
            ),
            responses_event(
                {"type": "response.output_item.added", "output_index": 1,
                 "item": {"type": "message", "id": "msg_1"}}
            ),
            responses_event(
                {"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 1,
                 "content_index": 0, "delta": "Hi there!"}
            ),
        ],
    )  # fmt: skip
    tail = conversation_tail(w.conversation, 60, 5)
    assert tail.plain.index("The user wants a greeting.") < tail.plain.index("Hi there!")
    assert "dim italic" in styles_of(tail, "The user wants a greeting.")
    assert "dim italic" not in styles_of(tail, "Hi there!")
    text = render(stream_panel(w, T0 + 1, 80, 5))
    assert "chat→responses · gpt-4o → azure" in text
    assert "TTFT 500 ms" in text  # the third event, a reasoning delta, is the first token


def test_parallel_tool_calls_grow_side_by_side() -> None:
    w = watch()

    def call(index: int, name: str) -> dict:
        function = {"name": name, "arguments": ""}
        return {"index": index, "id": f"call_{index}", "type": "function", "function": function}

    feed(
        w,
        [
            chat_chunk({"role": "assistant", "tool_calls": [call(0, "get_weather"),
                                                             call(1, "get_time")]}),
            chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": "Pa'}}]}),
            chat_chunk({"tool_calls": [{"index": 1, "function": {"arguments": '{"tz": "CET"}'}}]}),
        ],
    )  # fmt: skip
    text = render(stream_panel(w, T0 + 1, 100, 6), width=100)
    assert '⚙ get_weather({"city": "Pa)' in text  # arguments as they grow
    assert "⚙ get_time(" in text and '"tz": "CET"' in text
    feed(
        w,
        [
            chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'ris"}'}}]}),
            chat_chunk({}, "tool_calls"),
        ],
        start=0.8,
    )
    text = render(stream_panel(w, T0 + 1, 100, 8), width=100)
    assert '"city": "Paris"' in text and "tool_calls" in text
    assert text.index("get_weather") < text.index("get_time")


def test_an_error_mid_stream_turns_the_panel_red_and_the_summary_says_so() -> None:
    w = watch()
    feed(
        w,
        [
            chat_chunk({"role": "assistant", "content": "Hello"}),
            chat_chunk({"content": " from"}),
            chat_chunk(
                {},
                error={"message": "The fake upstream failed mid-stream.", "type": "server_error"},
            ),
            b"",
        ],
    )
    panel = stream_panel(w, T0 + 1, 80, 4)
    assert panel.border_style == "red"
    text = render(panel)
    assert "✖ The fake upstream failed mid-stream. (server_error)" in text
    assert "Hello from" in text
    summary = Summary(
        w.info, "200 ✖ The fake upstream failed mid-stream.", False, 0.6, ttft=w.ttft()
    )
    line = render(summary_line(summary), width=200)
    assert "200 ✖ The fake upstream failed mid-stream." in line
    assert "TTFT 300 ms" in line


def test_twenty_concurrent_streams_all_show_within_the_screen() -> None:
    watches = []
    for n in range(20):
        w = watch(model=f"model-{n:02d}")
        feed(w, [chat_chunk({"content": f"answer number {n} " * 3})], start=0.1 + n / 100)
        watches.append(w)
    for height in (40, 16):
        text = render(live_view(watches, T0 + 2, 100, height), width=100, height=height)
        lines = text.rstrip("\n").split("\n")
        assert len(lines) <= height
        shown = [n for n in range(20) if f"model-{n:02d}" in text]
        if height == 40:
            assert shown == list(range(20))  # a panel or a compact row each
            assert "╭" in text  # the oldest streams get panels
        else:
            assert "more streams" in lines[-1]
            hidden = int(lines[-1].split("and ")[1].split()[0])
            assert len(shown) + hidden == 20
    assert "no streams in flight" in render(live_view([], T0, 80, 20))


def test_a_panel_only_lays_out_the_tail_of_a_long_answer() -> None:
    w = watch()
    feed(w, [chat_chunk({"content": f"word{n} "}) for n in range(5000)], step=0.001)
    tail = conversation_tail(w.conversation, 40, 3)
    assert tail.plain.count("\n") == 2
    assert "word4999" in tail.plain and "word10 " not in tail.plain


def test_the_summary_line_has_every_fact() -> None:
    info = FlowInfo(
        "responses", "chat", "gpt-5", "local", upstream_model="qwen3:8b", route="r1", started=T0
    )
    summary = Summary(
        info, "200", True, 2.5, ttft=0.34, usage=(1200, 0, 345, 0), attempts=2, recorded="rec_7"
    )
    line = render(summary_line(summary), width=200)
    for fact in ("[r1]", "gpt-5 as qwen3:8b → local", "responses→chat", "200", "TTFT 340 ms",
                 "2.50 s", "1,200→345 tok", "×2", "rec rec_7"):  # fmt: skip
        assert fact in line, fact
    failed = Summary(info, "error: Client disconnected.", False, 0.2)
    line = render(summary_line(failed), width=200)
    assert "error: Client disconnected." in line and "TTFT –" in line and "–→– tok" in line


def test_a_stream_without_a_panel_is_parsed_only_to_its_first_token_and_at_its_end() -> None:
    w = StreamWatch(watch().info, full=False)
    chunks = [chat_chunk({"role": "assistant", "content": ""})]
    chunks += [chat_chunk({"content": f" w{n}"}) for n in range(500)]
    chunks += [
        chat_chunk({}, "length"),
        chat_chunk({}, usage={"prompt_tokens": 9, "completion_tokens": 500}),
        b"data: [DONE]\n\n",
    ]
    feed(w, chunks, step=0.01)
    assert w.first_token == T0 + 0.3 + 0.01  # the second chunk
    assert w.behind and w.events == len(chunks)
    assert len(w.conversation.text()) < 10  # the rest went by unparsed
    w.promote()  # it gets a panel: the tail is assembled, and everything after it
    assert w.conversation.text().endswith(" w498 w499")
    assert " w0 " not in w.conversation.text()
    feed(w, [b""], start=6)
    conversation = w.finish()
    assert conversation.finish == "length" and conversation.usage == (9, 0, 500, 0)


def test_the_facts_at_the_end_come_from_the_last_chunks() -> None:
    w = StreamWatch(watch().info, full=False)
    body = b"".join(chat_chunk({"content": f" w{n}"}) for n in range(300))
    body += chat_chunk({}, error={"message": "overloaded"}) + b"data: [DONE]\n\n"
    # Odd splits: the kept chunks start inside an event.
    feed(w, [body[i : i + 97] for i in range(0, len(body), 97)] + [b""], step=0.001)
    conversation = w.finish()
    assert conversation.error == "overloaded"
    assert w.ttft() is not None and w.ended is not None
