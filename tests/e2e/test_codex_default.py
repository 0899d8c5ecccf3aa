"""Codex in its default configuration, as a new user runs it: ``llmitm run -- codex exec …``.

No config.toml, a fresh ``CODEX_HOME``, only ``OPENAI_API_KEY``: Codex uses its built-in
provider (``https://api.openai.com/v1``, model ``gpt-6.2-sol``) and reaches llmitm only
through the proxy variables ``llmitm run`` sets; a route for the host ``api.openai.com`` sends
every model to a local backend. In this configuration Codex declares its tools in an
``additional_tools`` input item (a ``functions`` namespace holding the code-mode tool ``exec``,
a custom tool whose input is a script, and plain functions) with no top-level ``tools``, and
sets reasoning effort with a ``configuration_update`` item — the shapes these tests prove
arrive upstream as tools the backend can call, over:

- the deterministic chat-only fake upstream: a whole tool loop (the fake calls ``exec`` with a
  script running ``echo llmitm-tool-ok``, Codex runs it, the output comes back in the next
  turn), then ``codex exec resume --last`` continues the same conversation;
- the fake's Responses API shaped like llama.cpp's, as a ``compatible`` endpoint: the same
  tool loop through the rewrite for third-party Responses servers (tools hoisted to top-level
  functions, the server's ``functions__exec`` call restored as Codex's namespaced custom tool);
- the real llama.cpp server, through its chat API (llmitm translates) and through its own
  Responses API (llmitm rewrites what that server cannot read and restores its answers).

Codex first tries its WebSocket transport and falls back to HTTPS after ~6 s; these tests do
not depend on either.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx2 as httpx
import orjson
import pytest

from llmitm.wire.growing import GrowingBodies

from .conftest import CodexResult, codex_env
from .processes import LLMITM, Upstream, fake_upstream

pytestmark = pytest.mark.slow

TOOL_OUTPUT = "llmitm-tool-ok"
CODEX_MODEL = "gpt-6.2-sol"  # Codex 0.171's default model: what every request names

FAKE_CONFIG = """
[endpoints.local]
kind = "compatible"
base_url = "{url}/v1"
apis = ["chat"]

[[routes]]
models = ["*"]
hosts = ["api.openai.com"]
endpoints = ["local"]
"""

# The fake's own Responses API, answering like llama.cpp's (no sequence numbers or output
# indexes), standing in for a third-party Responses server that can call tools.
FAKE_RESPONSES_CONFIG = """
[endpoints.local]
kind = "compatible"
base_url = "{url}/v1"
apis = ["responses"]
non_conformant = ["responses"]
headers = {{ x-fake-scenario = "tool-loop;flavor=llamacpp" }}

[[routes]]
models = ["*"]
hosts = ["api.openai.com"]
endpoints = ["local"]
"""

LLAMA_CONFIG = """
[endpoints.llama]
kind = "compatible"
base_url = "{url}/v1"
apis = ["{api}"]
non_conformant = ["responses"]

