"""Replay policies, sans-IO: what an exhausted key serves, the miss status, the drift
refusal, the host in match keys and the CI guard."""

from __future__ import annotations

import orjson
import pytest
from mitmproxy import exceptions
from mitmproxy.test import taddons

from llmitm.addons.record import LlmFlowRecorder
from llmitm.addons.relay import LlmRelay
from llmitm.addons.settings import LlmitmSettings
from llmitm.addons.store import LlmStore
from llmitm.replay.ci_guard import in_ci, record_refusal
from llmitm.replay.keys import KeyOptions, match_key
from llmitm.replay.model import Interaction, Message
from llmitm.replay.pool import Hit, Miss, ReplayPool
from llmitm.replay.serve import drift_error, miss_error

BODY = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "Hi"}]})
KEY = match_key("POST", "/v1/chat/completions", [], BODY)


def recording(n: int, key: str = KEY.key, scope: str = "global") -> Interaction:
    return Interaction(
        id=f"id{n}",
        scope=scope,
        key=key,
        key_version=1,
        method="POST",
        route="chat.completions",
        model="m",
        stream=False,
        canonical_utf8=KEY.canonical_utf8,
        started_us=n,
        source=f"recordings/000{n}.json",
        legs={"client_resp": Message(status=200, content=f"answer {n}".encode())},
    )


def served(pool: ReplayPool, policy: str, times: int) -> list[tuple[str, int, int]]:
    out = []
    for _ in range(times):
        hit = pool.take("global", KEY, policy)  # type: ignore[arg-type]
        assert isinstance(hit, Hit), hit
        out.append((hit.interaction.id, hit.served, hit.again))
    return out


# --- an exhausted key ------------------------------------------------------------------------


def test_exhausted_error_is_a_miss_that_counts_and_names_the_key() -> None:
    pool = ReplayPool.build([recording(1), recording(2)])
    assert served(pool, "error", 2) == [("id1", 1, 0), ("id2", 2, 0)]
    for _ in range(2):  # and stays one: nothing is served again
        miss = pool.take("global", KEY, "error")
        assert isinstance(miss, Miss) and miss.reason == "exhausted"
        assert miss.closest is not None and miss.closest.id == "id2"
        assert f"exhausted: served 2 of 2 recording(s) for key {KEY.key}" in miss.describe()
    assert pool.take("global", KEY).__class__ is Miss  # error is the default


def test_repeat_last_serves_the_last_recording_again_after_the_others_in_order() -> None:
    pool = ReplayPool.build([recording(2), recording(1), recording(3, scope="other")])
    assert served(pool, "repeat_last", 4) == [
        ("id1", 1, 0),
        ("id2", 2, 0),
        ("id2", 2, 1),
        ("id2", 2, 2),
    ]
    assert [i.id for i in pool.unused()] == ["id3"]  # a repeat uses nothing new


def test_cycle_serves_them_all_again_in_recorded_order() -> None:
    pool = ReplayPool.build([recording(1), recording(2), recording(3)])
    assert served(pool, "cycle", 7) == [
        ("id1", 1, 0),
        ("id2", 2, 0),
        ("id3", 3, 0),
        ("id1", 1, 1),
        ("id2", 2, 2),
        ("id3", 3, 3),
        ("id1", 1, 4),
    ]
    assert pool.unused() == []


def test_a_policy_never_invents_a_recording_for_an_unknown_key_or_scope() -> None:
    pool = ReplayPool.build([recording(1)])
    other = match_key("POST", "/v1/chat/completions", [], BODY.replace(b"Hi", b"Bye"))
    for policy in ("repeat_last", "cycle"):
        assert isinstance(pool.take("global", other, policy), Miss)  # type: ignore[arg-type]
        assert isinstance(pool.take("elsewhere", KEY, policy), Miss)  # type: ignore[arg-type]
    # a key left unused keeps its first recording for the first request, whatever the policy
    assert served(pool, "cycle", 1) == [("id1", 1, 0)]


# --- refusals: miss status, drift ------------------------------------------------------------


