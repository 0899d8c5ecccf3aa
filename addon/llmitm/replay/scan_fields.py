"""Where in a recording a secret-scan finding sits: the recording's id and the field, such as
``request.headers.authorization``, ``upstream_request.url`` or ``response.body``.

The scan itself judges text as it is stored or written (:mod:`llmitm.replay.scan`); this
module only names what it found, so ``rec check-secrets`` and the export refusal can say
which recording to prune (``llmitm rec prune --id``). A value is looked up in each field of
the recordings it may come from; one found in none (a free database page, the WAL, another
table) is reported without a recording. Pure functions; no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from llmitm.replay.model import Interaction, Leg
from llmitm.replay.scan import Finding

LEG_NAMES: dict[Leg, str] = {
    "client_req": "request",
    "upstream_req": "upstream_request",
    "upstream_resp": "upstream_response",
    "client_resp": "response",
}
"""How a leg is named in a field: from the client's side, as a user reads a recording."""


@dataclass(frozen=True, slots=True)
class Located:
    """A finding, and the recording and field holding it (``None``: in no recording)."""

    finding: Finding
    recording: str | None = None
    field: str | None = None

    def label(self) -> str:
        where = f"{self.recording} {self.field}" if self.recording else "(in no recording)"
        return f"{where}: {self.finding.label()}"


def interaction_fields(interaction: Interaction) -> Iterator[tuple[str, str]]:
    """Each field of ``interaction`` that a scan may flag, as ``(name, text)``."""
    for name in ("canonical", "error", "truncated", "model", "route", "endpoint", "scope"):
        value = getattr(interaction, name)
        if value:
            yield name, str(value)
    for leg, message in interaction.legs.items():
        prefix = LEG_NAMES[leg]
        if message.url:
            yield f"{prefix}.url", message.url
        for header, value in message.headers:
            yield f"{prefix}.headers.{header.lower()}", value
        body = message.body()
        if body:
            yield f"{prefix}.body", body.decode("utf-8", "replace")
    for name, values in (interaction.minted or {}).items():
        yield f"minted.{name}", str(values)


def locate(findings: Iterable[Finding], interactions: Iterable[Interaction]) -> list[Located]:
    """Each finding with the first recording and field whose text holds its value."""
    fields = [
        (interaction.id, name, text)
        for interaction in interactions
        for name, text in interaction_fields(interaction)
    ]
    located = []
    for finding in findings:
        place = next(((rid, name) for rid, name, text in fields if finding.value in text), None)
        located.append(Located(finding, *place) if place else Located(finding))
    return located


def recording_ids(located: Iterable[Located]) -> list[str]:
    """The recordings that hold findings, each once, in order."""
    return list(dict.fromkeys(item.recording for item in located if item.recording))
