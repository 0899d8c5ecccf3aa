"""A process killed (SIGKILL) while it writes shared chunks leaves a database that passes
``integrity_check``, whose chunk counts match their references, and no reference to a chunk
that is missing: a batch, its chunks and its counts commit together or not at all."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llmitm.store import SqliteStore

pytestmark = pytest.mark.slow

WRITER = r"""
import asyncio, random, sys, orjson
from llmitm.replay.model import Interaction, Message
from llmitm.responses_api.records import ResponseDeleted, ResponseSaved, StoredResponse
from llmitm.store import SqliteStore
from llmitm.store.recordings import PruneRecordings, RecordingWrite

async def main(path, seed):
    rng = random.Random(seed)
    history = []
    async with SqliteStore(path) as store:
        for t in range(1, 100_000):
            history.append({"role": "user", "content": " ".join(
                rng.choice(["tool", "file", "patch", "test"]) for _ in range(600))})
            body = orjson.dumps({"model": "m", "input": history})
            n = seed * 100_000 + t
            store.submit(RecordingWrite(Interaction(
                id=f"{n:013x}abcdef", scope="global", key="k", key_version=1, method="POST",
                route="responses", model="m", stream=False, canonical_utf8=body,
                started_us=n, status=200,
                legs={"client_req": Message([], body, method="POST", url="http://x/"),
                      "client_resp": Message([], b'{"ok": true}', status=200)})))
            items = [{"id": f"msg_{seed}_{t}_{i}", **h} for i, h in enumerate(history)]
            store.submit(ResponseSaved(StoredResponse(
                f"resp_{seed}_{t}", {"id": f"resp_{seed}_{t}", "output": []}, items, None, 1.0)))
            if t % 4 == 0:
                store.submit(PruneRecordings(before_us=n - 2))
                store.submit(ResponseDeleted(f"resp_{seed}_{t - 3}"))
            await store.flush()
            if t == 3:
                print("ready", flush=True)

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


async def test_sigkill_mid_write_leaves_counts_and_references_whole(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    for seed, delay in enumerate((0.2, 0.6), start=1):
        child = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path), str(seed)],
            stdout=subprocess.PIPE,
            env={**os.environ},
        )
        try:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == b"ready"
            time.sleep(delay)  # not an assertion on time: where in its writes the kill lands
            child.send_signal(signal.SIGKILL)
            assert child.wait(timeout=30) == -signal.SIGKILL
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        with sqlite3.connect(path) as db:
            assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        async with SqliteStore(path, read_only=True) as store:
            assert await store.content_problems() == []
            recordings = await store.load_recordings()  # every body can be put together
            assert recordings and all(i.legs["client_req"].content for i in recordings)
