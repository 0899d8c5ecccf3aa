"""Record and replay through real llmitm processes.

Recording runs against the deterministic fake upstream; every replay runs with the fake
stopped and a *tripwire* listening where every upstream was (the reverse target and both
endpoints): a connection to it fails the test, so "replay never opens an upstream socket,
not even after every recording was used" is asserted, not assumed.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2 as httpx
import openai
import orjson
import pytest

from llmitm.replay.model import Interaction
from llmitm.store import SqliteStore, blob_codec

from .processes import LLMITM, TWO_ENDPOINTS, Proxy, fake_upstream, llmitm_proxy

pytestmark = pytest.mark.slow

SECRET = "sk-proj-" + "Q7w8E9r0T1y2" * 3
MESSAGES = [{"role": "user", "content": "Say hello."}]


class Tripwire:
    """A listener that counts every connection made to it (and answers none)."""

    def __init__(self) -> None:
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        self.connections = 0
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.socket.accept()
            except OSError:
                return
            self.connections += 1
            connection.close()

    def close(self) -> None:
        self.socket.close()


@contextmanager
def tripwire() -> Iterator[Tripwire]:
    wire = Tripwire()
    try:
        yield wire
    finally:
        wire.close()
    assert wire.connections == 0, f"replay connected upstream {wire.connections} time(s)"


def raw_post(proxy: Proxy, path: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    with httpx.Client(timeout=30) as client:
        return client.post(
            f"http://127.0.0.1:{proxy.port()}{path}",
            content=orjson.dumps(body),
            headers={"content-type": "application/json", "authorization": f"Bearer {SECRET}"}
            | headers,
        )


def sdk(proxy: Proxy, **headers: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=proxy.base_url(), api_key=SECRET, max_retries=0, default_headers=headers
    )


# Requests of the recorded session: (path, body, headers) — passthrough chat, both translation
# directions, streamed and not, and the same request twice with two different answers.
CALLS: list[tuple[str, dict[str, Any], dict[str, str]]] = [
    ("/v1/chat/completions", {"model": "gpt-pass", "messages": MESSAGES}, {}),
    ("/v1/chat/completions", {"model": "gpt-pass", "messages": MESSAGES, "stream": True}, {}),
    (
        "/v1/chat/completions",
        {"model": "over-responses-1", "messages": MESSAGES, "stream": True},
        {"x-fake-scenario": "reasoning"},
    ),
    ("/v1/responses", {"model": "over-chat-1", "input": "Say hello.", "stream": True}, {}),
    ("/v1/responses", {"model": "over-chat-1", "input": "Say hello."}, {}),
    # A secret in the request that the translated stream echoes (response.created carries
    # the instructions): redacted in every leg, also the client's.
    (
        "/v1/responses",
        {"model": "over-chat-2", "input": "Hi", "instructions": f"Key: {SECRET}", "stream": True},
        {},
    ),
    (
        "/v1/chat/completions",
        {"model": "gpt-pass", "messages": MESSAGES, "stream": True, "user": "again"},
        {"x-fake-scenario": "text;events=3"},
    ),
    (
        "/v1/chat/completions",
        {"model": "gpt-pass", "messages": MESSAGES, "stream": True, "user": "again"},
        {"x-fake-scenario": "text;events=7"},
    ),
]


@dataclass
class Recorded:
    tmp: Path
    db: Path
    bodies: list[bytes] = field(default_factory=list)
    console: str = ""
    """What the recording process printed: its console's summary lines among them."""


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    tmp = tmp_path_factory.mktemp("record")
    result = Recorded(tmp, tmp / "llmitm.db")
    with fake_upstream(tmp) as up:
        config = TWO_ENDPOINTS.format(chat=up.url, responses=up.url)
        with llmitm_proxy(tmp, config=config, modes=[f"reverse:{up.url}"]) as proxy:
            for path, body, headers in CALLS:
                response = raw_post(proxy, path, body, **headers)
                assert response.status_code == 200, response.text
                result.bodies.append(response.content)
    result.console = proxy.log_text()  # after the process ended: all of it flushed
    return result


