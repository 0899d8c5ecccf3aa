"""A replay report as JUnit XML (``llmitm run --replay DIR --junit PATH``), for CI systems
that show test results; ``replay-report.json`` says the same for tools that read JSON.

One testcase per scope (``classname`` ``llmitm.replay``, ``name`` the scope): the scopes of
the recordings that were loaded, plus any scope a request asked for and found nothing in. A
scope's testcase fails when a request of it missed (no recording with its key, or its
recordings were all used: *exhausted*), when a served recording's upstream request drifted
from today's, and — with ``fail_on_unused`` — when a recording of it was never served. It
holds one ``<failure>`` whose message counts the problems and whose text lists them with the
miss's diff. Pure: a report (the JSON the replay addon writes) in, bytes out.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

SUITE = "llmitm replay"
CLASSNAME = "llmitm.replay"


@dataclass(slots=True)
class _Scope:
    recordings: int = 0
    misses: list[dict[str, Any]] = field(default_factory=list)
    unused: list[dict[str, Any]] = field(default_factory=list)
    drift: list[dict[str, Any]] = field(default_factory=list)


def _miss_lines(miss: dict[str, Any]) -> list[str]:
    head = (
        f"miss ({miss.get('reason')}): {miss.get('request')} model={miss.get('model') or '-'} "
        f"key={miss.get('key')}; closest {miss.get('closest') or 'none'}"
    )
    return [head, *(f"    {line}" for line in miss.get("diff") or [])]


def junit_xml(
    report: Mapping[str, Any],
    scopes: Mapping[str, int] | None = None,
    scope_of: Mapping[str, str] | None = None,
    *,
    fail_on_unused: bool = False,
) -> bytes:
    """``report`` as a JUnit document. ``scopes``: each loaded scope and its number of
    recordings; ``scope_of``: recording id → scope (to place drift, which names an id)."""
    by_scope: dict[str, _Scope] = {name: _Scope(count) for name, count in (scopes or {}).items()}
    for miss in report.get("misses", []):
        by_scope.setdefault(str(miss.get("scope")), _Scope()).misses.append(miss)
    for item in report.get("unused", []):
        by_scope.setdefault(str(item.get("scope")), _Scope()).unused.append(item)
    for item in report.get("drift", []):
        scope = (scope_of or {}).get(str(item.get("id")), "(unknown scope)")
        by_scope.setdefault(scope, _Scope()).drift.append(item)

    root = ET.Element("testsuites", name="llmitm")
    suite = ET.SubElement(root, "testsuite", name=SUITE)
    properties = ET.SubElement(suite, "properties")
    for name in ("mode", "source", "loaded", "hits", "recorded"):
        ET.SubElement(properties, "property", name=name, value=str(report.get(name, "")))
    failures = 0
    for name in sorted(by_scope):
        scope = by_scope[name]
        case = ET.SubElement(suite, "testcase", classname=CLASSNAME, name=name)
        problems: list[str] = []
        counts: list[str] = []
        if scope.misses:
            counts.append(f"{len(scope.misses)} miss(es)")
            for miss in scope.misses:
                problems += _miss_lines(miss)
        if scope.drift:
            counts.append(f"{len(scope.drift)} drifted upstream request(s)")
            for item in scope.drift:
                problems.append(f"drift: {item.get('id')}")
                problems += [f"    {line}" for line in item.get("diff") or []]
        unused_lines = [
            f"unused: {item.get('id')} {item.get('route')} model={item.get('model') or '-'}"
            for item in scope.unused
        ]
        if scope.unused and fail_on_unused:
            counts.append(f"{len(scope.unused)} unused recording(s)")
            problems += unused_lines
        if counts:
            failures += 1
            failure = ET.SubElement(case, "failure", message=", ".join(counts), type="replay")
            failure.text = "\n".join(problems)
        notes = [f"{scope.recordings} recording(s) loaded"]
        if scope.unused and not fail_on_unused:
            notes += unused_lines
        ET.SubElement(case, "system-out").text = "\n".join(notes)
    tests = len(by_scope)
    for element in (root, suite):
        element.set("tests", str(tests))
        element.set("failures", str(failures))
        element.set("errors", "0")
    suite.set("skipped", "0")
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"
