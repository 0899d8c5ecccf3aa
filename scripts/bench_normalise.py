"""Benchmark default normalisation against the passthrough guard, in the same run.

A compatible endpoint's streams of the client's own API used to go through
:class:`llmitm.translate.guard.StreamGuard` (bytes relayed, only the end watched); they now go
through the API's normaliser (:mod:`llmitm.translate.chat_normalise`,
:mod:`llmitm.translate.normalise`). This measures what that costs on conformant streams (the
long OpenAI-shaped streams of ``bench_translate.py``: reasoning, text, parallel tool calls,
usage), fed one event per chunk as streaming servers write them and in network-sized reads.
Guard and normaliser runs alternate, so drift on the machine hits both alike. Prints the
median nanoseconds of CPU per event of each and their ratio, and checks that the normalised
chat stream is the input byte for byte, and that every delta of the normalised Responses
stream is the input's (only events the normaliser completes are written anew).

    python scripts/bench_normalise.py [--events N] [--runs R] [--chunk BYTES]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable

from bench_translate import chat_stream, chunked, responses_stream

from llmitm.translate.context import TranslateOptions, TranslationContext
from llmitm.translate.guard import StreamGuard
from llmitm.translate.pipeline import StreamPipeline
from llmitm.translate.protocol import ClientStream
from llmitm.wire.ids import CountingIds, fixed_clock
from llmitm.wire.modes import Direction
from llmitm.wire.paths import ApiName

Factory = Callable[[], ClientStream]


def guard(api: ApiName) -> Factory:
    return lambda: StreamGuard(api)


def normaliser(direction: Direction) -> Factory:
    def make() -> ClientStream:
        options = TranslateOptions(ids=CountingIds(), clock=fixed_clock(1.0))
        return StreamPipeline(direction, TranslationContext(options=options, model="m"))

    return make


def relay(make: Factory, chunks: list[bytes]) -> bytes:
    stream = make()
    out = [stream.feed(chunk) for chunk in chunks]
    out.append(stream.close())
    return b"".join(out)


def frames(body: bytes) -> list[bytes]:
    return [block + b"\n\n" for block in body.split(b"\n\n") if block]


def is_delta(frame: bytes) -> bool:
    return frame.startswith(b"event: ") and frame.find(b".delta\n", 0, 80) > 0


def cpu_ns(make: Factory, chunks: list[bytes]) -> int:
    gc.collect()
    start = time.process_time_ns()
    stream = make()
    feed = stream.feed
    for chunk in chunks:
        feed(chunk)
    stream.close()
    return time.process_time_ns() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--chunk", type=int, default=16_384, help="bytes per network read")
    args = parser.parse_args()
    chat, responses = chat_stream(args.events), responses_stream(args.events)
    chat_events, responses_events = frames(chat), frames(responses)
    assert relay(normaliser("normalise-chat"), chat_events) == chat
    assert relay(normaliser("normalise-chat"), chunked(chat, args.chunk)) == chat
    for chunks in (responses_events, chunked(responses, args.chunk)):
        written = set(frames(relay(normaliser("normalise-responses"), chunks)))
        assert all(event in written for event in responses_events if is_delta(event))
    cases = [
        ("chat, one event per chunk", "chat", "normalise-chat", chat_events),
        ("chat, network reads", "chat", "normalise-chat", chunked(chat, args.chunk)),
        ("responses, one event per chunk", "responses", "normalise-responses", responses_events),
        (
            "responses, network reads",
            "responses",
            "normalise-responses",
            chunked(responses, args.chunk),
        ),
    ]
    header = ("stream", "events", "guard ns/ev", "normalise ns/ev", "ratio")
    print("{:32} {:>8} {:>12} {:>16} {:>6}".format(*header))
    for label, api, direction, chunks in cases:
        events = len(chat_events) if api == "chat" else len(responses_events)
        plain, normalised = guard(api), normaliser(direction)  # type: ignore[arg-type]
        guard_ns, norm_ns = [], []
        for _ in range(args.runs):
            guard_ns.append(cpu_ns(plain, chunks) / events)
            norm_ns.append(cpu_ns(normalised, chunks) / events)
        g, n = statistics.median(guard_ns), statistics.median(norm_ns)
        print(f"{label:32} {events:>8} {g:>12,.0f} {n:>16,.0f} {n / g:>6.2f}")


if __name__ == "__main__":
    main()
