"""The in-process proxy's guards: it refuses to start beside a running mitmproxy master (they
would share mitmproxy.ctx), and reports bad options and start-up errors in its exception."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from mitmproxy import master

from llmitm.addons.hosts.inprocess import InProcessError, InProcessProxy, active_master


def settings(tmp_path: Path, **extra: object) -> dict[str, object]:
    return {
        "mode": ["reverse:http://127.0.0.1:9"],
        "listen_host": "127.0.0.1",
        "listen_port": 0,
        "confdir": str(tmp_path / "confdir"),
        "llmitm_store": "",
        "llmitm_console": "off",
        **extra,
    }


async def test_refuses_to_start_beside_a_running_master(tmp_path: Path) -> None:
    other = master.Master(None)  # this test's loop runs: the master counts as active
    assert active_master() is other
    proxy = InProcessProxy(settings(tmp_path), lambda scope, exchange: None)
    with pytest.raises(InProcessError, match="another mitmproxy master"):
        proxy.start()
    assert not any(t.name == "llmitm" for t in threading.enumerate())
    other.should_exit.set()
    assert active_master() is None
    other._legacy_log_events.uninstall()  # its root-logger handler would outlive the loop


def test_bad_option_and_startup_errors_are_reported(tmp_path: Path) -> None:
    proxy = InProcessProxy(settings(tmp_path, llmitm_nonsense=1), lambda scope, exchange: None)
    with pytest.raises(InProcessError, match=r"bad option: .*llmitm_nonsense"):
        proxy.start()
    missing = tmp_path / "nowhere"
    proxy = InProcessProxy(
        settings(tmp_path, llmitm_record="replay", llmitm_recordings=str(missing)),
        lambda scope, exchange: None,
    )
    with pytest.raises(InProcessError, match=r"no manifest\.json"):
        proxy.start()
    assert not any(t.name == "llmitm" for t in threading.enumerate())


def test_starts_listens_and_stops(tmp_path: Path) -> None:
    proxy = InProcessProxy(settings(tmp_path, llmitm_record="off"), lambda scope, exchange: None)
    proxy.start()
    try:
        assert proxy.port() > 0
        assert [t.name for t in threading.enumerate()].count("llmitm") == 1
    finally:
        proxy.stop()
    assert not any(t.name == "llmitm" for t in threading.enumerate())


def test_ledger_notes_scope_outcome_and_message() -> None:
    from mitmproxy.test import tflow

    from llmitm.addons.hosts.inprocess import Exchange, ReplayLedger

    noted: list[tuple[str, Exchange]] = []
    ledger = ReplayLedger(lambda scope, exchange: noted.append((scope, exchange)))
    miss = tflow.tflow(resp=True)
    miss.request.path = "/llmitm-scope/t%3A%3Aa/v1/chat/completions"
    ledger.request(miss)
    miss.response.status_code = 400  # type: ignore[union-attr]
    miss.response.headers["x-llmitm-replay"] = "miss"  # type: ignore[union-attr]
    miss.response.content = b'{"error": {"message": "llmitm replay miss: no recording"}}'  # type: ignore[union-attr]
    ledger.response(miss)
    ledger.error(miss)  # already noted: not twice
    cut = tflow.tflow(resp=True, err=True)
    cut.request.path = "/v1/responses"
    cut.request.headers["x-llmitm-scope"] = "t::b"
    ledger.request(cut)
    ledger.error(cut)  # a stream cut midway: a response head, then the error
    unscoped = tflow.tflow(resp=True)
    ledger.request(unscoped)
    ledger.response(unscoped)  # no scope: not a test's call
    assert noted == [
        (
            "t::a",
            Exchange(
                "miss", "GET", "/v1/chat/completions", 400, "llmitm replay miss: no recording"
            ),
        ),
        ("t::b", Exchange("error", "GET", "/v1/responses", 200, "error")),
    ]
