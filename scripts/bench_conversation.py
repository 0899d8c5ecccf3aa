"""Benchmark an agent-like conversation: per turn, the store's size and the proxy's CPU.

An agent resends its whole, growing history on every turn. This script plays such a
conversation (``--turns`` turns; each adds a user message of ``--new-bytes`` of text and the
previous answer's output items) as non-streamed Responses requests, the same body on every
turn to each proxy, all real processes on loopback:

  mitmdump      client → plain mitmdump (reverse mode) → fake upstream (Responses)
  llmitm        client → ``llmitm run`` → chat-only fake upstream: translated, its Responses
                state kept by llmitm, recorded (the defaults)
  llmitm-before the same through the llmitm of another checkout (``--before PATH``), to
                compare two versions in the same run

Per turn and proxy: the proxy process's CPU for that turn (all its threads, from
/proc/<pid>/task/*/schedstat, read after the proxy has settled) and, for llmitm, the bytes of
database pages in use (page count − free pages, WAL included). Proxies take turns in
alternating order. With ``--runs R`` the conversation is played R times (a fresh store each)
and each figure is the median over runs.

    python scripts/bench_conversation.py [--turns 50] [--new-bytes 4096] [--runs 1]
                                         [--before ../other-checkout] [--every 5]
                                         [--store-only] [--profile DIR] [--threads]
                                         [--client-metadata] [--websocket {codex,full}]

``--client-metadata`` ends each request with fields of its own after the input (a turn id
and a timestamp), as Codex's default requests do: the bytes after the history differ on
every turn. ``--websocket`` plays each llmitm over one Responses WebSocket for the whole
conversation (``response.create`` messages, streamed answers): ``codex`` as Codex does by
default (after the first turn, only the items after the last response, with its id and
``store: false``, which the socket expands into the whole history), ``full`` resending the
whole history every turn. Plain mitmdump is still played over HTTP, its growth given for
scale. Each process's peak RSS is printed at the end.

``--threads`` also prints, per llmitm process, each thread's CPU per turn (means of turns
2–11 and of the last ten; threads numbered in the order they started, 1 the event loop):
which of them grows with the history.

``--store-only`` plays the same conversation without proxies, straight into two stores in
this process (this schema, and schema 7's layout, before shared chunks): the store's own
share of the CPU and the size, apart from the rest of the proxy.
"""

from __future__ import annotations

import argparse
import http.client
import importlib.util
import itertools
import os
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

import orjson
from websockets.sync.client import ClientConnection, connect

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench_proxy", ROOT / "scripts" / "bench_proxy.py")
assert _spec and _spec.loader
bench = importlib.util.module_from_spec(_spec)
sys.modules["bench_proxy"] = bench
_spec.loader.exec_module(bench)

SETTLE_S = 0.25  # after an answer: let the proxy's writer commit the turn before reading CPU
WORDS = ["agent", "tool", "call", "result", "file", "patch", "test", "build", "error"]
WORDS += ["stack", "trace", "function", "module", "import", "value", "return", "branch"]
# Models write typographic punctuation: a text of ASCII alone would hide what decoding and
# encoding a non-ASCII history costs.
WORDS += ["don’t", "—", "it’s", "“done”"]

CONFIG = """\
[endpoints.chat-only]
kind = "compatible"
base_url = "{chat}/v1"
apis = ["chat"]

[[routes]]
models = ["echo"]
endpoints = ["chat-only"]
"""

INSTRUCTIONS = "You are a coding agent. " * 80
TOOLS = [
    {
        "type": "function",
        "name": name,
        "description": f"{name}: " + "does a thing the agent needs. " * 10,
        "parameters": {"type": "object", "properties": {"arg": {"type": "string"}}},
    }
    for name in ("shell", "apply_patch", "read_file", "search")
]


def text(rng: random.Random, size: int) -> str:
    words: list[str] = []
    length = 0
    while length < size:
        word = rng.choice(WORDS) if rng.random() > 0.02 else f"\n{rng.randrange(10**6)}"
        words.append(word)
        length += len(word) + 1
    return " ".join(words)[:size]


