"""The Responses WebSocket through real llmitm processes: openai-python's
``responses.connect()`` and Codex in its default configuration (no config file, only
``OPENAI_API_KEY``: it opens ``wss://api.openai.com/v1/responses`` through ``HTTPS_PROXY``)
reach a chat-only upstream through llmitm's own socket, and the calls are recorded and replay
offline over the socket too."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import openai
import orjson
import pytest
from mitmproxy import io
from mitmproxy.http import HTTPFlow
from mitmproxy.tcp import TCPFlow

from llmitm.store.folder import read_folder

from .conftest import CODEX_PACKAGE, codex_env, find_codex_bin
from .processes import LLMITM, Proxy, Upstream, fake_upstream, llmitm_proxy
from .test_record_replay import tripwire

pytestmark = pytest.mark.slow

CONFIG = """
[endpoints.chat-only]
kind = "compatible"
base_url = "{chat}/v1"
apis = ["chat"]

[[routes]]
models = ["*"]
endpoints = ["chat-only"]
"""
# Codex offers its exec tool, which the fake would call: its "text" scenario answers plainly.
CODEX_CONFIG = CONFIG + 'model = "text"\n'
HELLO = "Hello from the fake upstream."
CODEX_NOISE = ("Reconnecting", "Falling back", "WebSocket", "websocket")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proxy, Upstream]]:
    tmp = tmp_path_factory.mktemp("socket")
    with (
        fake_upstream(tmp, "chat") as chat,
        llmitm_proxy(
            tmp, config=CONFIG.format(chat=chat.url), modes=("reverse:https://api.openai.com",)
        ) as proxy,
    ):
        yield proxy, chat


def upstream_requests(upstream: Upstream) -> list[dict]:
    return orjson.loads(httpx.get(f"{upstream.url}/_requests").content)


def until_terminal(connection: openai.resources.responses.responses.ResponsesConnection) -> list:
    events = []
    for event in connection:
        events.append(event)
        if event.type in ("response.completed", "response.failed", "error"):
            return events
    raise AssertionError(f"the socket closed after {[e.type for e in events]}")


def test_the_sdk_socket_runs_a_store_false_conversation_over_a_chat_upstream(
    stack: tuple[Proxy, Upstream],
) -> None:
    proxy, chat = stack
    httpx.post(f"{chat.url}/_reset")
    client = openai.OpenAI(base_url=proxy.base_url(), api_key="sk-socket", max_retries=0)
    with client.responses.connect() as connection:
        connection.response.create(model="echo", input="first question", store=False)
        first = until_terminal(connection)
        connection.response.create(
            model="echo",
            input="second question",
            store=False,
            previous_response_id=first[-1].response.id,
        )
        second = until_terminal(connection)
    for events in (first, second):
        assert events[0].type == "response.created" and events[-1].type == "response.completed"
        assert [e.sequence_number for e in events] == list(range(len(events)))
    assert first[-1].response.output_text == "Echo: first question"
    assert second[-1].response.output_text == "Echo: second question"
    assert second[-1].response.previous_response_id == first[-1].response.id
    sent = [request["body"]["messages"] for request in upstream_requests(chat)]
    assert len(sent) == 2
    # The connection remembered turn one: the upstream got the whole conversation.
    assert [(m["role"], m["content"]) for m in sent[1]] == [
        ("user", "first question"),
        ("assistant", "Echo: first question"),
        ("user", "second question"),
    ]


def test_an_upstream_error_reaches_the_socket_with_its_status(
    stack: tuple[Proxy, Upstream],
) -> None:
    proxy, _ = stack
    client = openai.OpenAI(base_url=proxy.base_url(), api_key="sk-socket", max_retries=0)
    with client.responses.connect() as connection:
        connection.response.create(model="text;status=429;retry_after=1", input="hi")
        (error,) = until_terminal(connection)
        assert error.type == "error" and error.status == 429
        assert error.error.code == "rate_limit_exceeded"
        # The socket stays usable after an error.
        connection.response.create(model="text", input="again")
        assert until_terminal(connection)[-1].response.output_text == HELLO


def test_a_client_leaving_mid_stream_keeps_the_recording_and_the_proxy(
    stack: tuple[Proxy, Upstream],
) -> None:
    proxy, _ = stack
    client = openai.OpenAI(base_url=proxy.base_url(), api_key="sk-socket", max_retries=0)
    with client.responses.connect() as connection:
        connection.response.create(model="text;events=400;event_delay_ms=10", input="long")
        for event in connection:
            if event.type == "response.output_text.delta":
                break  # leave with the stream under way
    db = proxy.log.with_name("llmitm.db")  # llmitm_proxy keeps the store beside its log
    deadline = time.monotonic() + 20
    cut: list[dict] = []
    while not cut and time.monotonic() < deadline:
        listing = subprocess.run(
            [str(LLMITM), "rec", "ls", "--db", str(db), "--json", "--limit", "0"],
            capture_output=True,
            timeout=30,
        )
        rows = orjson.loads(listing.stdout or b"[]")
        cut = [row for row in rows if row["model"].startswith("text;events=400")]
        time.sleep(0.1)
    assert cut, "the call the client left was not recorded"
    assert cut[0]["truncated"], cut[0]  # kept, and marked as cut short
    with client.responses.connect() as connection:
        connection.response.create(model="text", input="still there?")
        assert until_terminal(connection)[-1].response.output_text == HELLO


# --- Codex in its default configuration ------------------------------------------------------


def codex_default(
    tmp: Path,
    prompt: str,
    *llmitm_args: str,
    config: str,
    home: Path,
    work: Path,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """``llmitm run --config C … -- codex exec PROMPT`` with a fresh CODEX_HOME at ``home``
    and nothing else but ``OPENAI_API_KEY``: no config.toml, no provider, no base URL."""
    for fresh in (home, work):
        shutil.rmtree(fresh, ignore_errors=True)
        fresh.mkdir(parents=True)
    config_file = tmp / "llmitm.toml"
    config_file.write_text(config)
    argv = [
        str(LLMITM), "run", "--config", str(config_file),
        "--set", f"confdir={tmp / 'confdir'}",
        *llmitm_args,
        "--", str(find_codex_bin()), "exec", "--skip-git-repo-check", prompt,
    ]  # fmt: skip
    env = codex_env(home, {"OPENAI_API_KEY": "sk-codex-default"})
    return subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=timeout)


def test_codex_default_configuration_talks_to_a_chat_upstream_over_the_socket(
    tmp_path: Path,
) -> None:
    assert CODEX_PACKAGE.exists()
    home, work, folder = tmp_path / "codex-home", tmp_path / "work", tmp_path / "recordings"
    with fake_upstream(tmp_path, "chat") as chat:
        live = codex_default(
            tmp_path,
            "Say hi",
            "--record", str(folder),
            "--set", "llmitm_allow_record_in_ci=true",  # this test records on purpose
            "--set", f"llmitm_store={tmp_path / 'live.db'}",
            "--set", f"save_stream_file={tmp_path / 'flows.mitm'}",
            config=CODEX_CONFIG.format(chat=chat.url), home=home, work=work,
        )  # fmt: skip
        sent = upstream_requests(chat)
    output = f"--- stdout\n{live.stdout[-2000:]}\n--- stderr\n{live.stderr[-3000:]}"
    assert live.returncode == 0, output
    assert HELLO in live.stdout, output
    # No failed socket, no retries, no fallback to HTTPS: the socket was served.
    for noise in CODEX_NOISE:
        assert noise not in live.stderr, output
    assert len(sent) == 1 and sent[0]["path"] == "/v1/chat/completions"
    calls = [i for i in read_folder(folder) if i.route == "responses"]
    assert len(calls) == 1, [i.route for i in read_folder(folder)]
    assert calls[0].method == "POST" and calls[0].model == "gpt-6.2-sol"
    # The socket's tunnel (TLS, through HTTPS_PROXY) held only the chunk it was relaying.
    with (tmp_path / "flows.mitm").open("rb") as file:
        tunnels = [flow for flow in io.FlowReader(file).stream() if isinstance(flow, TCPFlow)]
    assert tunnels and all(len(flow.messages) <= 1 for flow in tunnels)

    # Offline: the same session replays from the folder over the socket, with no upstream.
    with tripwire() as wire:
        again = codex_default(
            tmp_path,
            "Say hi",
            "--replay", str(folder),
            "--set", f"llmitm_store={tmp_path / 'replay.db'}",
            config=CODEX_CONFIG.format(chat=wire.url), home=home, work=work,
        )  # fmt: skip
    output = f"--- stdout\n{again.stdout[-2000:]}\n--- stderr\n{again.stderr[-3000:]}"
    assert again.returncode == 0, output
    assert HELLO in again.stdout, output
    for noise in CODEX_NOISE:
        assert noise not in again.stderr, output


def test_a_refused_socket_sends_codex_to_https_at_once(tmp_path: Path) -> None:
    with fake_upstream(tmp_path, "chat") as chat:
        result = codex_default(
            tmp_path,
            "Say hi",
            "--set", "llmitm_websocket=refuse",
            "--set", f"llmitm_store={tmp_path / 'llmitm.db'}",
            config=CODEX_CONFIG.format(chat=chat.url),
            home=tmp_path / "codex-home", work=tmp_path / "work",
        )  # fmt: skip
        sent = upstream_requests(chat)
    output = f"--- stdout\n{result.stdout[-2000:]}\n--- stderr\n{result.stderr[-3000:]}"
    assert result.returncode == 0 and HELLO in result.stdout, output
    # 426 is the answer Codex falls back on without its retry budget.
    assert "Reconnecting" not in result.stderr, output
    assert len(sent) == 1


def test_the_tunnel_keeps_only_the_chunk_it_relays(tmp_path: Path) -> None:
    """A client without ``previous_response_id`` resends its history on every message: the
    socket's raw tunnel flow (here as mitmproxy saves it) holds one chunk, not every history
    the session sent, while each call's flow has its whole body."""
    flows_file = tmp_path / "flows.mitm"
    history: list[dict] = []
    with (
        fake_upstream(tmp_path, "chat") as chat,
        llmitm_proxy(
            tmp_path,
            config=CONFIG.format(chat=chat.url),
            modes=("reverse:https://api.openai.com",),
            extra=["--set", f"save_stream_file={flows_file}"],
        ) as proxy,
    ):
        client = openai.OpenAI(base_url=proxy.base_url(), api_key="sk-socket", max_retries=0)
        with client.responses.connect() as connection:
            for turn in range(3):
                history.append({"role": "user", "content": f"question {turn} " + "x" * 20_000})
                connection.response.create(model="echo", input=history, store=False)
                events = until_terminal(connection)
                assert events[-1].type == "response.completed"
                history += [
                    item.model_dump(exclude_none=True) for item in events[-1].response.output
                ]
        time.sleep(0.5)  # the tunnel ends, and is saved, when the socket closes
    with flows_file.open("rb") as file:
        flows = list(io.FlowReader(file).stream())
    [tunnel] = [flow for flow in flows if isinstance(flow, TCPFlow)]
    assert len(tunnel.messages) == 1
    calls = [f for f in flows if isinstance(f, HTTPFlow) and f.request.method == "POST"]
    assert len(calls) == 3
    assert len(orjson.loads(calls[-1].request.content)["input"]) == len(history) - 1
