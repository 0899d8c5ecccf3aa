"""Replay policies through real llmitm processes: what a hit on an exhausted key gets, the miss
status, strict drift, the host in match keys and the CI guard on recording.

One recording session against the fake upstream; every replay runs with a tripwire where
every upstream was (see test_record_replay.py), so no policy ever reaches the network.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx2 as httpx
import openai
import orjson
import pytest

from llmitm.store.folder import write_folder

from .processes import LLMITM, TWO_ENDPOINTS, Proxy, fake_upstream, llmitm_proxy
from .test_record_replay import SECRET, Recorded, raw_post, sdk, tripwire

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "Say hello."}]
POLL = {"model": "gpt-pass", "messages": MESSAGES, "stream": True}
"""One key, recorded twice with two different answers."""
POLL_ANSWERS = ({"x-fake-scenario": "text;events=3"}, {"x-fake-scenario": "text;events=7"})
TRANSLATED = {"model": "over-chat-1", "input": "Say hello."}
"""A Responses request over the chat-only endpoint: its upstream request is a translation."""

RENAMED = TWO_ENDPOINTS.replace(
    'endpoints = ["chat-only"]', 'endpoints = ["chat-only"]\nmodel = "renamed-upstream"'
)
"""The same routes, but over-chat* now sends another model name upstream: drift."""


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    tmp = tmp_path_factory.mktemp("policy")
    result = Recorded(tmp, tmp / "llmitm.db")
    with fake_upstream(tmp) as up:
        config = TWO_ENDPOINTS.format(chat=up.url, responses=up.url)
        with llmitm_proxy(tmp, config=config, modes=[f"reverse:{up.url}"]) as proxy:
            for headers in POLL_ANSWERS:
                result.bodies.append(
                    raw_post(proxy, "/v1/chat/completions", POLL, **headers).content
                )
            for body in (TRANSLATED, {**TRANSLATED, "stream": True}):
                response = raw_post(proxy, "/v1/responses", body)
                assert response.status_code == 200, response.text
                result.bodies.append(response.content)
    assert result.bodies[0] != result.bodies[1]
    return result


@contextmanager
def replaying(
    recorded: Recorded,
    name: str,
    *options: str,
    config: str = TWO_ENDPOINTS,
    target_host: str = "127.0.0.1",
) -> Iterator[Proxy]:
    """A replay of the recorded store; ``target_host``: the host of the reverse target
    (what requests carry as their host)."""
    with tripwire() as wire:
        args = ["--set", "llmitm_record=replay", "--set", f"llmitm_store={recorded.db}"]
        args += ["--set", f"llmitm_replay_report={recorded.tmp / name / 'report.json'}"]
        for option in options:
            args += ["--set", option]
        with llmitm_proxy(
            recorded.tmp / name,
            config=config.format(chat=wire.url, responses=wire.url),
            modes=[f"reverse:http://{target_host}:{wire.port}"],
            extra=args,
        ) as proxy:
            yield proxy


def report(recorded: Recorded, name: str) -> dict[str, Any]:
    return orjson.loads((recorded.tmp / name / "report.json").read_bytes())


def polls(proxy: Proxy, times: int) -> list[bytes]:
    out = []
    for _ in range(times):
        response = raw_post(proxy, "/v1/chat/completions", POLL)
        assert response.status_code == 200, response.text
        assert response.headers["x-llmitm-replay"] == "hit"
        out.append(response.content)
    return out


# --- an exhausted key ------------------------------------------------------------------------


def test_repeat_last_and_cycle_serve_an_exhausted_key_again(recorded: Recorded) -> None:
    first, second = recorded.bodies[:2]
    with replaying(recorded, "repeat", "llmitm_replay_exhausted=repeat_last") as proxy:
        assert polls(proxy, 4) == [first, second, second, second]
    with replaying(recorded, "cycle", "llmitm_replay_exhausted=cycle") as proxy:
        assert polls(proxy, 5) == [first, second, first, second, first]
    assert report(recorded, "cycle")["misses"] == []
    with replaying(recorded, "error") as proxy:  # the default
        assert polls(proxy, 2) == [first, second]
        again = raw_post(proxy, "/v1/chat/completions", POLL)
    assert again.status_code == 400 and again.headers["x-should-retry"] == "false"
    error = again.json()["error"]
    assert error["code"] == "replay_exhausted"
    assert "exhausted: served 2 of 2 recording(s) for key " in error["message"]
    assert [m["reason"] for m in report(recorded, "error")["misses"]] == ["exhausted"]


# --- the miss status -------------------------------------------------------------------------


def test_a_5xx_miss_status_is_not_retried_by_the_sdk(recorded: Recorded) -> None:
    with replaying(recorded, "miss-503", "llmitm_miss_status=503") as proxy:
        client = openai.OpenAI(base_url=proxy.base_url(), api_key=SECRET, max_retries=3)
        changed = [{"role": "user", "content": "Not recorded."}]
        with pytest.raises(openai.InternalServerError) as caught:
            client.chat.completions.create(model="gpt-pass", messages=changed)  # type: ignore[arg-type]
        assert caught.value.status_code == 503
        assert caught.value.response.headers["x-llmitm-replay"] == "miss"
        assert "llmitm replay miss" in caught.value.message
    # x-should-retry: false held the SDK's three retries back: one request, one miss
    assert len(report(recorded, "miss-503")["misses"]) == 1


def test_a_miss_status_that_is_not_an_error_is_refused_at_start(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(LLMITM), "run", "--listen-port", "0", "--set", f"confdir={tmp_path}",
         "--set", "llmitm_store=", "--set", "llmitm_miss_status=200"],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 1
    assert "llmitm_miss_status must be an HTTP error status" in done.stdout + done.stderr


# --- drift -----------------------------------------------------------------------------------


def test_strict_drift_refuses_before_any_byte_and_names_the_recording(recorded: Recorded) -> None:
    with replaying(recorded, "drift-strict", "llmitm_strict_drift=true", config=RENAMED) as proxy:
        with pytest.raises(openai.BadRequestError) as caught:
            sdk(proxy).responses.create(**TRANSLATED)  # type: ignore[call-overload]
        error = caught.value.body
        assert isinstance(error, dict) and error["type"] == "llmitm_replay_drift"
        assert caught.value.response.headers["x-should-retry"] == "false"
        message = error["message"]
        assert "llmitm rec diff --last-miss" in message and "recording " in message
        # a stream request: the refusal, not one SSE byte
        with (
            httpx.Client(timeout=30) as client,
            client.stream(
                "POST",
                f"{proxy.base_url()}/responses",
                content=orjson.dumps({**TRANSLATED, "stream": True}),
                headers={"content-type": "application/json"},
            ) as streamed,
        ):
            body = streamed.read()
        assert streamed.status_code == 400
        assert streamed.headers["content-type"] == "application/json"
        assert b"data:" not in body and orjson.loads(body)["error"]["code"] == "replay_drift"
        assert "llmitm: replay drift" in proxy.log_text()
    drift = report(recorded, "drift-strict")["drift"]
    assert len(drift) == 2 and drift[0]["id"] in message
    assert any('"renamed-upstream"' in line for line in drift[0]["diff"])
    diff = subprocess.run(
        [str(LLMITM), "rec", "diff", "--last-miss", "--db", str(recorded.db)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert "(drift)" in diff.stdout and '+  "model": "renamed-upstream"' in diff.stdout, diff


def test_drift_without_strict_still_serves_and_is_reported(recorded: Recorded) -> None:
    with replaying(recorded, "drift-warn", config=RENAMED) as proxy:
        answer = sdk(proxy).responses.create(**TRANSLATED)  # type: ignore[call-overload]
        assert answer.output_text == "Hello from the fake upstream."
    assert [d["id"] for d in report(recorded, "drift-warn")["drift"]] != []
    with replaying(recorded, "no-drift", "llmitm_strict_drift=true") as proxy:  # unchanged
        answer = sdk(proxy).responses.create(**TRANSLATED)  # type: ignore[call-overload]
        assert answer.output_text == "Hello from the fake upstream."
    assert report(recorded, "no-drift")["drift"] == []


# --- the host in match keys ------------------------------------------------------------------


def test_the_host_counts_in_the_key_only_with_match_host(recorded: Recorded) -> None:
    # Recorded through a reverse proxy to 127.0.0.1; replayed through one to "localhost".
    with replaying(recorded, "host-off", target_host="localhost") as proxy:
        assert polls(proxy, 1) == [recorded.bodies[0]]
    with replaying(recorded, "host-on", "llmitm_match_host=true", target_host="localhost") as proxy:
        missed = raw_post(proxy, "/v1/chat/completions", POLL)
        assert missed.status_code == 400
        assert "no recording with this key" in missed.json()["error"]["message"]
        log = proxy.log_text()
        assert '-  "host": "127.0.0.1"' in log and '+  "host": "localhost"' in log
    with replaying(recorded, "host-same", "llmitm_match_host=true") as proxy:
        assert polls(proxy, 1) == [recorded.bodies[0]]


# --- the CI guard ----------------------------------------------------------------------------


def llmitm_run(tmp: Path, *options: str, ci: str | None = "true") -> subprocess.CompletedProcess:
    """``llmitm run`` that stops at once when it starts (``-n``: no proxy server)."""
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    args = [str(LLMITM), "run", "-n", "--set", f"confdir={tmp / 'conf'}", "--set", "llmitm_store="]
    for option in options:
        args += ["--set", option]
    return subprocess.run(
        [*args, "--rfile", str(tmp / "none.flows")],
        capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_ci_refuses_to_record_into_a_folder_unless_allowed(tmp_path: Path) -> None:
    (tmp_path / "none.flows").write_bytes(b"")
    folder = f"llmitm_recordings={tmp_path / 'recordings'}"
    for mode in ("record", "once", "replay-or-record", "rewrite"):
        refused = llmitm_run(tmp_path, f"llmitm_record={mode}", folder)
        assert refused.returncode == 1, refused
        output = refused.stdout + refused.stderr
        assert f"llmitm_record={mode} would record into the recordings folder" in output
        assert "llmitm_allow_record_in_ci=true" in output and "Traceback" not in output
    assert llmitm_run(tmp_path, "llmitm_record=record", folder, ci="1").returncode == 1
    allowed = llmitm_run(tmp_path, "llmitm_record=once", folder, "llmitm_allow_record_in_ci=true")
    assert allowed.returncode == 0, allowed
    assert llmitm_run(tmp_path, "llmitm_record=record", folder, ci=None).returncode == 0
    assert llmitm_run(tmp_path, "llmitm_record=record", folder, ci="false").returncode == 0
    write_folder(tmp_path / "recordings", [], {"profile": "default", "ignore": []})
    assert llmitm_run(tmp_path, "llmitm_record=replay", folder).returncode == 0


def test_ci_still_records_into_the_local_store_by_default(tmp_path: Path) -> None:
    db = tmp_path / "llmitm.db"
    with (
        fake_upstream(tmp_path) as up,
        llmitm_proxy(tmp_path, modes=[f"reverse:{up.url}"], env={"CI": "true"}) as proxy,
    ):
        assert raw_post(proxy, "/v1/chat/completions", POLL).status_code == 200
    listed = subprocess.run(
        [str(LLMITM), "rec", "ls", "--db", str(db), "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert len(orjson.loads(listed.stdout)) == 1
