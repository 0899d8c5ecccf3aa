"""Replay of a Responses conversation chained by ``previous_response_id`` over a chat-only
upstream: recorded in one llmitm process, replayed in a fresh one — its own empty Responses
store, no upstream (a tripwire where it was).

The second turn's request names the first answer's id, which llmitm minted at record time.
For the replay to hold, the second request must still *match* (the default profile keys
provider ids by placeholder, so the id's value does not count) and the replaying process
must *know* the id it names: llmitm inlines the stored chain into ``input`` before it
translates, and a chat-only upstream has no state of its own — an unknown id is OpenAI's own
400 ``previous_response_not_found``. Replayed from the client leg, the recorded answers are
served before the local Responses API runs; from the upstream leg, the translator re-makes
them with the recorded ids (the recording's mint) and the replaying process stores them like
live ones — also a stream served whole (instant) or paced through the relay (realtime).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import orjson
import pytest

from .processes import fake_upstream, llmitm_proxy
from .test_record_replay import tripwire

pytestmark = pytest.mark.slow

CONFIG = """
[endpoints.chat-only]
kind = "compatible"
base_url = "{chat}/v1"
apis = ["chat"]

[[routes]]
models = ["over-chat*"]
endpoints = ["chat-only"]
"""

ECHO = {"x-fake-scenario": "echo"}  # the fake answers "Echo: <last user text>"
TURNS = ("hi", "again")


def conversation(client: openai.OpenAI, stream: bool) -> list[dict]:
    """Two turns, the second chained to the first; each answer as the SDK parsed it."""
    answers: list[dict] = []
    previous: str | None = None
    for text in TURNS:
        chained = {"previous_response_id": previous} if previous else {}
        if stream:
            with client.responses.stream(model="over-chat", input=text, **chained) as events:
                answer = events.get_final_response()
        else:
            answer = client.responses.create(model="over-chat", input=text, **chained)
        answers.append(answer.model_dump())
        previous = answer.id
    return answers


def client_for(base_url: str, scope: str) -> openai.OpenAI:
    headers = {**ECHO, "x-llmitm-scope": scope}
    return openai.OpenAI(
        base_url=base_url, api_key="sk-client", max_retries=0, default_headers=headers
    )


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict]]:
    tmp = tmp_path_factory.mktemp("chain")
    folder = tmp / "recordings"
    live: dict[bool, list[dict]] = {}
    with fake_upstream(tmp, "chat") as up:
        options = [
            *("--set", f"llmitm_recordings={folder}"),
            *("--set", "llmitm_allow_record_in_ci=true"),  # recording on purpose
        ]
        with llmitm_proxy(tmp / "rec", config=CONFIG.format(chat=up.url), extra=options) as proxy:
            for stream in (False, True):
                live[stream] = conversation(client_for(proxy.base_url(), f"s{stream}"), stream)
    for answers in live.values():
        first, second = answers
        assert [a["output"][0]["content"][0]["text"] for a in answers] == [
            "Echo: hi",
            "Echo: again",
        ]
        assert second["previous_response_id"] == first["id"]
    yield folder, live


def replay_conversation(
    recorded: tuple[Path, dict], tmp: Path, replay_from: str, stream: bool, **more: str
) -> None:
    """Replay the recorded conversation in a fresh process and compare it with the live one."""
    folder, live = recorded
    report = tmp / "report.json"
    with tripwire() as wire:
        options = {
            "llmitm_record": "replay",
            "llmitm_recordings": str(folder),
            "llmitm_replay_from": replay_from,
            "llmitm_replay_report": str(report),
            **more,
        }
        extra = [arg for k, v in options.items() for arg in ("--set", f"{k}={v}")]
        with llmitm_proxy(tmp, config=CONFIG.format(chat=wire.url), extra=extra) as proxy:
            try:
                replayed = conversation(client_for(proxy.base_url(), f"s{stream}"), stream)
            except openai.APIStatusError as exc:
                pytest.fail(f"turn failed: {exc.status_code} {exc.message}")
    summary = orjson.loads(report.read_bytes())
    assert (summary["hits"], summary["misses"], summary["drift"]) == (2, [], [])
    for got, then in zip(replayed, live[stream], strict=True):
        assert got["output"] == then["output"]
        # the same ids as recorded: the second turn names the first answer as it did then
        assert (got["id"], got["previous_response_id"]) == (
            then["id"],
            then["previous_response_id"],
        )


@pytest.mark.parametrize("timing", ["instant", "realtime"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("replay_from", ["client", "upstream"])
def test_a_chained_conversation_replays_in_a_fresh_process(
    recorded: tuple[Path, dict], tmp_path: Path, replay_from: str, stream: bool, timing: str
) -> None:
    replay_conversation(recorded, tmp_path, replay_from, stream, llmitm_replay_timing=timing)


@pytest.mark.parametrize("replay_from", ["client", "upstream"])
def test_the_chain_matches_even_with_ids_in_the_key(
    recorded: tuple[Path, dict], tmp_path: Path, replay_from: str
) -> None:
    """The strict profile keys previous_response_id by value, not by placeholder: the replay
    still matches, because the first answer's id is the recorded one (served as recorded, or
    re-made with the recording's ids)."""
    replay_conversation(recorded, tmp_path, replay_from, True, llmitm_match_profile="strict")
