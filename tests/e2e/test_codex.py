"""Codex CLI through a real llmitm process to a chat-only upstream: a whole tool loop.

Codex speaks only the Responses API; its provider ``base_url`` is llmitm's reverse listener,
which routes the model to the deterministic fake upstream's ``/v1/chat/completions``. Turn 1:
the fake answers with an ``exec_command`` call (``cmd``: ``echo llmitm-tool-ok``); llmitm
turns it into the Responses events Codex runs tools from, Codex runs the command, and turn 2
carries the ``function_call_output``, which the fake sees as a chat ``tool`` message and
echoes as its final text. Codex's hosted ``web_search`` tool cannot run upstream (dropped with
a warning) and its namespace (MCP) tools are flattened to plain functions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import httpx2 as httpx
import orjson
import pytest

from .conftest import CodexResult
from .processes import Proxy, Upstream, fake_upstream, llmitm_proxy

pytestmark = pytest.mark.slow

CONFIG = """
[endpoints.chat-only]
kind = "compatible"
base_url = "{chat}/v1"
apis = ["chat"]

[[routes]]
models = ["codex-*"]
endpoints = ["chat-only"]
"""

TOOL_OUTPUT = "llmitm-tool-ok"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proxy, Upstream]]:
    tmp = tmp_path_factory.mktemp("codex")
    with (
        fake_upstream(tmp, "chat") as chat,
        llmitm_proxy(tmp, config=CONFIG.format(chat=chat.url)) as proxy,
    ):
        yield proxy, chat


def upstream_requests(upstream: Upstream) -> list[dict]:
    return orjson.loads(httpx.get(f"{upstream.url}/_requests").content)


def test_codex_tool_loop_over_chat_upstream(
    stack: tuple[Proxy, Upstream], run_codex: Callable[..., CodexResult], tmp_path: Path
) -> None:
    proxy, chat = stack
    httpx.post(f"{chat.url}/_reset")
    result = run_codex(
        "Run the command.",
        f"http://127.0.0.1:{proxy.port('reverse')}/v1",
        tmp_path / "work",
        timeout=120,
        model="codex-test",
    )
    output = f"--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-3000:]}"
    assert result.returncode == 0, output
    assert result.stdout.startswith("Tool result:"), output  # the fake's turn-2 answer
    assert TOOL_OUTPUT in result.stdout, output

    requests = upstream_requests(chat)
    assert len(requests) == 2, [r["body"].get("messages", [])[-1:] for r in requests]
    for sent in requests:
        body = sent["body"]
        assert sent["path"] == "/v1/chat/completions"
        assert body["stream"] is True
        assert body["stream_options"] == {"include_usage": True}
        assert "input" not in body
        names = [tool["function"]["name"] for tool in body["tools"]]
        assert all(tool["type"] == "function" for tool in body["tools"])
        assert "exec_command" in names
        assert "web_search" not in names
        # Codex's namespace (MCP-style) tools arrive flattened to ``namespace__name``.
        flattened = [name for name in names if "__" in name]
        assert flattened, names
    first, second = (sent["body"] for sent in requests)

    # Turn 1 asked for exec_command with a cmd (the first tool the fake sees is Codex's).
    assert first["tools"][0]["function"]["name"] == "exec_command"
    # Turn 2: the call and its output, as chat messages with matching ids.
    assistant = next(m for m in second["messages"] if m.get("tool_calls"))
    [tool_call] = assistant["tool_calls"]
    assert tool_call["function"]["name"] == "exec_command"
    assert orjson.loads(tool_call["function"]["arguments"])["cmd"] == f"echo {TOOL_OUTPUT}"
    tool_message = second["messages"][-1]
    assert tool_message["role"] == "tool"
    assert tool_message["tool_call_id"] == tool_call["id"]
    assert TOOL_OUTPUT in str(tool_message["content"])

    log = proxy.log_text()
    assert log.count("dropped hosted tool 'web_search'") == 2, log[-3000:]  # once per turn
    assert "Traceback" not in log, log[-3000:]


THOUGHT = "The user wants a short greeting.\n\nI will answer briefly."  # the fake's reasoning


def test_codex_store_false_reasoning_round_trip_over_chat_upstream(
    stack: tuple[Proxy, Upstream], run_codex: Callable[..., CodexResult], tmp_path: Path
) -> None:
    """Codex keeps its conversation itself (``store: false``, ``include:
    ["reasoning.encrypted_content"]``): llmitm gives its reasoning items an opaque token,
    Codex sends them back with the next turn, and the chat upstream sees turn 1's reasoning
    on the assistant turn that made the tool call (backends with interleaved thinking need
    it). That the token alone restores it is test_responses_state's
    ``test_store_false_reasoning_comes_back_from_encrypted_content``."""
    proxy, chat = stack
    httpx.post(f"{chat.url}/_reset")
    home = tmp_path / "codex-home"
    result = run_codex(
        "Run the command.",
        f"http://127.0.0.1:{proxy.port('reverse')}/v1",
        tmp_path / "work",
        timeout=120,
        model="codex-test",
        provider={"http_headers": {"x-fake-scenario": "tool-loop;reasoning"}},
        codex_home=home,
    )
    output = f"--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-3000:]}"
    assert result.returncode == 0, output
    assert TOOL_OUTPUT in result.stdout, output

    rollout = [
        orjson.loads(line)["payload"]
        for path in home.glob("sessions/**/rollout-*.jsonl")
        for line in path.read_text().splitlines()
        if '"type":"reasoning"' in line
    ]
    tokens = [item["encrypted_content"] for item in rollout if item.get("type") == "reasoning"]
    assert len(tokens) == 2, rollout  # one reasoning item per turn, each with llmitm's token
    assert all(token.startswith("gAAAAA") and "greeting" not in token for token in tokens)

    first, second = (sent["body"] for sent in upstream_requests(chat))
    assert all(m.get("reasoning_content") is None for m in first["messages"])
    assistant = next(m for m in second["messages"] if m.get("tool_calls"))
    assert assistant["reasoning_content"] == THOUGHT
    assert "Traceback" not in proxy.log_text()
