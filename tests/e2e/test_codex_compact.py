"""The real Codex CLI (0.171, default configuration: a fresh ``CODEX_HOME``, no config.toml,
only ``OPENAI_API_KEY``) under ``llmitm run -- codex exec``, routed from api.openai.com to the
chat-only fake upstream, compacts its context and keeps working.

Codex compacts with ``remote_compaction_v2``: a create call whose input ends with a
``compaction_trigger`` item, which must stream back exactly one ``compaction`` item (else the
turn fails: "remote compaction v2 expected exactly one compaction output item"). A low
``model_auto_compact_token_limit`` makes the second turn (``exec resume --last``) compact
before it samples; llmitm runs the summarisation over the chat endpoint, Codex keeps the
sealed item in its history and sends it with the turn, and the chat upstream sees it as the
summary message. (Codex first tries its WebSocket transport for a few seconds and falls back
to HTTPS; that is expected here.)
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import orjson
import pytest

from llmitm.responses_api.compaction import (
    SUMMARY_INSTRUCTIONS,
    SUMMARY_PREFIX,
    TRANSCRIPT_INTRO,
)

from .conftest import CODEX_UNATTENDED, codex_env
from .processes import LLMITM, Upstream, fake_upstream

pytestmark = pytest.mark.slow

CONFIG = """
[endpoints.local]
kind = "compatible"
base_url = "{url}/v1"
apis = ["chat"]

[[routes]]
models = ["*"]
hosts = ["api.openai.com"]
endpoints = ["local"]
model = "echo"
"""
# The fake's echo scenario ("Echo: <last user text>") never calls a tool: with a compaction
# limit this low, a fake that calls a tool whenever the last message is not a tool result
# would be summarised into calling it again, for ever. Its summary quotes the transcript.
ECHOED_SUMMARY = f"{SUMMARY_PREFIX}Echo: {TRANSCRIPT_INTRO}"


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    with fake_upstream(tmp_path_factory.mktemp("codex-compact-upstream"), "chat") as fake:
        yield fake


def codex_under_llmitm(
    tmp: Path, upstream: Upstream, codex: Path, home: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    config = tmp / "llmitm.toml"
    config.write_text(CONFIG.format(url=upstream.url))
    confdir = tmp / "confdir"
    # Nothing but the key: llmitm run sets the proxy and the CA (SSL_CERT_FILE) itself.
    env = codex_env(home, {"OPENAI_API_KEY": "sk-default-codex"})
    return subprocess.run(
        [str(LLMITM), "run", "--config", str(config), "--set", f"confdir={confdir}",
         "--set", f"llmitm_store={tmp / 'llmitm.db'}", "-q", "--",
         str(codex), "exec", "--skip-git-repo-check", *CODEX_UNATTENDED, "--color", "never",
         "-c", "model_auto_compact_token_limit=2000", *args],
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=150,
        env=env,
        check=False,
    )  # fmt: skip


def upstream_bodies(upstream: Upstream) -> list[dict[str, Any]]:
    return [r["body"] for r in orjson.loads(httpx.get(f"{upstream.url}/_requests").content)]


def test_codex_compacts_over_a_chat_endpoint_and_continues(
    tmp_path: Path, upstream: Upstream, codex_bin: Path
) -> None:
    httpx.post(f"{upstream.url}/_reset")
    home = tmp_path / "codex-home"
    home.mkdir()
    first = codex_under_llmitm(tmp_path, upstream, codex_bin, home, "--", "Remember teal.")
    assert first.returncode == 0, first.stderr[-3000:]
    second = codex_under_llmitm(
        tmp_path, upstream, codex_bin, home, "resume", "--last", "What did I ask you?"
    )
    output = f"--- stdout\n{second.stdout[-2000:]}\n--- stderr\n{second.stderr[-4000:]}"
    assert second.returncode == 0, output
    assert "context compacted" in second.stderr, output
    assert "remote compact" not in second.stderr, output  # Codex's compaction error

    bodies = upstream_bodies(upstream)
    summarising = [
        i for i, b in enumerate(bodies) if b["messages"][0].get("content") == SUMMARY_INSTRUCTIONS
    ]
    assert summarising, [b["messages"][0]["content"][:80] for b in bodies]
    transcript = bodies[summarising[0]]["messages"][1]["content"]
    assert "Remember teal." in transcript and "tools" not in bodies[summarising[0]]
    # Every turn request after the (first) compaction carries the summary as a user message.
    after = [b for i, b in enumerate(bodies) if i > summarising[0] and i not in summarising]
    assert after
    for body in after:
        summaries = [
            m["content"]
            for m in body["messages"]
            if m["role"] == "user" and str(m["content"]).startswith(SUMMARY_PREFIX)
        ]
        [summary] = summaries
        assert summary.startswith(ECHOED_SUMMARY) and "Remember teal." in summary

    # Codex keeps llmitm's sealed item in its own history (the rollout's replacement
    # history), opaque to it.
    records = [
        orjson.loads(line)
        for path in home.glob("sessions/**/rollout-*.jsonl")
        for line in path.read_text().splitlines()
    ]
    tokens = [item.get("encrypted_content") for item in _items_of_type(records, "compaction")]
    assert tokens and all(t.startswith("gAAAAA") and "teal" not in t for t in tokens), tokens


def _items_of_type(value: Any, kind: str) -> Iterator[dict[str, Any]]:
    if isinstance(value, dict):
        if value.get("type") == kind:
            yield value
        for child in value.values():
            yield from _items_of_type(child, kind)
    elif isinstance(value, list):
        for child in value:
            yield from _items_of_type(child, kind)