@pytest.mark.parametrize("status", [400, 409, 503])
def test_the_miss_status_is_configurable_and_never_retried(status: int) -> None:
    pool = ReplayPool.build([recording(1)])
    miss = pool.take("global", match_key("POST", "/v1/chat/completions", [], b"{}"))
    assert isinstance(miss, Miss)
    got, headers, body = miss_error(miss, "recordings/0001.json", status)
    assert got == status
    assert ("x-should-retry", "false") in headers and ("x-llmitm-replay", "miss") in headers
    error = orjson.loads(body)["error"]
    assert (
        error["type"] == "llmitm_replay_miss"
        and "llmitm rec diff --last-miss" in (error["message"])
    )
    assert miss_error(miss)[0] == 400  # the default


def test_a_drift_refusal_names_the_recording_and_the_diff_command() -> None:
    diff = ["--- recorded", "+++ request", "@@ -1 +1 @@", '-  "a": 1', '+  "a": 2']
    status, headers, body = drift_error(recording(7), diff, "recordings/0007.json")
    assert status == 400
    assert ("x-should-retry", "false") in headers and ("x-llmitm-replay", "drift") in headers
    error = orjson.loads(body)["error"]
    assert error["type"] == "llmitm_replay_drift" and error["code"] == "replay_drift"
    message = error["message"]
    for part in ("id7", "recordings/0007.json", "llmitm rec diff", "2 changed line(s)"):
        assert part in message, message


# --- the host in match keys ------------------------------------------------------------------


def test_the_host_counts_only_when_asked() -> None:
    def key(host: str, match_host: bool) -> str:
        options = KeyOptions(match_host=match_host)
        return match_key("POST", "/v1/chat/completions", [], BODY, options, host).key

    assert key("api.openai.com", False) == key("example.azure.com", False)
    assert key("api.openai.com", True) != key("example.azure.com", True)
    assert key("API.openai.com", True) == key("api.openai.com", True)  # hosts have no case


# --- the CI guard ----------------------------------------------------------------------------


def test_ci_is_what_ci_services_set() -> None:
    assert in_ci({"CI": "true"}) and in_ci({"CI": "1"}) and in_ci({"CI": "True"})
    assert not in_ci({}) and not in_ci({"CI": "false"}) and not in_ci({"CI": "0"})


@pytest.mark.parametrize("mode", ["record", "rewrite", "once", "replay-or-record"])
def test_ci_refuses_a_recording_mode_that_writes_a_folder(mode: str) -> None:
    refusal = record_refusal(mode, True, "recordings", False, {"CI": "true"})
    assert refusal is not None
    assert f"llmitm_record={mode}" in refusal and "llmitm_allow_record_in_ci" in refusal
    assert record_refusal(mode, True, "recordings", True, {"CI": "true"}) is None  # allowed
    assert record_refusal(mode, True, "recordings", False, {}) is None  # not CI
    # the default: recording into the local store, never committed
    assert record_refusal(mode, True, "", False, {"CI": "true"}) is None


def test_ci_never_refuses_replay_or_off() -> None:
    for mode in ("replay", "off"):
        assert record_refusal(mode, False, "recordings", False, {"CI": "1"}) is None


# --- the options, in mitmproxy ---------------------------------------------------------------


def recorder() -> LlmFlowRecorder:
    settings = LlmitmSettings()
    return LlmFlowRecorder(LlmStore(settings), LlmRelay())


def test_options_reach_the_recorder_and_bad_values_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    addon = recorder()
    with taddons.context(addon) as tctx:
        tctx.configure(addon, llmitm_match_host=True)
        assert addon.key_options.match_host is True
        with pytest.raises(exceptions.OptionsError, match="400-599"):
            tctx.configure(addon, llmitm_miss_status=200)
        with pytest.raises(exceptions.OptionsError, match="llmitm_replay_exhausted"):
            tctx.configure(addon, llmitm_replay_exhausted="sometimes")
        monkeypatch.setenv("CI", "true")
        addon.running()  # after start-up, a refusal is an OptionsError
        tctx.configure(addon, llmitm_record="record")  # into the store: fine
        with pytest.raises(exceptions.OptionsError, match="llmitm_allow_record_in_ci"):
            tctx.configure(addon, llmitm_recordings="recordings")
        assert addon.mode == "record"
        tctx.configure(addon, llmitm_record="replay", llmitm_recordings="recordings")
        with pytest.raises(exceptions.OptionsError, match="in CI"):
            tctx.configure(addon, llmitm_record="once")
        assert addon.mode == "replay"  # the refused mode never took effect
        tctx.configure(addon, llmitm_allow_record_in_ci=True, llmitm_record="once")
        assert addon.mode == "once"
