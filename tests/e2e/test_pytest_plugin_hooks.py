"""The pytest plugin's record hook, per-test marker and miss advice, end to end: an inner
suite records against the fake upstream with a ``pytest_llmitm_before_record`` hook in its
conftest (dropping one call, editing another), then replays with no upstream at all."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from llmitm.store import folder as folder_files

from .processes import fake_upstream
from .test_record_replay import tripwire

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.slow

CONFTEST = """
def pytest_llmitm_before_record(interaction):
    if b"private" in interaction.legs["client_req"].content:
        return None  # never written
    for leg in ("upstream_resp", "client_resp"):
        message = interaction.legs[leg]
        message.content = message.content.replace(b"fake upstream", b"edited upstream")
    return interaction
"""

SUITE = """
import os

import openai, pytest

PROMPT = os.environ["INNER_PROMPT"]


def ask(text):
    client = openai.OpenAI(max_retries=0)
    reply = client.chat.completions.create(
        model="gpt-x", messages=[{"role": "user", "content": text}]
    )
    return reply.choices[0].message.content


def test_edited(llmitm):
    print("@ edited", ask("Hi"))


def test_private(llmitm):
    print("@ private", ask("private: Hi"))


@pytest.mark.llmitm(match_ignore=["messages.0.content"])
def test_any_prompt(llmitm):
    print("@ any", ask(PROMPT))


@pytest.mark.llmitm(scope="test_suite.py::test_edited")
def test_shares_a_scope(llmitm):
    print("@ shared", ask("Hi"))
"""


@pytest.fixture
def inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    for name in list(os.environ):
        if name.startswith(("OPENAI_", "HTTPS_PROXY", "https_proxy", "PYTEST_ADDOPTS")):
            monkeypatch.delenv(name)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_suite=SUITE)
    return pytester


def said(result: pytest.RunResult) -> dict[str, str]:
    found = {}
    for line in result.stdout.lines:
        at = line.find("@ ")
        if at >= 0:
            name, _, rest = line[at + 2 :].partition(" ")
            found[name] = rest
    return found


def test_hook_drops_and_edits_and_marker_applies_per_test(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    folder = inner.path / "recordings"
    common = ("-s", "-p", "no:cacheprovider", f"--llmitm-recordings={folder}")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-" + "k" * 30)
    monkeypatch.setenv("INNER_PROMPT", "first prompt")
    with fake_upstream(tmp_path / "up") as up:
        recorded = inner.runpytest_subprocess(
            *common, "--llmitm-record-mode=record", f"--llmitm-upstream={up.url}",
            "--llmitm-allow-record-in-ci", "--deselect=test_suite.py::test_shares_a_scope",
            timeout=240,
        )  # fmt: skip
    recorded.assert_outcomes(passed=3, deselected=1)
    # The upstream's own answer went to the test; the hook changed only what was kept.
    assert said(recorded)["edited"] == "Hello from the fake upstream."
    kept = {i.scope: i for i in folder_files.read_folder(folder)}
    assert sorted(kept) == ["test_suite.py::test_any_prompt", "test_suite.py::test_edited"]
    edited = kept["test_suite.py::test_edited"].legs["client_resp"].body()
    assert b"Hello from the edited upstream." in edited
    assert b"Hello from the fake upstream." not in edited

    monkeypatch.delenv("OPENAI_API_KEY")
    monkeypatch.setenv("INNER_PROMPT", "another prompt")  # only test_any_prompt ignores it
    with tripwire() as wire:
        replayed = inner.runpytest_subprocess(
            *common, "--llmitm-record-mode=replay", f"--llmitm-upstream={wire.url}", timeout=240
        )
    replayed.assert_outcomes(passed=3, failed=1)
    answers = said(replayed)
    assert answers["edited"] == "Hello from the edited upstream."
    assert answers["shared"] == "Hello from the edited upstream."  # the marker's scope
    assert answers["any"] == "Hello from the edited upstream."  # the marker's match_ignore
    output = replayed.stdout.str()
    # The dropped call misses, and the advice is the plugin's own switches.
    assert "FAILED test_suite.py::test_private - openai.BadRequestError" in output
    assert "--llmitm-record-mode=replay-or-record" in output
    assert '@pytest.mark.llmitm(record_mode="replay-or-record")' in output
    assert "--set llmitm_record" not in output


BROKEN = """
def pytest_llmitm_before_record(interaction):
    if b"break" in interaction.legs["client_req"].content:
        raise RuntimeError("broken filter")
    return interaction
"""


def test_a_failing_hook_drops_that_recording(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in list(os.environ):
        if name.startswith(("OPENAI_", "HTTPS_PROXY", "https_proxy")):
            monkeypatch.delenv(name)
    pytester.makeconftest(BROKEN)
    pytester.makepyfile(
        test_suite="""
        import openai

        import pytest

        @pytest.mark.parametrize("text", ["break", "fine"])
        def test_call(llmitm, text):
            client = openai.OpenAI(max_retries=0)
            message = {"role": "user", "content": text}
            client.chat.completions.create(model="gpt-x", messages=[message])
            assert llmitm.exchanges[0].outcome == "upstream"
        """
    )
    monkeypatch.setenv("OPENAI_API_KEY", "sk-" + "k" * 30)
    folder = pytester.path / "recordings"
    with fake_upstream(tmp_path / "up") as up:
        result = pytester.runpytest_subprocess(
            "-p", "no:cacheprovider", f"--llmitm-recordings={folder}",
            "--llmitm-record-mode=record", f"--llmitm-upstream={up.url}",
            "--llmitm-allow-record-in-ci", timeout=240,
        )  # fmt: skip
    result.assert_outcomes(passed=2)
    # The call whose filter raised is not written; the other one is.
    kept = folder_files.read_folder(folder)
    assert [i.scope for i in kept] == ["test_suite.py::test_call[fine]"]
