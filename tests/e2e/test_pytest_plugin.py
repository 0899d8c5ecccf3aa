"""The pytest plugin, run by pytester in an inner pytest process: a suite records once
against the fake upstream, then replays with none — each test in its own scope, the proxy a
thread of the inner process — and a changed request fails its test with the miss."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .processes import fake_upstream
from .test_record_replay import tripwire

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.slow

SUITE = """
import os, threading
from pathlib import Path

import openai, pytest

PROMPT = os.environ.get("INNER_PROMPT", "Hi")
MESSAGES = [{"role": "user", "content": PROMPT}]
REPLAY = "--llmitm-record-mode=replay" in os.environ.get("INNER_MODE", "")


def ask(**headers):
    client = openai.OpenAI(max_retries=0, default_headers=headers)
    reply = client.chat.completions.create(model="gpt-x", messages=MESSAGES)
    return reply.choices[0].message.content


@pytest.mark.usefixtures("llmitm")
def test_chat():
    assert ask() == "Hello from the fake upstream."


def test_stream(llmitm):
    assert "/llmitm-scope/" in llmitm.base_url
    client = openai.OpenAI(max_retries=0)
    with client.responses.stream(model="gpt-x", input=PROMPT) as stream:
        assert stream.get_final_response().output_text == "Hello from the fake upstream."
    assert [e.outcome for e in llmitm.exchanges] == ["hit" if REPLAY else "upstream"]


# Identical requests in two scopes: the upstream's answer differs by a header the match key
# ignores, so only the scope tells the replayed answers apart.
def test_twin_a(llmitm):
    assert ask(**{"x-fake-scenario": "text"}) == "Hello from the fake upstream."


def test_twin_b(llmitm):
    assert ask(**{"x-fake-scenario": "text;events=2"}) == "Hello from"


def test_own_master_between():
    # A test with its own mitmproxy master (taddons) takes mitmproxy.ctx from llmitm's.
    from mitmproxy.test import taddons

    with taddons.context() as tctx:
        tctx.options.update(listen_port=1)


def test_in_process(llmitm):
    assert ask() == "Hello from the fake upstream."
    assert len(llmitm.hits) == (1 if REPLAY else 0) and not llmitm.misses
    assert [t.name for t in threading.enumerate()].count("llmitm") == 1
    me = os.getpid()
    children = [
        pid
        for task in Path(f"/proc/{me}/task").iterdir()
        for pid in (task / "children").read_text().split()
    ]
    assert children == [], f"child processes: {children}"


def test_swallowed_miss(llmitm):
    try:
        ask()
    except openai.BadRequestError:
        pass
"""


@pytest.fixture
def inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    for name in list(os.environ):
        if name.startswith(("OPENAI_", "HTTPS_PROXY", "https_proxy")):
            monkeypatch.delenv(name)
    pytester.makepyfile(test_suite=SUITE)
    return pytester


def run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, *options: str, prompt: str = "Hi"
) -> pytest.RunResult:
    monkeypatch.setenv("INNER_PROMPT", prompt)
    monkeypatch.setenv("INNER_MODE", " ".join(options))
    recordings = str(pytester.path / "recordings")
    return pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--llmitm-recordings", recordings, *options, timeout=300
    )


def test_record_then_replay_in_process(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-" + "k" * 30)  # recording needs one
    with fake_upstream(tmp_path / "up") as up:
        recorded = run(
            inner, monkeypatch, "--llmitm-record-mode=record", f"--llmitm-upstream={up.url}",
            "--llmitm-allow-record-in-ci",
            "--deselect=test_suite.py::test_swallowed_miss",
        )  # fmt: skip
    recorded.assert_outcomes(passed=6, deselected=1)
    folder = inner.path / "recordings"
    scopes = sorted(p.name.split("-")[0] for p in folder.iterdir() if p.is_dir())
    assert scopes == [
        f"test_suite.py_test_{name}"
        for name in ("chat", "in_process", "stream", "twin_a", "twin_b")
    ]
    assert "sk-kkk" not in "".join(p.read_text() for p in folder.rglob("*.json"))

    monkeypatch.delenv("OPENAI_API_KEY")  # replay needs none
    with tripwire() as wire:
        replayed = run(
            inner, monkeypatch, "--llmitm-record-mode=replay", f"--llmitm-upstream={wire.url}",
            "--deselect=test_suite.py::test_swallowed_miss",
        )  # fmt: skip
        replayed.assert_outcomes(passed=6, deselected=1)

        # A changed prompt misses: the SDK raises BadRequestError with the proxy's message,
        # and the report shows the misses with llmitm's log of the test.
        changed = run(
            inner, monkeypatch, "--llmitm-record-mode=replay", f"--llmitm-upstream={wire.url}",
            prompt="Hello?",
        )  # fmt: skip
    changed.assert_outcomes(passed=1, failed=6)  # test_own_master_between makes no call
    output = changed.stdout.str()
    assert "openai.BadRequestError: Error code: 400" in output
    assert "llmitm replay miss" in output and "scope='test_suite.py::test_chat'" in output
    assert "- llmitm replay misses -" in output
    assert (
        "llmitm log:\nERROR llmitm.addons.record: REPLAY MISS scope=test_suite.py::test_chat"
        in output
    )
    assert "CancelledError" not in output  # the proxy stops cleanly
    # The test that caught the error fails all the same.
    assert "llmitm: 1 replay miss(es) in a passing test" in output


def test_replay_without_a_folder_fails_clearly(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = run(inner, monkeypatch, "-k", "test_chat")
    result.assert_outcomes(errors=1)
    assert "llmitm did not start" in result.stdout.str()
    assert "no manifest.json (not a recordings folder)" in result.stdout.str()


def test_recording_in_ci_needs_saying_so(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CI", "true")
    with fake_upstream(tmp_path / "up") as up:
        refused = run(
            inner, monkeypatch, "--llmitm-record-mode=record", f"--llmitm-upstream={up.url}",
            "-k", "test_chat",
        )  # fmt: skip
    output = refused.stdout.str() + refused.stderr.str()
    assert refused.ret != 0 and "allow_record_in_ci" in output, output
    assert not (inner.path / "recordings").exists()
