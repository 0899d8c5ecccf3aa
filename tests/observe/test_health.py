"""The readiness answer (observe.health): 200 when every check passes, else 503 naming the
failed checks with their details."""

from __future__ import annotations

from llmitm.observe.health import Check, readiness


def test_all_checks_pass() -> None:
    status, body = readiness([Check("config", True, "a.toml"), Check("store", True)])
    assert status == 200
    assert body == {
        "status": "ok",
        "checks": {"config": {"ok": True, "detail": "a.toml"}, "store": {"ok": True}},
    }


def test_a_failed_check_is_a_503_that_names_it() -> None:
    status, body = readiness(
        [Check("config", True), Check("store", False, "still opening"), Check("relay", False)]
    )
    assert status == 503
    assert body["status"] == "unavailable" and body["failed"] == ["store", "relay"]
    assert body["checks"]["store"] == {"ok": False, "detail": "still opening"}