@contextmanager
def replaying(
    recorded: Recorded, name: str, *extra: str, folder: Path | None = None
) -> Iterator[Proxy]:
    tmp = recorded.tmp / name
    with tripwire() as wire:
        config = TWO_ENDPOINTS.format(chat=wire.url, responses=wire.url)
        source = [f"llmitm_recordings={folder}"] if folder else []
        store = tmp / "replay.db"
        if folder is None:
            store = recorded.db
        args = ["--set", "llmitm_record=replay", "--set", f"llmitm_store={store}"]
        for item in (*source, *extra):
            args += ["--set", item]
        with llmitm_proxy(tmp, config=config, modes=[f"reverse:{wire.url}"], extra=args) as proxy:
            yield proxy


async def stored_recordings(db: Path) -> list[Interaction]:
    async with SqliteStore(db, read_only=True) as store:
        return await store.load_recordings()


def test_recording_keeps_four_legs_timing_and_no_secret(recorded: Recorded) -> None:
    with sqlite3.connect(recorded.db) as db:
        rows = db.execute(
            "SELECT route, model, plan, status, ttfb_us, duration_us FROM rec_interactions "
            "ORDER BY started_us"
        ).fetchall()
        legs = db.execute("SELECT leg, count(*) FROM rec_messages GROUP BY leg").fetchall()
        dump = "\n".join(db.iterdump())
        bodies = [
            blob_codec.decode(*row) for row in db.execute("SELECT codec, data FROM rec_blobs")
        ]
        credentials = {row[0] for row in db.execute("SELECT credential FROM rec_interactions")}
    # Whole bodies and canonical texts sit in shared chunks (schema 8): read them back.
    for interaction in asyncio.run(stored_recordings(recorded.db)):
        bodies += [m.body() for m in interaction.legs.values()]
        bodies.append(interaction.canonical_utf8)
    assert [r[:4] for r in rows[:5]] == [
        ("chat.completions", "gpt-pass", "", 200),
        ("chat.completions", "gpt-pass", "", 200),
        ("chat.completions", "over-responses-1", "chat→responses", 200),
        ("responses", "over-chat-1", "responses→chat", 200),
        ("responses", "over-chat-1", "responses→chat", 200),
    ]
    assert all(0 < ttfb <= duration for *_, ttfb, duration in rows)
    assert dict(legs) == {leg: len(CALLS) for leg in LEGS}
    assert SECRET not in dump and "Q7w8E9r0T1y2" not in dump
    assert not any(SECRET.encode() in body or b"Q7w8E9r0T1y2" in body for body in bodies)
    assert any(b"<redacted>" in body for body in bodies)  # the echoed instructions
    assert "Bearer <redacted>" in dump
    # Which key was used: one fingerprint for the one key, nothing of the key itself.
    (fingerprint,) = credentials
    assert fingerprint.startswith("hmac:") and SECRET[-6:] not in fingerprint


LEGS = ("client_req", "upstream_req", "upstream_resp", "client_resp")


def test_each_recorded_flow_names_its_recording_on_its_summary_line(recorded: Recorded) -> None:
    with sqlite3.connect(recorded.db) as db:
        ids = [row[0] for row in db.execute("SELECT id FROM rec_interactions")]
    assert len(ids) == len(CALLS)
    lines = [line for line in recorded.console.splitlines() if " rec " in line]
    assert len(lines) == len(CALLS), recorded.console
    for ident in ids:
        assert sum(line.endswith(f" rec {ident}") for line in lines) == 1, (ident, lines)


def test_replay_from_client_is_byte_identical_in_order_then_exhausted(recorded: Recorded) -> None:
    with replaying(recorded, "from-client", "llmitm_replay_from=client") as proxy:
        for (path, body, headers), expected in zip(CALLS, recorded.bodies, strict=True):
            response = raw_post(proxy, path, body, **headers)
            assert response.status_code == 200, response.text
            assert response.headers["x-llmitm-replay"] == "hit"
            # `user` is not in the key: calls 1, 6 and 7 share one, served in recorded order;
            # a recording holds no secret, so neither does its replay
            assert response.content == expected.replace(SECRET.encode(), b"<redacted>")
        path, body, headers = CALLS[-1]
        again = raw_post(proxy, path, body, **headers)
        assert again.status_code == 400 and again.headers["x-should-retry"] == "false"
        error = again.json()["error"]
        assert error["type"] == "llmitm_replay_miss" and "served 3 of 3" in error["message"]


