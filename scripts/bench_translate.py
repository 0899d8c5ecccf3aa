"""Benchmark the stream translators against an orjson floor measured in the same run.

For each direction a long, realistic upstream stream (reasoning, text, parallel tool calls,
usage; >= 100k events) is fed through :class:`llmitm.translate.pipeline.StreamPipeline` in
network-sized chunks. The floor is the least any translator must do with the same bytes:
split into events, ``orjson.loads`` and ``orjson.dumps`` each one, re-frame. Prints median
events/s over several runs, the ratio to the floor, and the translator's peak memory.

    python scripts/bench_translate.py [--events N] [--runs R] [--chunk BYTES]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
import tracemalloc
from collections.abc import Callable

import orjson

from llmitm.translate.context import TranslateOptions, TranslationContext
from llmitm.translate.pipeline import StreamPipeline
from llmitm.wire.ids import CountingIds, fixed_clock
from llmitm.wire.modes import Direction

WORDS = ("The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog", ".")


def responses_stream(events: int) -> bytes:
    """An OpenAI-shaped Responses stream: reasoning summary, text, two function calls."""
    frames: list[bytes] = []
    seq = 0

    def emit(payload: dict) -> None:
        nonlocal seq
        payload["sequence_number"] = seq
        seq += 1
        frames.append(
            b"event: " + payload["type"].encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"
        )

    response = {
        "id": "resp_bench",
        "object": "response",
        "created_at": 1,
        "status": "in_progress",
        "model": "gpt-5",
        "output": [],
        "usage": None,
    }
    emit({"type": "response.created", "response": response})
    emit({"type": "response.in_progress", "response": response})
    reasoning_n, text_n = events // 5, events * 7 // 10
    args_n = max((events - reasoning_n - text_n - 20) // 2, 1)
    emit(
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {"id": "rs_1", "type": "reasoning", "summary": []},
        }
    )
    emit(
        {
            "type": "response.reasoning_summary_part.added",
            "item_id": "rs_1",
            "output_index": 0,
            "summary_index": 0,
            "part": {"type": "summary_text", "text": ""},
        }
    )
    for i in range(reasoning_n):
        emit(
            {
                "type": "response.reasoning_summary_text.delta",
                "item_id": "rs_1",
                "output_index": 0,
                "summary_index": 0,
                "delta": WORDS[i % 10],
                "obfuscation": "abc",
            }
        )
    emit(
        {
            "type": "response.output_item.done",
            "output_index": 0,
            "item": {"id": "rs_1", "type": "reasoning", "summary": []},
        }
    )
    emit(
        {
            "type": "response.output_item.added",
            "output_index": 1,
            "item": {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "status": "in_progress",
                "content": [],
            },
        }
    )
    emit(
        {
            "type": "response.content_part.added",
            "item_id": "msg_1",
            "output_index": 1,
            "content_index": 0,
            "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []},
        }
    )
    for i in range(text_n):
        emit(
            {
                "type": "response.output_text.delta",
                "item_id": "msg_1",
                "output_index": 1,
                "content_index": 0,
                "delta": WORDS[i % 10],
                "logprobs": [],
                "obfuscation": "abcdef",
            }
        )
    emit(
        {
            "type": "response.output_item.done",
            "output_index": 1,
            "item": {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [],
            },
        }
    )
    for call in (0, 1):
        item_id, index = f"fc_{call}", 2 + call
        emit(
            {
                "type": "response.output_item.added",
                "output_index": index,
                "item": {
                    "id": item_id,
                    "type": "function_call",
                    "status": "in_progress",
                    "call_id": f"call_{call}",
                    "name": "lookup",
                    "arguments": "",
                },
            }
        )
        for i in range(args_n):
            emit(
                {
                    "type": "response.function_call_arguments.delta",
                    "item_id": item_id,
                    "output_index": index,
                    "delta": '{"q":' if i == 0 else " 1",
                }
            )
        emit(
            {
                "type": "response.output_item.done",
                "output_index": index,
                "item": {
                    "id": item_id,
                    "type": "function_call",
                    "status": "completed",
                    "call_id": f"call_{call}",
                    "name": "lookup",
                    "arguments": "{}",
                },
            }
        )
    done = dict(
        response,
        status="completed",
        usage={
            "input_tokens": 10,
            "input_tokens_details": {"cached_tokens": 2},
            "output_tokens": events,
            "output_tokens_details": {"reasoning_tokens": reasoning_n},
            "total_tokens": events + 10,
        },
    )
    emit({"type": "response.completed", "response": done})
    return b"".join(frames)


def chat_stream(events: int) -> bytes:
    """An OpenAI-shaped chat stream: reasoning_content, text, two parallel tool calls, usage."""
    frames: list[bytes] = []
    base = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "system_fingerprint": None,
    }

    def emit(delta: dict, finish: str | None = None) -> None:
        chunk = dict(
            base, choices=[{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
        )
        frames.append(b"data: " + orjson.dumps(chunk) + b"\n\n")

    reasoning_n, text_n = events // 5, events * 7 // 10
    args_n = max((events - reasoning_n - text_n - 6) // 2, 1)
    emit({"role": "assistant", "content": ""})
    for i in range(reasoning_n):
        emit({"reasoning_content": WORDS[i % 10]})
    for i in range(text_n):
        emit({"content": WORDS[i % 10]})
    for call in (0, 1):
        emit(
            {
                "tool_calls": [
                    {
                        "index": call,
                        "id": f"call_{call}",
                        "type": "function",
                        "function": {"name": "lookup", "arguments": ""},
                    }
                ]
            }
        )
        for i in range(args_n):
            emit(
                {
                    "tool_calls": [
                        {"index": call, "function": {"arguments": '{"q":' if i == 0 else " 1"}}
                    ]
                }
            )
    emit({}, "tool_calls")
    usage = {
        "prompt_tokens": 10,
        "completion_tokens": events,
        "total_tokens": events + 10,
        "prompt_tokens_details": {"cached_tokens": 2},
        "completion_tokens_details": {"reasoning_tokens": reasoning_n},
    }
    frames.append(b"data: " + orjson.dumps(dict(base, choices=[], usage=usage)) + b"\n\n")
    frames.append(b"data: [DONE]\n\n")
    return b"".join(frames)


def chunked(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def floor(chunks: list[bytes]) -> int:
    """Split into events, parse and re-serialise each with orjson: no translation at all."""
    loads, dumps = orjson.loads, orjson.dumps
    buffer = b""
    out = 0
    events = 0
    for chunk in chunks:
        buffer += chunk
        blocks = buffer.split(b"\n\n")
        buffer = blocks.pop()
        for block in blocks:
            data = block[block.index(b"data: ") + 6 :]
            if data != b"[DONE]":
                out += len(b"data: " + dumps(loads(data)) + b"\n\n")
            events += 1
    return events


def translate(direction: Direction) -> Callable[[list[bytes]], int]:
    def run(chunks: list[bytes]) -> int:
        options = TranslateOptions(ids=CountingIds(), clock=fixed_clock(1.0))
        pipeline = StreamPipeline(direction, TranslationContext(options=options, model="m"))
        size = len(pipeline.start())
        for chunk in chunks:
            size += len(pipeline.feed(chunk))
        size += len(pipeline.close())
        return pipeline.events_in

    return run


def median_rate(
    run: Callable[[list[bytes]], int], chunks: list[bytes], runs: int
) -> tuple[float, int]:
    rates = []
    events = 0
    for _ in range(runs):
        gc.collect()
        start = time.perf_counter()
        events = run(chunks)
        rates.append(events / (time.perf_counter() - start))
    return statistics.median(rates), events


def peak_memory(run: Callable[[list[bytes]], int], chunks: list[bytes]) -> int:
    tracemalloc.start()
    run(chunks)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=120_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--chunk", type=int, default=16_384, help="bytes per network read")
    args = parser.parse_args()
    cases = [
        ("responses -> chat", "responses-to-chat", responses_stream(args.events)),
        ("chat -> responses", "chat-to-responses", chat_stream(args.events)),
        (
            "responses -> responses (normalise)",
            "normalise-responses",
            responses_stream(args.events),
        ),
    ]
    header = ("direction", "events", "events/s", "floor/s", "ratio", "peak MiB")
    print("{:36} {:>8} {:>11} {:>11} {:>6} {:>9}".format(*header))
    for label, direction, stream in cases:
        chunks = chunked(stream, args.chunk)
        run = translate(direction)  # type: ignore[arg-type]
        rate, events = median_rate(run, chunks, args.runs)
        floor_rate, _ = median_rate(floor, chunks, args.runs)
        peak = peak_memory(run, chunks) / 2**20
        row = (label, events, rate, floor_rate, rate / floor_rate, peak)
        print("{:36} {:>8} {:>11,.0f} {:>11,.0f} {:>6.2f} {:>9.2f}".format(*row))


if __name__ == "__main__":
    main()