[[routes]]
models = ["*"]
hosts = ["api.openai.com"]
model = "gemma-3-270m"
endpoints = ["llama"]
"""

# A JSON answer with one short string: llama.cpp's grammar makes the babbling model stop, so
# a turn over its chat API completes instead of being cut by n_predict (see test_llamacpp).
GREETING_SCHEMA = {
    "type": "object",
    "properties": {"greeting": {"type": "string", "maxLength": 12}},
    "required": ["greeting"],
    "additionalProperties": False,
}


SOCKET_TROUBLE = ("failed to connect to Responses WebSocket", "Reconnecting", "Falling back")


def codex_under_llmitm(
    codex_bin: Path,
    tmp: Path,
    config: str,
    *exec_args: str,
    timeout: float,
    transport: str = "websocket",
) -> CodexResult:
    """``llmitm run --config … -- codex exec --skip-git-repo-check EXEC_ARGS`` with Codex in
    its default configuration; the same ``tmp`` keeps Codex's home (for ``resume``), the
    proxy's CA and the store across calls. ``transport="https"`` has llmitm refuse Codex's
    WebSocket, so Codex sends its calls as HTTPS POSTs (and its other request shape)."""
    (tmp / "llmitm.toml").write_text(config)
    work = tmp / "work"
    work.mkdir(parents=True, exist_ok=True)
    home = tmp / "codex-home"
    home.mkdir(exist_ok=True)
    env = codex_env(home, {"OPENAI_API_KEY": "sk-test"})
    for key in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY"):
        env.pop(key, None)  # llmitm run sets the proxy; nothing else may
    argv = [
        str(LLMITM), "run", "--config", str(tmp / "llmitm.toml"),
        "--set", f"confdir={tmp / 'confdir'}", "--set", f"llmitm_store={tmp / 'llmitm.db'}",
        *(["--set", "llmitm_websocket=refuse"] if transport == "https" else []),
        "-q", "--", str(codex_bin), "exec", "--skip-git-repo-check", *exec_args,
    ]  # fmt: skip
    process = subprocess.Popen(
        argv,
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # a timeout kills llmitm, Codex and its tools together
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(
            f"llmitm run -- codex exec did not finish within {timeout:.0f} s\n"
            f"--- stdout\n{stdout.decode(errors='replace')[-3000:]}\n"
            f"--- stderr\n{stderr.decode(errors='replace')[-3000:]}",
            pytrace=False,
        )
    result = CodexResult(
        process.returncode, stdout.decode(errors="replace"), stderr.decode(errors="replace")
    )
    # Codex's default transport is a WebSocket, and llmitm serves it: no failed socket, no
    # reconnecting, no fallback to HTTPS. Refused, it goes to HTTPS at once (no retries).
    for sign in SOCKET_TROUBLE if transport == "websocket" else SOCKET_TROUBLE[1:]:
        assert sign not in result.stderr, shown(result)
    return result


def shown(result: CodexResult) -> str:
    return f"--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-4000:]}"


def recorded_calls(tmp: Path) -> list[dict[str, Any]]:
    """The Responses create calls llmitm recorded, oldest first, each with its four legs
    (``llmitm rec ls`` and ``rec show``, as a user would look)."""
    db = str(tmp / "llmitm.db")
    listing = subprocess.run(
        [str(LLMITM), "rec", "ls", "--db", db, "--json", "--limit", "0"],
        capture_output=True, check=True, timeout=60,
    )  # fmt: skip
    ids = sorted(
        row["id"]
        for row in orjson.loads(listing.stdout)
        if row["method"] == "POST" and row["route"] == "responses"
    )
    calls = []
    for recording in ids:
        shown_json = subprocess.run(
            [str(LLMITM), "rec", "show", "--db", db, "--json", recording],
            capture_output=True, check=True, timeout=60,
        )  # fmt: skip
        calls.append(orjson.loads(shown_json.stdout))
    return calls


def client_items(call: dict[str, Any]) -> list[dict[str, Any]]:
    return call["client_req"]["body"]["json"]["input"]


def assert_codex_default_shapes(call: dict[str, Any]) -> str:
    """What the client sent is Codex's default shape; returns its reasoning effort. Codex
    sets the effort in the top-level ``reasoning``, or — after its socket failed and it fell
    back to HTTPS — in a ``configuration_update`` item."""
    body = call["client_req"]["body"]["json"]
    assert body["model"] == CODEX_MODEL
    assert "tools" not in body
    kinds = [item.get("type") for item in body["input"]]
    assert "additional_tools" in kinds, kinds
    updates = [item for item in body["input"] if item.get("type") == "configuration_update"]
    return updates[-1]["reasoning"]["effort"] if updates else body["reasoning"]["effort"]


def assert_each_turn_extends_the_last(calls: list[dict[str, Any]]) -> None:
    """Each turn's body, as Codex sent it, is parsed from the last one's: the resent history
    is not parsed, keyed and translated whole again. Codex's ``client_metadata`` after
    ``input`` differs from request to request (a timestamp over its socket, its keys' order
    over HTTPS)."""
    bodies = GrowingBodies()
    sent = [call["client_req"]["body"]["json"] for call in calls]
    assert list(sent[0])[-1] == "client_metadata", list(sent[0])
    for turn, body in enumerate(sent):
        grown = bodies.parse(orjson.dumps(body))
        assert grown.body == body
        assert grown.reused == (len(sent[turn - 1]["input"]) if turn else 0), turn


def completed_text(call: dict[str, Any]) -> str:
    """The output text of the ``response.completed`` event the client received."""
    raw = "".join(chunk["raw"] for chunk in call["client_resp"]["chunks"])
    for block in raw.split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: ") and '"response.completed"' in line:
                response = json.loads(line[len("data: ") :])["response"]
                return "".join(
                    part.get("text", "")
                    for item in response["output"]
                    if item.get("type") == "message"
                    for part in item["content"]
                )
    raise AssertionError("the client received no response.completed")


# --- a chat-only fake upstream: a tool loop, then a resumed session ---------------------------


@pytest.fixture(scope="module")
def chat_fake(tmp_path_factory: pytest.TempPathFactory) -> Upstream:
    with fake_upstream(tmp_path_factory.mktemp("codex-default-fake"), "chat") as fake:
        yield fake


def fake_requests(upstream: Upstream) -> list[dict[str, Any]]:
    return orjson.loads(httpx.get(f"{upstream.url}/_requests").content)


@pytest.mark.parametrize("transport", ["websocket", "https"])
def test_default_codex_runs_a_command_over_a_chat_upstream_and_resumes(
    codex_bin: Path, chat_fake: Upstream, tmp_path: Path, transport: str
) -> None:
    httpx.post(f"{chat_fake.url}/_reset")
    config = FAKE_CONFIG.format(url=chat_fake.url)
    result = codex_under_llmitm(
        codex_bin, tmp_path, config, "Run the command.", timeout=120, transport=transport
    )
    assert result.returncode == 0, shown(result)
    assert f"echo {TOOL_OUTPUT}" in result.stderr, shown(result)  # Codex ran the script
    assert "Tool result:" in result.stdout and TOOL_OUTPUT in result.stdout, shown(result)

    sent = fake_requests(chat_fake)
    assert len(sent) == 2, [request["path"] for request in sent]
    first, second = (request["body"] for request in sent)
    calls = recorded_calls(tmp_path)
    assert len(calls) == 2
    assert_each_turn_extends_the_last(calls)
    effort = assert_codex_default_shapes(calls[0])
    for body in (first, second):
        # The tools of the additional_tools item arrived as chat functions, namespaces
        # flattened, the custom exec tool as a function of one string.
        tools = {tool["function"]["name"]: tool["function"] for tool in body["tools"]}
        assert tools["functions__exec"]["parameters"]["required"] == ["input"]
        assert "clock__sleep" in tools and "functions__wait" in tools, sorted(tools)
        assert body["reasoning_effort"] == effort
        assert "input" not in body
    [call] = next(m for m in second["messages"] if m.get("tool_calls"))["tool_calls"]
    assert call["function"]["name"] == "functions__exec"
    assert "tools.exec_command" in json.loads(call["function"]["arguments"])["input"]
    assert second["messages"][-1]["role"] == "tool"
    assert TOOL_OUTPUT in second["messages"][-1]["content"]
    # Codex understood the call as its own namespaced custom tool: that is how it sent it back.
    [echoed] = [i for i in client_items(calls[1]) if i.get("type") == "custom_tool_call"]
    assert (echoed["namespace"], echoed["name"]) == ("functions", "exec")
    [output] = [i for i in client_items(calls[1]) if i.get("type") == "custom_tool_call_output"]
    assert output["call_id"] == echoed["call_id"] == call["id"]

    resumed = codex_under_llmitm(
        codex_bin,
        tmp_path,
        config,
        "resume",
        "--last",
        "Run it again.",
        timeout=120,
        transport=transport,
    )
    assert resumed.returncode == 0, shown(resumed)
    assert "Tool result:" in resumed.stdout, shown(resumed)
    sent = fake_requests(chat_fake)
    assert len(sent) == 4, [request["path"] for request in sent]
    third = sent[2]["body"]
    texts = [m["content"] for m in third["messages"] if m["role"] == "user"]
    assert "Run the command." in texts and texts[-1] == "Run it again.", texts
    # The first session's tool loop is still in the conversation.
    history_calls = [c["id"] for m in third["messages"] for c in m.get("tool_calls") or []]
    assert call["id"] in history_calls
    assert any(
        m["role"] == "assistant" and "Tool result:" in (m.get("content") or "")
        for m in third["messages"]
    )


def test_default_codex_runs_a_command_over_a_compatible_responses_server(
    codex_bin: Path, tmp_path: Path
) -> None:
    with fake_upstream(tmp_path / "fake", "responses") as server:
        config = FAKE_RESPONSES_CONFIG.format(url=server.url)
        result = codex_under_llmitm(codex_bin, tmp_path, config, "Run the command.", timeout=120)
        sent = [request["body"] for request in fake_requests(server)]
    assert result.returncode == 0, shown(result)
    assert f"echo {TOOL_OUTPUT}" in result.stderr, shown(result)
    assert "Tool result:" in result.stdout and TOOL_OUTPUT in result.stdout, shown(result)

    assert len(sent) == 2
    for body in sent:
        assert all(tool["type"] == "function" for tool in body["tools"])
        assert {"functions__exec", "clock__sleep"} <= {tool["name"] for tool in body["tools"]}
        kinds = {item["type"] for item in body["input"]}
        assert not kinds & {"additional_tools", "configuration_update", "custom_tool_call"}
    # Turn 2 replays the loop as function items the server can read.
    call, output = sent[1]["input"][-2:]
    assert (call["type"], call["name"]) == ("function_call", "functions__exec")
    assert "tools.exec_command" in json.loads(call["arguments"])["input"]
    assert output["type"] == "function_call_output" and output["call_id"] == call["call_id"]
    assert TOOL_OUTPUT in json.dumps(output["output"])
    # What Codex received and sent back was its own namespaced custom tool call.
    calls = recorded_calls(tmp_path)
    [echoed] = [i for i in client_items(calls[1]) if i.get("type") == "custom_tool_call"]
    assert (echoed["namespace"], echoed["name"], echoed["call_id"]) == (
        "functions",
        "exec",
        call["call_id"],
    )


# --- the real llama.cpp server, through each of its APIs --------------------------------------


# Alone, after the parallel run: the 270M model's answer under Codex's output schema turns into
# whitespace until max_output_tokens on some prompts, and the prompt carries the worker's
# temporary path; run alone, as before the suite ran in parallel, it answers.
@pytest.mark.timing
def test_default_codex_over_llama_chat(codex_bin: Path, llama_server: str, tmp_path: Path) -> None:
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(GREETING_SCHEMA))
    result = codex_under_llmitm(
        codex_bin,
        tmp_path,
        LLAMA_CONFIG.format(url=llama_server, api="chat"),
        "--output-schema", str(schema), "Say hi",
        timeout=420,  # ~7,000 prompt tokens: ~30 s on 2 idle cores, minutes when busy
    )  # fmt: skip
    assert result.returncode == 0, shown(result)
    assert isinstance(json.loads(result.stdout)["greeting"], str), shown(result)
    [call] = recorded_calls(tmp_path)
    effort = assert_codex_default_shapes(call)
    assert call["upstream_req"]["url"] == f"{llama_server}/v1/chat/completions"
    upstream = call["upstream_req"]["body"]["json"]
    names = [tool["function"]["name"] for tool in upstream["tools"]]
    assert "functions__exec" in names and "clock__sleep" in names, names
    assert upstream["reasoning_effort"] == effort
    assert json.loads(completed_text(call)) == json.loads(result.stdout)


def test_default_codex_over_llama_own_responses_api(
    codex_bin: Path, llama_server: str, tmp_path: Path
) -> None:
    """Passed through unchanged, llama.cpp refuses Codex's request (400 ``Cannot determine
    type of 'item'``); rewritten, it answers and Codex prints that answer."""
    result = codex_under_llmitm(
        codex_bin,
        tmp_path,
        LLAMA_CONFIG.format(url=llama_server, api="responses"),
        "Say hi",
        timeout=420,
    )
    assert result.returncode == 0, shown(result)
    [call] = recorded_calls(tmp_path)
    assert_codex_default_shapes(call)
    assert call["upstream_req"]["url"] == f"{llama_server}/v1/responses"
    upstream = call["upstream_req"]["body"]["json"]
    names = [tool["name"] for tool in upstream["tools"]]
    assert all(tool["type"] == "function" for tool in upstream["tools"])
    assert "functions__exec" in names and "clock__sleep" in names, names
    kinds = {item.get("type") for item in upstream["input"]}
    assert kinds == {"message"}, kinds
    assert {item["role"] for item in upstream["input"]} == {"system", "user"}
    answer = completed_text(call)
    assert answer.strip() and answer.strip()[:40] in result.stdout, shown(result)