def test_replay_from_upstream_translates_again_and_parses_in_the_sdk(recorded: Recorded) -> None:
    with replaying(recorded, "from-upstream") as proxy:
        # Byte for byte the recorded answers: passthrough, and translated in both directions,
        # streamed or not (today's translator is handed the recorded ids and times).
        for index in range(6):
            path, body, headers = CALLS[index]
            assert raw_post(proxy, path, body, **headers).content == recorded.bodies[index]
    with replaying(recorded, "from-upstream-sdk") as proxy:
        client = sdk(proxy)
        chunks = list(
            client.chat.completions.create(
                model="over-responses-1",
                messages=MESSAGES,  # type: ignore[arg-type]
                stream=True,
            )
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert "Hello from the fake upstream." in text
        with client.responses.stream(model="over-chat-1", input="Say hello.") as stream:
            final = stream.get_final_response()
        assert final.output_text == "Hello from the fake upstream."
        assert client.responses.create(model="over-chat-1", input="Say hello.").output_text == (
            "Hello from the fake upstream."
        )


def test_volatile_fields_hit_and_a_changed_prompt_misses_with_a_diff(recorded: Recorded) -> None:
    with replaying(recorded, "volatile") as proxy:
        # key order, user, metadata: still the recording
        reordered = {
            "metadata": {"run": "0b7f9a44-1d2e-4c3b-9a8f-123456789abc"},
            "user": "someone-else",
            "messages": MESSAGES,
            "model": "gpt-pass",
        }
        assert raw_post(proxy, "/v1/chat/completions", reordered).status_code == 200
        changed = {"model": "gpt-pass", "messages": [{"role": "user", "content": "Say bye."}]}
        with pytest.raises(openai.BadRequestError) as caught:
            sdk(proxy).chat.completions.create(**changed)  # type: ignore[arg-type]
        message = caught.value.message
        assert "no recording with this key" in message and "scope='global'" in message
        assert "llmitm rec diff --last-miss" in message and "Closest recording:" in message
        log = proxy.log_text()
        assert "REPLAY MISS scope=global" in log
        assert '-        "content": "Say hello."' in log
        assert '+        "content": "Say bye."' in log


def test_a_scope_header_isolates_recordings(recorded: Recorded) -> None:
    with replaying(recorded, "scopes") as proxy:
        path, body, headers = CALLS[0]
        other = raw_post(proxy, path, body, **headers, **{"x-llmitm-scope": "test_b"})
        assert other.status_code == 400
        assert "no recordings in scope 'test_b'" in other.json()["error"]["message"]
        assert raw_post(proxy, path, body, **headers).status_code == 200


def test_sigkill_mid_stream_keeps_finished_flows_and_a_sound_database(tmp_path: Path) -> None:
    with (
        fake_upstream(tmp_path) as up,
        llmitm_proxy(tmp_path, modes=[f"reverse:{up.url}"]) as proxy,
    ):
        for n in range(3):
            body = {"model": "gpt-pass", "messages": MESSAGES, "stream": True, "n": n}
            assert raw_post(proxy, "/v1/chat/completions", body).status_code == 200
        db_path = tmp_path / "llmitm.db"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the writer commits right after each flow
            with sqlite3.connect(db_path) as db:
                if db.execute("SELECT count(*) FROM rec_interactions").fetchone()[0] == 3:
                    break
            time.sleep(0.05)
        slow = {"model": "gpt-pass", "messages": MESSAGES, "stream": True}
        with (
            httpx.Client(timeout=30) as client,
            client.stream(
                "POST",
                f"http://127.0.0.1:{proxy.port()}/v1/chat/completions",
                content=orjson.dumps(slow),
                headers={
                    "x-fake-scenario": "text;events=400;event_delay_ms=5",
                    "content-type": "application/json",
                },
            ) as response,
        ):
            for _ in response.iter_bytes():
                proxy.process.send_signal(signal.SIGKILL)
                break
        proxy.process.wait(timeout=10)
    with sqlite3.connect(db_path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert db.execute("SELECT count(*) FROM rec_interactions").fetchone()[0] == 3
        assert db.execute("SELECT count(*) FROM rec_messages").fetchone()[0] == 12


# --- the CLI and the recordings folder --------------------------------------------------------

REPLAY_CLIENT = """
import os, sys, httpx2 as httpx, orjson
calls = orjson.loads(sys.argv[1])
base = os.environ["OPENAI_BASE_URL"].removesuffix("/v1")
failed = 0
with httpx.Client(timeout=30) as client:
    for path, body, headers in calls:
        headers = {"content-type": "application/json", **headers}
        response = client.post(base + path, content=orjson.dumps(body), headers=headers)
        print(response.status_code, response.headers.get("x-llmitm-replay"))
        failed += response.status_code != 200
print("FAILED", failed)
"""


def llmitm(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LLMITM), *args], capture_output=True, text=True, timeout=120, **kwargs
    )


