"""Real clients recorded once, then replayed with no upstream at all.

Codex CLI's tool loop (Responses client, chat-only upstream) and openai-agents runs (both
translation directions, ``run`` and ``run_streamed``) go through llmitm against the fake
upstream; the recordings are exported to a folder; then the same clients run again against
llmitm in ``replay`` mode while a tripwire stands where every upstream was. Replayed from the
client leg or through today's translator (the default, handed the recorded ids, times and
sealed reasoning), every answer is byte-identical to the recorded one (checked on mitmproxy's
own saved flows).
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import openai
import orjson
import pytest

# openai-agents comes with the e2e extra: without it (the dev extra alone) this module is
# skipped rather than breaking the collection of every other test.
pytest.importorskip("agents", reason="openai-agents is in the e2e extra (make e2e-deps)")

from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    set_tracing_disabled,
)
from mitmproxy import io

from llmitm.store.folder import read_folder

from .conftest import CodexResult
from .processes import LLMITM, TWO_ENDPOINTS, Proxy, fake_upstream, llmitm_proxy
from .test_agents import lookup_code
from .test_record_replay import tripwire

pytestmark = pytest.mark.slow

CODEX_CONFIG = TWO_ENDPOINTS.replace(
    'models = ["over-chat*"]', 'models = ["over-chat*", "codex-*"]'
)


def export(db: Path, folder: Path) -> list[bytes]:
    done = subprocess.run(
        [str(LLMITM), "rec", "export", str(folder), "--db", str(db)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [i.legs["client_resp"].body() for i in read_folder(folder)]


def replay_args(folder: Path, replay_from: str, tmp: Path, *more: str) -> list[str]:
    args = {
        "llmitm_record": "replay",
        "llmitm_recordings": str(folder),
        "llmitm_replay_from": replay_from,
        "llmitm_replay_report": str(tmp / "report.json"),
        "save_stream_file": str(tmp / "flows"),
    }
    items = [f"{key}={value}" for key, value in args.items()] + list(more)
    return [arg for item in items for arg in ("--set", item)]


def with_cache_key(recorded: list[bytes], served: list[bytes]) -> list[bytes]:
    """The recorded bodies with the prompt_cache_key of the replaying session."""
    pattern = rb'"prompt_cache_key":"[^"]*"'
    (today,) = {m.group() for body in served for m in re.finditer(pattern, body)}
    return [re.sub(pattern, today, body) for body in recorded]


def served(tmp: Path) -> tuple[dict, list[bytes]]:
    """The replay report and the bodies mitmproxy sent, in order (its own saved flows)."""
    report = orjson.loads((tmp / "report.json").read_bytes())
    with (tmp / "flows").open("rb") as data:
        flows = list(io.FlowReader(data).stream())
    return report, [f.response.content for f in flows if f.response]  # type: ignore[misc]


@pytest.mark.parametrize("replay_from", ["client", "upstream"])
def test_codex_tool_loop_replays_offline(
    run_codex: Callable[..., CodexResult],
    tmp_path_factory: pytest.TempPathFactory,
    replay_from: str,
) -> None:
    tmp = tmp_path_factory.mktemp(f"codex-{replay_from}")
    # The same paths both times: Codex puts its cwd and its home (skill roots) in requests.
    work, home = tmp / "work", tmp / "codex-home"

    def codex(proxy: Proxy) -> CodexResult:
        for fresh in (work, home):
            shutil.rmtree(fresh, ignore_errors=True)
        return run_codex(
            "Run the command.",
            proxy.base_url(),
            work,
            timeout=120,
            model="codex-t",
            codex_home=home,
        )

    with fake_upstream(tmp, "chat") as up:
        config = CODEX_CONFIG.format(chat=up.url, responses=up.url)
        with llmitm_proxy(tmp / "rec", config=config) as proxy:
            live = codex(proxy)
    assert live.returncode == 0 and "llmitm-tool-ok" in live.stdout, live.stderr[-2000:]
    recorded = export(tmp / "rec" / "llmitm.db", tmp / "recordings")
    assert len(recorded) >= 2  # both turns of the tool loop

    with tripwire() as wire:
        config = CODEX_CONFIG.format(chat=wire.url, responses=wire.url)
        # Codex's tool output carries a random chunk id and the command's wall time: ignored
        # when matching (applied at load, to recordings made without it).
        ignore = "llmitm_match_ignore=input.*.output"
        extra = replay_args(tmp / "recordings", replay_from, tmp, ignore)
        modes = [f"reverse:{wire.url}"]
        with llmitm_proxy(tmp / "replay", config=config, modes=modes, extra=extra) as proxy:
            again = codex(proxy)
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout == live.stdout
    report, bodies = served(tmp)
    assert report["misses"] == [] and report["hits"] == len(recorded) and report["unused"] == []
    # Byte for byte what Codex got live, through today's translator too (handed the recorded
    # ids, times and sealed reasoning) — except that a translated Response echoes the request
    # as sent today, and each Codex session sends its own prompt_cache_key (a field match keys
    # ignore).
    assert bodies == (recorded if replay_from == "client" else with_cache_key(recorded, bodies))


@pytest.mark.parametrize("replay_from", ["client", "upstream"])
def test_agents_runs_replay_offline(tmp_path: Path, replay_from: str) -> None:
    set_tracing_disabled(True)

    async def runs(proxy: Proxy) -> list[str]:
        client = openai.AsyncOpenAI(base_url=proxy.base_url(), api_key="sk-agents", max_retries=0)
        finals = []
        try:
            for model in (
                OpenAIResponsesModel(model="over-chat", openai_client=client),
                OpenAIChatCompletionsModel(model="over-responses", openai_client=client),
            ):
                agent = Agent(
                    name="coder",
                    instructions="Use lookup_code, then answer with what it returned.",
                    model=model,
                    tools=[lookup_code],
                )
                finals.append(str((await Runner.run(agent, "Code for x?")).final_output))
                streaming = Runner.run_streamed(agent, "Code for y?")
                async for _ in streaming.stream_events():
                    pass
                finals.append(str(streaming.final_output))
        finally:
            await client.close()
        return finals

    with (
        fake_upstream(tmp_path, "chat") as chat,
        fake_upstream(tmp_path, "responses") as responses,
    ):
        config = TWO_ENDPOINTS.format(chat=chat.url, responses=responses.url)
        with llmitm_proxy(tmp_path / "rec", config=config) as proxy:
            live = asyncio.run(runs(proxy))
    assert all("agents-tool-ok" in final for final in live), live
    recorded = export(tmp_path / "rec" / "llmitm.db", tmp_path / "recordings")
    assert len(recorded) == 8  # two turns for each of four runs

    with tripwire() as wire:
        config = TWO_ENDPOINTS.format(chat=wire.url, responses=wire.url)
        extra = replay_args(tmp_path / "recordings", replay_from, tmp_path)
        modes = [f"reverse:{wire.url}"]
        with llmitm_proxy(tmp_path / "replay", config=config, modes=modes, extra=extra) as proxy:
            again = asyncio.run(runs(proxy))
    assert again == live
    report, bodies = served(tmp_path)
    assert report["misses"] == [] and report["hits"] == 8 and report["unused"] == []
    assert sorted(bodies) == sorted(recorded)  # byte for byte what the agents got live
