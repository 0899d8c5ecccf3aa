"""The replay report as JUnit XML (replay.junit): parsed back with the standard library, the
counts and failures must be those of the report."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

from llmitm.replay.junit import junit_xml

REPORT: dict[str, Any] = {
    "mode": "replay",
    "source": "recordings",
    "loaded": 6,
    "hits": 3,
    "recorded": 0,
    "misses": [
        {
            "scope": "tests/a",
            "key": "k1",
            "reason": "no-key",
            "request": "POST chat.completions",
            "model": "m",
            "closest": "id1",
            "diff": ["--- recorded", "+++ request", '-  "content": "a"', '+  "content": "b"'],
        },
        {
            "scope": "tests/a",
            "key": "k2",
            "reason": "exhausted",
            "request": "POST responses",
            "model": "m",
            "closest": "id2",
            "diff": [],
        },
        {
            "scope": "tests/new",
            "key": "k3",
            "reason": "no-scope",
            "request": "POST responses",
            "model": "m",
            "closest": None,
            "diff": [],
        },
    ],
    "unused": [{"id": "id5", "scope": "tests/c", "key": "k5", "route": "responses", "model": "m"}],
    "drift": [{"id": "id4", "diff": ["-a", "+b"]}],
}
SCOPES = {"tests/a": 2, "tests/b": 2, "tests/c": 1, "tests/d": 1}
SCOPE_OF = {"id1": "tests/a", "id2": "tests/a", "id4": "tests/d", "id5": "tests/c"}


def cases(root: ET.Element) -> dict[str, ET.Element]:
    return {case.get("name", ""): case for case in root.iter("testcase")}


def test_one_testcase_per_scope_and_failures_for_misses_and_drift() -> None:
    root = ET.fromstring(junit_xml(REPORT, SCOPES, SCOPE_OF))
    suite = root.find("testsuite")
    assert suite is not None
    by_name = cases(root)
    assert sorted(by_name) == ["tests/a", "tests/b", "tests/c", "tests/d", "tests/new"]
    assert suite.get("tests") == root.get("tests") == "5"
    assert suite.get("failures") == root.get("failures") == "3"  # a, d (drift), new
    failures = {name: case.find("failure") for name, case in by_name.items()}
    assert failures["tests/b"] is None and failures["tests/c"] is None
    a = failures["tests/a"]
    assert a is not None and a.get("message") == "2 miss(es)"
    assert "miss (exhausted): POST responses" in (a.text or "")
    assert '+  "content": "b"' in (a.text or "")
    d = failures["tests/d"]
    assert d is not None and d.get("message") == "1 drifted upstream request(s)"
    new = failures["tests/new"]
    assert new is not None and "closest none" in (new.text or "")
    # Unused without --fail-on-unused: a note, not a failure.
    out = by_name["tests/c"].find("system-out")
    assert out is not None and "unused: id5 responses" in (out.text or "")
    properties = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert properties["hits"] == "3" and properties["loaded"] == "6"


def test_fail_on_unused_fails_the_scope() -> None:
    root = ET.fromstring(junit_xml(REPORT, SCOPES, SCOPE_OF, fail_on_unused=True))
    assert root.get("failures") == "4"
    failure = cases(root)["tests/c"].find("failure")
    assert failure is not None and failure.get("message") == "1 unused recording(s)"


def test_a_clean_replay_has_no_failures() -> None:
    clean = {**REPORT, "misses": [], "unused": [], "drift": []}
    root = ET.fromstring(junit_xml(clean, SCOPES))
    assert root.get("tests") == "4" and root.get("failures") == "0"
    assert not list(root.iter("failure"))