@pytest.fixture(scope="module")
def folder(recorded: Recorded) -> Path:
    target = recorded.tmp / "recordings"
    done = llmitm("rec", "export", str(target), "--db", str(recorded.db))
    assert done.returncode == 0, done.stderr
    return target


def test_export_writes_a_reviewable_folder_without_secrets(folder: Path) -> None:
    manifest = orjson.loads((folder / "manifest.json").read_bytes())
    assert manifest["format_version"] == 2 and len(manifest["interactions"]) == len(CALLS)
    first = orjson.loads((folder / manifest["interactions"][0]).read_bytes())
    assert first["client_req"]["body"]["json"]["model"] == "gpt-pass"
    assert first["client_req"]["headers"].count("authorization: Bearer <redacted>") == 1
    streamed = orjson.loads((folder / manifest["interactions"][1]).read_bytes())
    assert streamed["client_resp"]["chunks"][0]["raw"].startswith("data: ")
    assert llmitm("rec", "check-secrets", str(folder)).returncode == 0
    verified = llmitm("rec", "verify", str(folder))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    leaked = folder.parent / "leaked"
    leaked.mkdir(exist_ok=True)
    (leaked / "x.json").write_text(f'{{"key": "{SECRET}"}}')
    found = llmitm("rec", "check-secrets", str(leaked))
    assert found.returncode == 1 and "x.json" in found.stdout


def test_replay_reads_the_folder_directly(recorded: Recorded, folder: Path) -> None:
    with replaying(recorded, "folder", "llmitm_replay_from=client", folder=folder) as proxy:
        for (path, body, headers), expected in zip(CALLS, recorded.bodies, strict=True):
            replayed = raw_post(proxy, path, body, **headers).content
            assert replayed == expected.replace(SECRET.encode(), b"<redacted>")


def test_a_changed_upstream_request_is_reported_as_drift(
    recorded: Recorded, folder: Path, tmp_path: Path
) -> None:
    # As if the translator had once mapped the request differently: the recorded upstream
    # request of the Responses-over-chat call says another temperature.
    changed = tmp_path / "recordings"
    shutil.copytree(folder, changed)
    manifest = orjson.loads((changed / "manifest.json").read_bytes())
    target = changed / manifest["interactions"][4]
    document = orjson.loads(target.read_bytes())
    assert document["plan"] == "responses→chat"
    document["upstream_req"]["body"]["json"]["temperature"] = 0.25
    target.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))
    report = tmp_path / "report.json"
    with replaying(recorded, "drift", f"llmitm_replay_report={report}", folder=changed) as proxy:
        answered = raw_post(proxy, *CALLS[4][:2])
        assert answered.status_code == 200  # drift warns; the answer is still served
    assert answered.content == recorded.bodies[4]
    drift = orjson.loads(report.read_bytes())["drift"]
    assert [entry["id"] for entry in drift] == [document["id"]]
    assert any("temperature" in line for line in drift[0]["diff"]), drift
    assert "replay drift" in (recorded.tmp / "drift" / "llmitm.log").read_text()


