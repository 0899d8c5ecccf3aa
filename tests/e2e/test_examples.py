"""The committed ``recordings/`` replay with no upstream at all, byte for byte, through
``llmitm run --replay … -- COMMAND`` — what a CI job does (README, "Record and replay")."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from llmitm.store.folder import read_folder

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
    # Through today's translator too: it is handed the ids and times it minted when recording.
    assert replayed == recorded


def readme_ci_script() -> str:
    """The README's ``ci-replay.sh``, as printed there."""
    text = (ROOT / "README.md").read_text()
    start = text.index("# ci-replay.sh\n")
    return text[start : text.index("```", start)]


@pytest.mark.parametrize("complete", [True, False])
def test_the_readmes_mitmdump_ci_job_replays_and_fails_on_a_miss(
    tmp_path: Path, complete: bool
) -> None:
    shutil.copytree(FOLDER, tmp_path / "recordings")
    if not complete:  # a recording gone: its call misses, and so does the job
        manifest = orjson.loads((tmp_path / "recordings" / "manifest.json").read_bytes())
        (tmp_path / "recordings" / manifest["interactions"][-1]).unlink()
        manifest["interactions"] = manifest["interactions"][:-1]
        (tmp_path / "recordings" / "manifest.json").write_bytes(orjson.dumps(manifest))
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    client = f"{sys.executable} {ROOT / 'scripts' / 'example_client.py'} --out bodies.json"
    script = readme_ci_script().replace("8080", str(port))
    assert "\npytest\n" not in script and " pytest\n" in script
    script = script.replace(" pytest\n", f" {client}\n")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    done = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180
    )
    output = done.stdout + done.stderr
    if complete:
        assert done.returncode == 0, output
        assert "replay: 4 hits, 0 misses, 0 unused" in output
        replayed = orjson.loads((tmp_path / "bodies.json").read_bytes())
        assert sorted(replayed) == sorted(
            i.legs["client_resp"].body().decode() for i in read_folder(FOLDER)
        )
    else:
        assert done.returncode != 0, output
        assert "1 misses" in output and "REPLAY MISS" in output
