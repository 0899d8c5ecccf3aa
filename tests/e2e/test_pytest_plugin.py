"""The pytest plugin: a suite records once against an upstream, then replays with none —
each test in its own scope — and a changed request fails its test with the miss."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .processes import fake_upstream
from .test_record_replay import tripwire

pytestmark = pytest.mark.slow

SUITE = """
import openai, pytest

PROMPT = "{prompt}"

@pytest.mark.usefixtures("llmitm")
def test_chat():
    client = openai.OpenAI(max_retries=0)
    reply = client.chat.completions.create(
        model="gpt-x", messages=[{{"role": "user", "content": PROMPT}}])
    assert reply.choices[0].message.content == "Hello from the fake upstream."

def test_stream(llmitm):
    assert "/llmitm-scope/" in llmitm.base_url
    client = openai.OpenAI(max_retries=0)
    with client.responses.stream(model="gpt-x", input=PROMPT) as stream:
        assert stream.get_final_response().output_text == "Hello from the fake upstream."
"""


def run_suite(
    tmp: Path, prompt: str, *options: str, key: str | None = None
) -> subprocess.CompletedProcess[str]:
    (tmp / "test_suite.py").write_text(SUITE.format(prompt=prompt))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "HTTPS_PROXY"))}
    if key:
        env["OPENAI_API_KEY"] = key  # recording needs one; replay needs none
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_suite.py",
         "--llmitm-recordings", str(tmp / "recordings"), *options],
        cwd=tmp, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_record_once_then_replay_offline(tmp_path: Path) -> None:
    with fake_upstream(tmp_path / "up") as up:
        recorded = run_suite(
            tmp_path,
            "Hi",
            "--llmitm-record-mode",
            "record",
            "--llmitm-upstream",
            up.url,
            key="sk-" + "k" * 30,
        )
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    scopes = sorted(p.name for p in (tmp_path / "recordings").iterdir() if p.is_dir())
    assert [name.split("-")[0] for name in scopes] == [
        "test_suite.py_test_chat",
        "test_suite.py_test_stream",
    ]
    with tripwire() as wire:
        replayed = run_suite(tmp_path, "Hi", "--llmitm-upstream", wire.url)
        assert replayed.returncode == 0, replayed.stdout + replayed.stderr
        changed = run_suite(tmp_path, "Hello?", "--llmitm-upstream", wire.url)
    assert changed.returncode == 1
    assert "2 failed" in changed.stdout and "llmitm replay miss" in changed.stdout
    assert "scope='test_suite.py::test_chat'" in changed.stdout