def test_run_replay_fails_the_command_on_a_miss_and_on_unused(
    recorded: Recorded, folder: Path, tmp_path: Path
) -> None:
    client = tmp_path / "client.py"
    client.write_text(REPLAY_CLIENT)
    config = tmp_path / "llmitm.toml"
    with tripwire() as wire:
        config.write_text(TWO_ENDPOINTS.format(chat=wire.url, responses=wire.url))

        def run(calls: list[Any], *options: str) -> subprocess.CompletedProcess[str]:
            return llmitm(
                "run", "--replay", str(folder), "--config", str(config), "--base-url",
                "--set", "llmitm_store=", "--set", f"confdir={tmp_path / 'conf'}",
                "--set", "termlog_verbosity=warn", "--set", "flow_detail=0", *options,
                "--", sys.executable, str(client), orjson.dumps(calls).decode(),
            )  # fmt: skip

        everything = run(CALLS, "--fail-on-unused", "--report", str(tmp_path / "r.json"))
        assert everything.returncode == 0, everything.stdout + everything.stderr
        assert "FAILED 0" in everything.stdout
        report = orjson.loads((tmp_path / "r.json").read_bytes())
        assert report["hits"] == len(CALLS) and report["misses"] == report["unused"] == []

        changed = [
            (CALLS[0][0], {**CALLS[0][1], "messages": [{"role": "user", "content": "?"}]}, {})
        ]
        missed = run(changed)
        assert missed.returncode == 1, missed.stdout + missed.stderr
        assert "FAILED 1" in missed.stdout  # the client itself exited 0
        assert "1 miss(es)" in missed.stderr and "chat.completions" in missed.stderr

        partial = run(CALLS[:2])
        assert partial.returncode == 0, partial.stderr  # unused recordings are fine…
        strict = run(CALLS[:2], "--fail-on-unused")
        assert strict.returncode == 1 and "unused:" in strict.stderr  # …unless asked


def test_rec_ls_show_and_diff_last_miss(recorded: Recorded) -> None:
    listed = llmitm("rec", "ls", "--db", str(recorded.db), "--json")
    rows = orjson.loads(listed.stdout)
    assert [row["model"] for row in rows[:2]] == ["gpt-pass", "gpt-pass"]
    timeline = llmitm(
        "rec", "show", rows[2]["id"], "--db", str(recorded.db), "--timeline", "--json"
    )
    events = orjson.loads(timeline.stdout)
    assert events and events[0]["t_ms"] <= events[-1]["t_ms"]
    assert events[-1]["event"] == "data: [DONE]"
    with replaying(recorded, "last-miss") as proxy:
        body = {"model": "gpt-pass", "messages": [{"role": "user", "content": "Something else"}]}
        assert raw_post(proxy, "/v1/chat/completions", body).status_code == 400
    diff = llmitm("rec", "diff", "--last-miss", "--db", str(recorded.db))
    assert diff.returncode == 1, diff.stderr
    assert '+        "content": "Something else"' in diff.stdout


# --- pacing and truncation through the relay -------------------------------------------------

PACED = {"x-fake-scenario": "text;events=6;first_byte_delay_ms=250;event_delay_ms=60"}
ROUNDS = 3
CUT = {"x-fake-scenario": "text;events=20;disconnect_after=4"}


def read_stream(
    proxy: Proxy, body: dict[str, Any], headers: dict[str, str]
) -> tuple[float, bytes, str]:
    """(seconds to the first content delta, bytes read, how it ended: "ok" or the error)."""
    url = f"http://127.0.0.1:{proxy.port()}/v1/chat/completions"
    received = b""
    first = 0.0
    with httpx.Client(timeout=30) as client:  # made before the clock starts: TLS set-up is slow
        start = time.monotonic()
        try:
            headers = {"content-type": "application/json", **headers}
            with client.stream("POST", url, content=orjson.dumps(body), headers=headers) as reply:
                for data in reply.iter_raw():
                    received += data
                    if not first and b'"content":"' in received.replace(b'"content":""', b""):
                        first = time.monotonic() - start
        except httpx.HTTPError as exc:
            return first, received, type(exc).__name__
    return first, received, "ok"