def client_metadata(rng: random.Random, turn: int) -> dict[str, str]:
    """Per-request metadata after the input, new on every request, as Codex sends it in its
    default configuration (a turn id, the request's start in milliseconds)."""
    return {
        "turn_id": f"{rng.getrandbits(128):032x}",
        "x-codex-ws-stream-request-start-ms": str(1_796_015_878_385 + turn * 1_337),
        "session_id": "01a22ae3-70d4-76d0-bb81-cfef345a4728",
    }


class Socket:
    """One Responses WebSocket a conversation is played over."""

    def __init__(self, port: int) -> None:
        self.connection: ClientConnection = connect(
            f"ws://127.0.0.1:{port}/v1/responses",
            additional_headers={"authorization": "Bearer sk-bench"},
            max_size=None,
            open_timeout=30,
        )
        self.sent: dict = {}
        """The fields of this turn's ``response.create``."""
        self.last: tuple[str, int] | None = None
        """The last response's id, and the history's length with its output."""

    def close(self) -> None:
        self.connection.close()


def incremental(socket: Socket, fields: dict) -> dict:
    """What Codex sends over its socket: after the first turn, only the items after the last
    response's output, with that response's id (``store: false``: the socket keeps it)."""
    fields = dict(fields, store=False)
    if socket.last is not None:
        previous, seen = socket.last
        fields.update(previous_response_id=previous, input=fields["input"][seen:])
    return fields


def peak_rss(pid: int) -> int:
    """The process's peak resident set, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def socket_call(socket: Socket) -> dict:
    """One turn over a Responses WebSocket (a ``response.create`` of what the socket is to
    send, streamed as the socket always is): the completed response."""
    connection = socket.connection
    connection.send(orjson.dumps({"type": "response.create", **socket.sent}).decode())
    while True:
        event = orjson.loads(connection.recv(timeout=120))
        if event.get("type") in ("response.completed", "response.failed", "error"):
            if event["type"] != "response.completed":
                raise RuntimeError(f"socket: {str(event)[:300]}")
            return event["response"]


def post(port: int, body: bytes) -> dict:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        connection.request(
            "POST",
            "/v1/responses",
            body,
            {"content-type": "application/json", "authorization": "Bearer sk-bench"},
        )
        response = connection.getresponse()
        answer = response.read()
    finally:
        connection.close()
    if response.status != 200:
        raise RuntimeError(f"port {port}: HTTP {response.status}: {answer[:300]!r}")
    return orjson.loads(answer)


def store_bytes(db: Path) -> int:
    if not db.exists():
        return 0
    with sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True) as connection:
        pages = connection.execute("PRAGMA page_count").fetchone()[0]
        free = connection.execute("PRAGMA freelist_count").fetchone()[0]
        size = connection.execute("PRAGMA page_size").fetchone()[0]
    return (pages - free) * size


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of each thread of ``pid`` by thread id (``/proc/<pid>/task/*/schedstat``)."""
    out: dict[int, float] = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat", "rb") as schedstat:
                out[int(task)] = int(schedstat.read().split()[0]) / 1e9
        except (FileNotFoundError, ProcessLookupError):
            continue
    return out


THREADS: dict[str, list[list[dict[int, float]]]] = {}
"""Per llmitm process (``--threads``), per run, per turn: CPU seconds by thread id."""


def thread_report() -> list[str]:
    """Each thread's mean CPU per turn over all runs, turns 2–11 → the last ten; threads
    numbered in the order they started in their run (thread ids grow)."""
    lines = []
    for name, runs in THREADS.items():
        by_rank: dict[int, tuple[list[float], list[float]]] = {}
        for turns in runs:
            tids = sorted({tid for turn in turns for tid in turn})
            for rank, tid in enumerate(tids, 1):
                head, tail = by_rank.setdefault(rank, ([], []))
                head += [turn.get(tid, 0.0) for turn in turns[1:11]]
                tail += [turn.get(tid, 0.0) for turn in turns[-10:]]
        for rank, (head, tail) in sorted(by_rank.items()):
            early, late = statistics.mean(head) * 1000, statistics.mean(tail) * 1000
            if early >= 0.05 or late >= 0.05:
                lines.append(f"{name} thread {rank}: {early:.2f} → {late:.2f} ms a turn")
    return lines


