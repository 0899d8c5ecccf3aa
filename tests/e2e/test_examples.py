"""The committed ``recordings/`` replay with no upstream at all, byte for byte, through
``llmitm run --replay … -- COMMAND`` — what a CI job does (README, "Record and replay")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from llmitm.replay.folder import read_folder

from .processes import LLMITM, ROOT, TWO_ENDPOINTS
from .test_record_replay import tripwire

pytestmark = pytest.mark.slow

FOLDER = ROOT / "recordings"


@pytest.mark.parametrize("replay_from", ["client", "upstream"])
def test_the_examples_replay_offline_byte_for_byte(tmp_path: Path, replay_from: str) -> None:
    config = tmp_path / "llmitm.toml"
    out = tmp_path / "bodies.json"
    with tripwire() as wire:
        # Routes as when recorded (scripts/record_examples.py), endpoints where nothing runs.
        config.write_text(
            TWO_ENDPOINTS.format(chat=wire.url, responses=wire.url).replace(
                'models = ["over-chat*"]', 'models = ["over-chat*", "gpt-*"]'
            )
        )
        done = subprocess.run(
            [str(LLMITM), "run", "--replay", str(FOLDER), "--config", str(config), "--base-url",
             "--fail-on-unused", "--set", "llmitm_store=", "--set", f"confdir={tmp_path / 'c'}",
             "--set", f"llmitm_replay_from={replay_from}", "--set", "termlog_verbosity=warn",
             "--set", "flow_detail=0",
             "--", sys.executable, str(ROOT / "scripts" / "example_client.py"), "--out", str(out)],
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 hit(s), 0 miss(es), 0 unused" in done.stderr
    replayed = sorted(orjson.loads(out.read_bytes()))
    recorded = sorted(i.legs["client_resp"].body().decode() for i in read_folder(FOLDER))
    if replay_from == "client":
        assert replayed == recorded
    else:
        # Retranslated today: the passthrough answers are the recorded bytes; translated ones
        # carry ids and timestamps minted now, so they are compared as the SDK sees them.
        assert len(replayed) == len(recorded)
        assert sum(body in recorded for body in replayed) >= 2
        for body in replayed:
            assert "Hello" in body or "lookup" in body