@pytest.mark.timing
def test_realtime_keeps_ttft_and_truncations_replay_as_truncations(tmp_path: Path) -> None:
    stream = {"model": "gpt-pass", "messages": MESSAGES, "stream": True}
    cut = {**stream, "user": "cut"}  # same key family, other scenario: keep them apart
    cut["messages"] = [{"role": "user", "content": "Cut me off."}]
    warm_up = {**stream, "messages": [{"role": "user", "content": "warm-up"}]}
    with fake_upstream(tmp_path) as up, llmitm_proxy(tmp_path, modes=[f"reverse:{up.url}"]) as p:
        read_stream(p, warm_up, {})  # a fresh process's first flow is slow: not this one
        # one key, three recordings: replayed in this order
        lives = [read_stream(p, stream, PACED) for _ in range(ROUNDS)]
        _, live_cut, live_cut_end = read_stream(p, cut, CUT)
    assert all(end == "ok" and ttft > 0.25 for ttft, _, end in lives)
    assert live_cut_end != "ok"  # the client saw the upstream's cut as a broken stream
    recorded = Recorded(tmp_path, tmp_path / "llmitm.db")
    with replaying(recorded, "realtime", "llmitm_replay_timing=realtime") as proxy:
        read_stream(proxy, warm_up, {})
        replays = [read_stream(proxy, stream, {}) for _ in range(ROUNDS)]
        _, replayed_cut, cut_end = read_stream(proxy, cut, {})
    assert [(body, end) for _, body, end in replays] == [(body, end) for _, body, end in lives]
    # Each recording's time to first token: its first content event's offset.
    listed = orjson.loads(llmitm("rec", "ls", "--db", str(recorded.db), "--json").stdout)
    paced_ids = [row["id"] for row in listed if row["key"] == listed[1]["key"]]  # after warm-up
    recorded_ttfts = []
    for paced_id in paced_ids:
        shown = llmitm("rec", "show", paced_id, "--db", str(recorded.db), "--timeline", "--json")
        events = orjson.loads(shown.stdout)
        recorded_ttfts.append(
            next(e["t_ms"] for e in events if '"content":"H' in e["event"]) / 1000
        )
    assert len(recorded_ttfts) == ROUNDS and min(recorded_ttfts) > 0.25
    gaps = [abs(ttft - then) for (ttft, _, _), then in zip(replays, recorded_ttfts, strict=True)]
    # Within 20 ms of the recording; on a loaded shared machine one slow wake-up may add more
    # to a single run, never to all of them.
    assert min(gaps) < 0.020 and max(gaps) < 0.060, (gaps, recorded_ttfts)
    assert cut_end == live_cut_end and replayed_cut == live_cut
    with replaying(recorded, "instant-cut") as proxy:
        ttft, _, _ = read_stream(proxy, stream, {})
        _, replayed_cut, cut_end = read_stream(proxy, cut, {})
    assert ttft < 0.2  # instant: no recorded waits (the first of three recordings)
    assert cut_end == live_cut_end and replayed_cut == live_cut  # cut even when instant


# --- the mixed modes --------------------------------------------------------------------------


