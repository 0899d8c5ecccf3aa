"""Instructions per event of a conformant Responses stream's owner, sans-IO: guard vs normaliser.

``bench_proxy_instructions.py`` counts the whole proxy, whose timed work (the store's writer,
watchdogs) moves a reading by a few thousand instructions per event. This counts only what a
relayed stream costs: the stream owner of one flow (``exchange/stream.py``'s
``StreamRewriter``, which mitmproxy calls once per chunk) fed the fake upstream's Responses
stream one event per chunk, as the proxy reads an unpaced stream, through the passthrough
guard (an endpoint marked ``conformant``) or the default normaliser. Each is run under
valgrind's callgrind twice, with one stream and with ``1 + --streams`` streams: the
difference over the extra streams' events is the instructions per event from the second
stream on (imports and first-stream work cancel out). ``--before`` also counts another
checkout's code.

    python scripts/bench_relay_instructions.py [--events N] [--streams S] [--before ../older]

Needs valgrind. Each run takes under a minute.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def child(mode: str, streams: int, events: int) -> None:
    """Feed ``streams`` streams of ``events`` text deltas through a guard or a normaliser."""
    from llmitm.exchange.stream import StreamRewriter
    from llmitm.testing import fake_upstream as fake
    from llmitm.translate.context import TranslationContext
    from llmitm.translate.guard import StreamGuard
    from llmitm.translate.pipeline import StreamPipeline

    body = {"model": "bench", "input": "hi", "stream": True}
    scenario = fake.choose_scenario(f"text;events={events}", body)
    plan = fake.build_plan(scenario, body, lambda: "call_1")
    usage = fake.Usage(1, plan.output_tokens(), plan.reasoning_tokens())
    reply = fake.Reply(1, 1_700_000_000, "bench", body, scenario, usage)
    frames = list(fake.responses_frames(plan, reply))
    for _ in range(streams):
        pipeline = (
            StreamGuard("responses")
            if mode == "guard"
            else StreamPipeline("normalise-responses", TranslationContext(model="bench"))
        )
        rewriter = StreamRewriter(pipeline)
        out = [piece for frame in frames for piece in rewriter(frame)]
        out += rewriter(b"")
        # The deltas go out as the very chunks that came in.
        assert all(a is b for a, b in zip(out[4:-5], frames[4:-5], strict=True)), mode
    print(len(frames))


def instructions(addon: Path, mode: str, streams: int, events: int, tmp: Path) -> tuple[int, int]:
    """(instructions of the whole run, frames per stream)."""
    out = tmp / f"callgrind.{mode}.{streams}"
    env = {**os.environ, "PYTHONPATH": str(addon), "PYTHONHASHSEED": "0"}
    run = subprocess.run(
        [
            "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
            sys.executable, __file__, "--child", mode, str(streams), str(events),
        ],
        env=env, capture_output=True, text=True, check=True, timeout=1800,
    )  # fmt: skip
    total = re.search(rb"^(?:summary|totals): (\d+)", out.read_bytes(), re.MULTILINE)
    if total is None:
        raise RuntimeError(f"no instruction total in {out}")
    out.unlink()
    return int(total.group(1)), int(run.stdout.split()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2000, help="text deltas per stream")
    parser.add_argument("--streams", type=int, default=5, help="streams beyond the first")
    parser.add_argument("--before", metavar="CHECKOUT", help="also count this checkout's code")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), int(args.child[2]))
        return 0
    if shutil.which("valgrind") is None:
        parser.error("needs valgrind")
    codes = [("this checkout", ROOT / "addon")]
    if args.before:
        codes.append(("before", Path(args.before).resolve() / "addon"))
    tmp = Path(tempfile.mkdtemp(prefix="llmitm-bench-relay-"))
    print(
        f"Instructions per event from the second stream on, {args.events}-delta Responses "
        f"streams, {args.streams} streams counted"
    )
    guard = None
    for label, addon in codes:
        for mode in ("guard", "normalise"):
            one, frames = instructions(addon, mode, 1, args.events, tmp)
            more, _ = instructions(addon, mode, 1 + args.streams, args.events, tmp)
            per_event = (more - one) / (args.streams * frames)
            guard = per_event if mode == "guard" else guard
            ratio = f"  {per_event - guard:+,.0f} against the guard" if mode != "guard" else ""
            print(f"  {label:14} {mode:10} {per_event:>8,.0f}{ratio}", flush=True)
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
