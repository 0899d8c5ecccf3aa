"""Benchmark request validation on a real request body, grown like a conversation.

The body (a captured client request, e.g. Codex's first turn) is measured as it is, then with
its ``input`` doubled until it reaches each size given, the way a conversation grows turn by
turn. Prints the median time of :func:`llmitm.translate.validation.validate_request` per body
and per 100 KB, next to an orjson ``loads`` + ``dumps`` of the same body as a floor.

    python scripts/bench_validation.py REQUEST.json [--kb 100 1000] [--runs N]
"""

from __future__ import annotations

import argparse
import copy
import functools
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from llmitm.translate.validation import validate_request


def median_s(work: Callable[[], Any], runs: int) -> float:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        work()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def _round_trip(content: bytes) -> bytes:
    return orjson.dumps(orjson.loads(content))


def grown(body: dict[str, Any], size: int) -> dict[str, Any]:
    body = copy.deepcopy(body)
    while len(orjson.dumps(body)) < size and isinstance(body.get("input"), list):
        body["input"] = body["input"] + copy.deepcopy(body["input"])
    return body


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("request", type=Path, help="a Responses request body (JSON)")
    parser.add_argument("--kb", type=int, nargs="*", default=[100, 1000])
    parser.add_argument("--runs", type=int, default=2000)
    args = parser.parse_args()
    original = orjson.loads(args.request.read_bytes())
    for size in [0, *args.kb]:
        body = grown(original, size * 1024)
        content = orjson.dumps(body)
        validate_request(body, "responses")  # a valid body: the whole walk is measured
        check = median_s(functools.partial(validate_request, body, "responses"), args.runs)
        floor = median_s(functools.partial(_round_trip, content), args.runs)
        per_100kb = check / (len(content) / 102_400)
        print(
            f"{len(content) / 1024:8.1f} KB  validate {check * 1e6:7.1f} us"
            f"  ({per_100kb * 1e6:6.1f} us per 100 KB)  orjson loads+dumps {floor * 1e6:7.1f} us"
        )


if __name__ == "__main__":
    main()