def test_once_replay_or_record_and_rewrite(tmp_path: Path) -> None:
    db = tmp_path / "modes.db"
    chat = {"model": "gpt-pass", "messages": MESSAGES}
    other = {"model": "gpt-pass", "messages": [{"role": "user", "content": "Another one."}]}

    def count(scope: str) -> int:
        with sqlite3.connect(db) as connection:
            query = "SELECT count(*) FROM rec_interactions WHERE scope = ?"
            return connection.execute(query, (scope,)).fetchone()[0]

    def proxy_in(mode: str, name: str) -> AbstractContextManager[Proxy]:
        extra = ["--set", f"llmitm_record={mode}", "--set", f"llmitm_store={db}"]
        return llmitm_proxy(tmp_path / name, modes=[f"reverse:{up.url}"], extra=extra)

    with fake_upstream(tmp_path) as up:
        with proxy_in("once", "once-1") as proxy:  # an empty scope: recorded
            first = raw_post(proxy, "/v1/chat/completions", chat, **{"x-llmitm-scope": "a"})
            assert first.status_code == 200 and "x-llmitm-replay" not in first.headers
        assert count("a") == 1
        with proxy_in("once", "once-2") as proxy:  # a recorded scope: replayed, strictly
            hit = raw_post(proxy, "/v1/chat/completions", chat, **{"x-llmitm-scope": "a"})
            assert hit.headers["x-llmitm-replay"] == "hit" and hit.content == first.content
            miss = raw_post(proxy, "/v1/chat/completions", other, **{"x-llmitm-scope": "a"})
            assert miss.status_code == 400 and miss.headers["x-llmitm-replay"] == "miss"
            fresh = raw_post(proxy, "/v1/chat/completions", other, **{"x-llmitm-scope": "b"})
            assert fresh.status_code == 200 and "x-llmitm-replay" not in fresh.headers
        assert count("a") == 1 and count("b") == 1
        with proxy_in("replay-or-record", "ror") as proxy:  # misses go upstream and are kept
            missed = raw_post(proxy, "/v1/chat/completions", other, **{"x-llmitm-scope": "a"})
            assert missed.status_code == 200 and "x-llmitm-replay" not in missed.headers
            hit = raw_post(proxy, "/v1/chat/completions", chat, **{"x-llmitm-scope": "a"})
            assert hit.headers["x-llmitm-replay"] == "hit"
        assert count("a") == 2
        with proxy_in("rewrite", "rewrite") as proxy:  # a scope's first request wipes it
            assert raw_post(proxy, "/v1/chat/completions", chat, **{"x-llmitm-scope": "a"})
            assert raw_post(proxy, "/v1/chat/completions", other, **{"x-llmitm-scope": "a"})
        assert count("a") == 2 and count("b") == 1
    with sqlite3.connect(db) as connection:
        modes = connection.execute(
            "SELECT mode FROM rec_interactions WHERE scope = 'a' ORDER BY started_us"
        ).fetchall()
    assert modes == [("rewrite",), ("rewrite",)]


FAILOVER = """
[endpoints.dead]
kind = "compatible"
base_url = "http://127.0.0.1:{dead}/v1"
apis = ["chat"]

[endpoints.alive]
kind = "compatible"
base_url = "{chat}/v1"
apis = ["chat"]

[[routes]]
models = ["fo-*"]
endpoints = ["dead", "alive"]
strategy = "failover"
"""


def test_a_failover_flow_records_what_the_answering_endpoint_was_sent(tmp_path: Path) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        dead = closed.getsockname()[1]  # nothing listens once the socket is closed
    body = {"model": "fo-1", "input": "Say hello.", "stream": True}
    with fake_upstream(tmp_path) as up:
        config = FAILOVER.format(dead=dead, chat=up.url)
        with llmitm_proxy(tmp_path / "rec", config=config) as proxy:
            live = raw_post(proxy, "/v1/responses", body)
            # The id the client saw is the one stored (every candidate carries the same id).
            (response_id,) = set(re.findall(rb'"id":"(resp_[0-9a-f]+)"', live.content))
            with httpx.Client(timeout=30) as client:
                # Stored responses belong to the credential that created them.
                stored = client.get(
                    f"{proxy.base_url()}/responses/{response_id.decode()}",
                    headers={"authorization": f"Bearer {SECRET}"},
                )
    assert stored.status_code == 200, stored.text
    assert live.status_code == 200 and live.headers["x-llmitm-endpoint"] == "alive"
    done = llmitm("rec", "export", str(tmp_path / "out"), "--db", str(tmp_path / "rec/llmitm.db"))
    assert done.returncode == 0, done.stderr
    manifest = orjson.loads((tmp_path / "out" / "manifest.json").read_bytes())
    recordings = [
        orjson.loads((tmp_path / "out" / n).read_bytes()) for n in manifest["interactions"]
    ]
    (recording,) = [r for r in recordings if r["method"] == "POST"]
    assert recording["endpoint"] == "alive" and recording["plan"] == "responses→chat"
    sent = recording["upstream_req"]
    assert sent["url"] == f"{up.url}/v1/chat/completions"  # not llmitm's relay
    assert sent["body"]["json"]["messages"][-1]["content"] == "Say hello."
    assert "authorization: Bearer <redacted>" in sent["headers"]
    with tripwire() as wire:
        config = FAILOVER.format(dead=wire.port, chat=wire.url)
        args = ["--set", "llmitm_record=replay", "--set", f"llmitm_recordings={tmp_path / 'out'}"]
        with llmitm_proxy(tmp_path / "replay", config=config, extra=args) as proxy:
            again = raw_post(proxy, "/v1/responses", body)
    assert again.content == live.content