def play(args: argparse.Namespace, run: int) -> dict[str, list[tuple[float, int]]]:
    """One conversation; per proxy, per turn: (CPU seconds, store bytes)."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-conversation-"))
    procs = bench.Processes(tmp)
    try:
        both = f"http://127.0.0.1:{bench.start_fake(procs, 'chat,responses')}"
        chat = f"http://127.0.0.1:{bench.start_fake(procs, 'chat')}"
        config = CONFIG.format(chat=chat)
        proxies: dict[str, tuple[int, int, Path | None]] = {}
        port, pid = bench.start_mitmdump(procs, both)
        proxies["mitmdump"] = (port, pid, None)
        port, pid = bench.start_llmitm(procs, chat, config, name="llmitm")
        proxies["llmitm"] = (port, pid, tmp / "llmitm.db")
        if args.before:
            port, pid = bench.start_llmitm(
                procs, chat, config, code=args.before, name="llmitm-before"
            )
            proxies["llmitm-before"] = (port, pid, tmp / "llmitm-before.db")
        # Over ``--websocket`` each llmitm plays the conversation over one socket, as Codex
        # keeps one a session; plain mitmdump over HTTP still (its own growth, for scale).
        sockets = {
            name: Socket(port)
            for name, (port, _, db) in proxies.items()
            if args.websocket and db is not None
        }
        rng = random.Random(run)
        history: list[dict] = []
        figures: dict[str, list[tuple[float, int]]] = {name: [] for name in proxies}
        for name, (_, _, db) in proxies.items():
            figures[f"_empty:{name}"] = [(0.0, store_bytes(db) if db else 0)]
        sizes: list[int] = []
        for turn in range(1, args.turns + 1):
            history.append({"role": "user", "content": text(rng, args.new_bytes)})
            fields = {
                "model": "echo",
                "instructions": INSTRUCTIONS,
                "input": history,
                "tools": TOOLS,
            }
            if args.client_metadata:
                fields["client_metadata"] = client_metadata(rng, turn)
            body = orjson.dumps(fields)
            for socket in sockets.values():
                socket.sent = incremental(socket, fields) if args.websocket == "codex" else fields
            sizes.append(len(body))
            order = list(proxies) if turn % 2 else list(reversed(proxies))
            answers = {}
            for name in order:
                port, pid, db = proxies[name]
                threads = thread_cpu(pid) if args.threads and db else {}
                before = bench.cpu_seconds(pid)
                socket = sockets.get(name)
                answers[name] = socket_call(socket) if socket else post(port, body)
                time.sleep(SETTLE_S)
                cpu = bench.cpu_seconds(pid) - before - SETTLE_S * 0  # idle settle costs ~0
                figures[name].append((cpu, store_bytes(db) if db else 0))
                if threads:
                    after = thread_cpu(pid)
                    runs = THREADS.setdefault(name, [])
                    if turn == 1:
                        runs.append([])
                    runs[-1].append({tid: after[tid] - threads.get(tid, 0.0) for tid in after})
            history.extend(answers["llmitm"]["output"])
            for name, socket in sockets.items():
                socket.last = (answers[name]["id"], len(history))
            if turn % args.every == 0 or turn == 1:
                bench.progress(f"run {run + 1} turn {turn}: request {len(body) / 1024:.0f} KiB")
        figures["_request"] = [(0.0, size) for size in sizes]
        for name, (_, pid, _) in proxies.items():
            figures[f"_peak:{name}"] = [(0.0, peak_rss(pid))]
        for socket in sockets.values():
            socket.close()
        return figures
    finally:
        procs.stop_all()
        if args.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def play_store(args: argparse.Namespace, run: int) -> dict[str, list[tuple[float, int]]]:
    """The same conversation written straight into two stores in this process: this
    checkout's schema, and the layout of schema 7 (before shared chunks; this code still
    writes it for a store opened with those steps). Per turn, the CPU of ``submit`` + ``flush``
    (the writer's work, all threads) and the bytes of pages in use."""
    import asyncio

    from llmitm.replay.model import Interaction, Message
    from llmitm.responses_api.records import ResponseSaved, StoredResponse
    from llmitm.store import MIGRATIONS, SqliteStore
    from llmitm.store.recordings import RecordingWrite

    tmp = Path(tempfile.mkdtemp(prefix="bench-store-"))
    layouts = {"store": MIGRATIONS, "store-schema7": MIGRATIONS[:7]}

    async def conversation() -> dict[str, list[tuple[float, int]]]:
        rng = random.Random(run)
        history: list[dict] = []
        figures: dict[str, list[tuple[float, int]]] = {name: [] for name in layouts}
        stores = {name: SqliteStore(tmp / f"{name}.db", migrations=steps)
                  for name, steps in layouts.items()}  # fmt: skip
        sizes: list[int] = []
        for name, store in stores.items():
            await store.open()
            figures[f"_empty:{name}"] = [(0.0, store_bytes(tmp / f"{name}.db"))]
        try:
            for turn in range(1, args.turns + 1):
                history.append({"role": "user", "content": text(rng, args.new_bytes)})
                body = orjson.dumps({"model": "echo", "instructions": INSTRUCTIONS,
                                     "input": history, "tools": TOOLS})  # fmt: skip
                chat = orjson.dumps({"model": "echo", "messages": [
                    {"role": "system", "content": INSTRUCTIONS}, *history]})  # fmt: skip
                answer = {"type": "message", "role": "assistant", "id": f"msg_{turn}",
                          "content": [{"type": "output_text", "text": "Echo: " + history[-1]["content"]}]}  # fmt: skip  # noqa: E501
                canonical = orjson.dumps(orjson.loads(body), option=orjson.OPT_SORT_KEYS)
                items = [{"id": f"msg_{rng.getrandbits(192):048x}", "type": "message", **h}
                         for h in history]  # fmt: skip
                response = {"id": f"resp_{turn}", "object": "response", "output": [answer],
                            "instructions": INSTRUCTIONS, "tools": TOOLS}  # fmt: skip
                writes = [
                    RecordingWrite(
                        Interaction(
                            id=f"{turn:013x}abcdef",
                            scope="global",
                            key=f"{turn:016x}",
                            key_version=1,
                            method="POST",
                            route="responses",
                            model="echo",
                            stream=False,
                            canonical_utf8=canonical,
                            started_us=turn,
                            status=200,
                            minted={"msg": [i["id"] for i in items]},
                            legs={
                                "client_req": Message(
                                    [], body, method="POST", url="http://x/v1/responses"
                                ),
                                "upstream_req": Message(
                                    [], chat, method="POST", url="http://u/v1/chat"
                                ),
                                "upstream_resp": Message([], orjson.dumps(answer), status=200),
                                "client_resp": Message([], orjson.dumps(response), status=200),
                            },
                        )
                    ),
                    ResponseSaved(StoredResponse(f"resp_{turn}", response, items, None, 1.0)),
                ]
                history.append({"role": "assistant", "content": answer["content"][0]["text"]})
                sizes.append(len(body))
                order = list(stores) if turn % 2 else list(reversed(stores))
                for name in order:
                    start = time.process_time()
                    for write in writes:
                        stores[name].submit(write)
                    await stores[name].flush()
                    cpu = time.process_time() - start
                    figures[name].append((cpu, store_bytes(tmp / f"{name}.db")))
                if turn % args.every == 0 or turn == 1:
                    bench.progress(f"run {run + 1} turn {turn}: request {len(body) / 1024:.0f} KiB")
            figures["_request"] = [(0.0, size) for size in sizes]
            return figures
        finally:
            for store in stores.values():
                await store.close()
            if args.keep:
                print(f"kept {tmp}", file=sys.stderr)
            else:
                shutil.rmtree(tmp, ignore_errors=True)

    return asyncio.run(conversation())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--new-bytes", type=int, default=4096)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--every", type=int, default=5, help="print every Nth turn")
    parser.add_argument("--keep", action="store_true", help="say where the stores are kept")
    parser.add_argument("--before", help="another checkout whose llmitm runs beside this one")
    parser.add_argument(
        "--store-only",
        action="store_true",
        help="no proxies: write the turns straight into this schema's store and schema 7's",
    )
    parser.add_argument(
        "--client-metadata",
        action="store_true",
        help="each request ends with metadata of its own after the input, as Codex's do",
    )
    parser.add_argument(
        "--websocket",
        choices=["codex", "full"],
        help="play each llmitm over one Responses WebSocket: as Codex does by default (new "
        "items after the last response, store false) or resending the whole history",
    )
    parser.add_argument("--profile", metavar="DIR", help="run llmitm under cProfile into DIR")
    parser.add_argument(
        "--threads", action="store_true", help="each llmitm thread's CPU, first vs last turns"
    )
    args = parser.parse_args()
    if args.profile:
        bench.PROFILE_DIR = Path(args.profile).resolve()
        bench.PROFILE_DIR.mkdir(parents=True, exist_ok=True)
    if args.turns < 2:
        parser.error("--turns: at least 2 (turn 2 is the first one compared)")
    runs = [(play_store if args.store_only else play)(args, run) for run in range(args.runs)]
    names = [name for name in runs[0] if not name.startswith("_")]

    def median(name: str, turn: int, field: int) -> float:
        return statistics.median(run[name][turn][field] for run in runs)

    requests = [int(median("_request", t, 1)) for t in range(args.turns)]
    header = ["turn", "request KiB", *(f"{n} CPU ms" for n in names)]
    header += [f"{n} store KiB" for n in names if n != "mitmdump"]
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for t in range(args.turns):
        if (t + 1) % args.every and t not in (0, 1):
            continue
        row = [str(t + 1), f"{requests[t] / 1024:.0f}"]
        row += [f"{median(n, t, 0) * 1000:.1f}" for n in names]
        row += [f"{median(n, t, 1) / 1024:.0f}" for n in names if n != "mitmdump"]
        print("| " + " | ".join(row) + " |")
    print()
    total = sum(requests)
    new = requests[0] + sum(max(0, b - a) for a, b in itertools.pairwise(requests))
    print(f"requests in all: {total / 2**20:.2f} MiB; new in all: {new / 2**20:.2f} MiB")
    for n in names:
        cpu2 = statistics.median(median(n, t, 0) for t in range(1, min(4, args.turns)))
        cpu_end = statistics.median(median(n, t, 0) for t in range(args.turns - 3, args.turns))
        line = f"{n}: CPU per turn, turns 2-4 {cpu2 * 1000:.1f} ms → last 3 {cpu_end * 1000:.1f} ms"
        line += f" ({cpu_end / cpu2:.2f}×)"
        # Medians hide what happens on some turns only (a full garbage collection): the mean
        # over all runs of the first and last ten turns shows it.
        head = statistics.mean(run[n][t][0] for run in runs for t in range(1, min(11, args.turns)))
        tail = statistics.mean(
            run[n][t][0] for run in runs for t in range(max(1, args.turns - 10), args.turns)
        )
        line += f"; mean turns 2-11 {head * 1000:.1f} ms → last 10 {tail * 1000:.1f} ms"
        if n != "mitmdump":
            size = median(n, args.turns - 1, 1) - median(f"_empty:{n}", 0, 1)
            line += f"; store grew {size / 2**20:.2f} MiB = {size / new:.2f}× the new content"
        if f"_peak:{n}" in runs[0]:
            line += f"; peak RSS {median(f'_peak:{n}', 0, 1) / 2**20:.0f} MiB"
        print(line)
    for line in thread_report():
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
