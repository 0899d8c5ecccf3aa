"""The recordings a run reads and writes: loaded once the store is open, and the recordings
folder and the replay report written at shutdown.

:class:`LlmRecordingsLoad` sits after the store, which the flow recorder — first in line, to
see each request as the client sent it — does not (mitmproxy awaits each addon's
``running`` in order, so the recorder cannot wait for the store there).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Protocol

import orjson

from llmitm.addons.record.options import RecordSettings
from llmitm.addons.record.replay import Replayer
from llmitm.addons.store import LlmStore
from llmitm.replay import folder as folder_format
from llmitm.replay.capture import ReplayReport
from llmitm.replay.keys import KeyOptions
from llmitm.replay.model import Interaction
from llmitm.replay.pool import ReplayPool
from llmitm.replay.rekey import rekey
from llmitm.store import folder as folder_files

logger = logging.getLogger(__package__)


class Recorder(Protocol):
    """What loading reads and fills in on the flow recorder (typed here, not imported: the
    recorder imports the writers below)."""

    settings: RecordSettings
    store: LlmStore
    replay: Replayer
    report: ReplayReport
    fingerprint_key: bytes | None


class LlmRecordingsLoad:
    """Loads what the flow recorder needs from the store, in ``running``: the credential
    fingerprint key when recording, the replay pool when replaying (mitmproxy awaits the
    task before any flow)."""

    name = "llmitm_recordings_load"

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self._loading: asyncio.Task[None] | None = None

    def running(self) -> asyncio.Task[None] | None:
        if self.recorder.settings.mode == "off" or self._loading is not None:
            return None
        self._loading = asyncio.get_running_loop().create_task(
            self._load(), name="llmitm recordings load"
        )
        return self._loading

    async def _load(self) -> None:
        settings = self.recorder.settings
        if settings.recording:
            self.recorder.fingerprint_key = await self._fingerprint_key()
        if settings.replaying:
            await self._load_recordings()

    async def _fingerprint_key(self) -> bytes | None:
        try:
            store = await self.recorder.store.ready()
            return await store.fingerprint_key() if store is not None else None
        except Exception:  # a fingerprint is a nicety: recording goes on without it
            logger.warning("llmitm: no credential fingerprints (cannot read their key)")
            return None

    async def _load_recordings(self) -> None:
        recorder, replay = self.recorder, self.recorder.replay
        settings, report = recorder.settings, recorder.report
        # Paced answers and recorded truncations stream through a loopback relay: mitmproxy
        # sends a response an addon makes in one piece.
        replay.relay = await replay.shared_relay.ready()
        interactions: list[Interaction] = []
        try:
            if settings.recordings:
                path = Path(settings.recordings).expanduser()
                if path.exists() or settings.mode == "replay":
                    interactions = folder_files.read_folder(path)
                report.source = str(path)
            else:
                store = await recorder.store.ready()
                if store is not None:
                    interactions = await store.load_recordings()
                    report.source = store.location
                else:
                    logger.warning("llmitm: replay mode without a store or llmitm_recordings")
        except Exception as exc:
            # A replay that cannot read its recordings must not pretend: stop start-up.
            logger.error("llmitm: cannot load recordings: %s", exc)
            return
        rekey(interactions, settings.key_options)
        replay.pool = ReplayPool.build(interactions)
        report.loaded = len(interactions)
        logger.info("llmitm: %s mode, %d recording(s) loaded", settings.mode, len(interactions))


def write_report(path: str, report: ReplayReport, unused: list[Interaction]) -> None:
    """Write the replay report to ``path`` (whole or not at all)."""
    document = report.to_json(unused)
    target = Path(path)
    partial = target.with_suffix(target.suffix + ".partial")
    partial.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))
    partial.replace(target)


def write_folder(
    folder: str,
    recorded: list[Interaction],
    wiped: set[str],
    key_options: KeyOptions,
    timing: str,
) -> None:
    """Write this run's recordings into ``folder``, after the ones it holds of scopes this
    run did not wipe (``llmitm_record=rewrite``)."""
    path = Path(folder).expanduser()
    existing: list[Interaction] = []
    if (path / folder_format.MANIFEST).is_file():
        try:
            existing = folder_files.read_folder(path)
        except folder_format.FolderError as exc:
            logger.error("llmitm: not writing %s: %s", path, exc)
            return
    kept = [i for i in existing if i.scope not in wiped]
    # Files carry positions, not times: keep the folder's order, then this run's.
    for order, interaction in enumerate(kept):
        interaction.started_us = order
    base = len(kept)
    fresh = sorted(recorded, key=lambda i: (i.started_us, i.id))
    for order, interaction in enumerate(fresh):
        interaction.started_us = base + order
    written = folder_files.write_folder(
        path,
        [*kept, *fresh],
        {"profile": key_options.profile, "ignore": list(key_options.ignore)},
        timing=timing,
    )
    logger.info("llmitm: wrote %d recording(s) to %s", len(written), path)
