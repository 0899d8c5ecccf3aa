"""The bodies of ``/_llmitm/healthz`` and ``/_llmitm/readyz``.

``healthz`` says the process answers at all. ``readyz`` says whether llmitm can serve calls:
each check (the configuration loaded, the store open, the relay started, the proxy
listening) is a :class:`Check`, and one failing check makes the answer a 503 that names it,
so an orchestrator's probe log says what to fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    detail: str = ""


HEALTHY: dict[str, Any] = {"status": "ok"}


def readiness(checks: list[Check]) -> tuple[int, dict[str, Any]]:
    """The status code and JSON body of ``readyz`` for ``checks``."""
    failed = [check.name for check in checks if not check.ok]
    body: dict[str, Any] = {
        "status": "ok" if not failed else "unavailable",
        "checks": {
            check.name: {"ok": check.ok, **({"detail": check.detail} if check.detail else {})}
            for check in checks
        },
    }
    if failed:
        body["failed"] = failed
    return (200 if not failed else 503), body
