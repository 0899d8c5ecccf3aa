"""Write kinds of the record/replay layer (backend-neutral, like ``UsageRecord``).

A recorder hands a finished :class:`~llmitm.replay.model.Interaction` (already redacted) to
``Store.submit`` as a :class:`RecordingWrite`; a ``rewrite`` run first submits a
:class:`DeleteScope`, which the writer applies before the recordings queued after it. Replay
misses are kept as :class:`ReplayMissRecord` so ``llmitm rec diff --last-miss`` can show the
last one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from llmitm.replay.model import Interaction


@dataclass(frozen=True, slots=True)
class RecordingWrite:
    kind: ClassVar[str] = "recording"

    interaction: Interaction


@dataclass(frozen=True, slots=True)
class DeleteScope:
    """Forget every recording of ``scope`` (``rewrite`` mode, ``rec prune --scope``)."""

    kind: ClassVar[str] = "recording-delete-scope"

    scope: str


@dataclass(frozen=True, slots=True)
class DeleteRecordings:
    """Forget the recordings with these ids (``rec prune --id``, ``--host``, ``--path``)."""

    kind: ClassVar[str] = "recording-delete"

    ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PruneRecordings:
    """Forget recordings that started before ``before_us`` (µs since the epoch)."""

    kind: ClassVar[str] = "recording-prune"

    before_us: int


@dataclass(frozen=True, slots=True)
class ReplayMissRecord:
    """One strict miss: the request's canonical text and the closest recording's id."""

    kind: ClassVar[str] = "replay-miss"

    at_us: int
    scope: str
    key: str
    reason: str
    canonical: str
    closest_id: str | None
    closest_canonical: str | None


@dataclass(frozen=True, slots=True)
class RekeyRecording:
    """A stored recording's key recomputed under today's rules (``rec migrate``)."""

    kind: ClassVar[str] = "recording-rekey"

    id: str
    key: str
    key_version: int
    canonical: str
