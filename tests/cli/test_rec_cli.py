"""``llmitm rec why``, ``migrate``, the export's secret refusal and the progress bars, run
through the real command-line entry point over copies of the committed recordings (and a
real SQLite store they are imported into)."""

from __future__ import annotations

import io
import os
import pty
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from llmitm.cli import main
from llmitm.replay import folder as folder_format
from llmitm.replay.keys import KeyOptions
from llmitm.replay.rekey import request_key
from llmitm.replay.why import explain, parse_request
from llmitm.store import blob_codec
from llmitm.store import folder as folder_files

ROOT = Path(__file__).resolve().parents[2]
RECORDINGS = ROOT / "recordings"
LLMITM = Path(sys.executable).with_name("llmitm")
PLANTED = "ghp_" + "R8xk2Lq9Vt4Zm7Nw1Pc6Hy3Js5Bd0Fg8Ke2T"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    target = tmp_path / "recordings"
    shutil.copytree(RECORDINGS, target)
    return target


def first_file(folder: Path, scope_dir: str = "examples_chat") -> Path:
    return sorted(folder.glob(f"{scope_dir}-*/*.json"))[0]


@pytest.fixture(autouse=True)
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rich wraps at 80 columns without a terminal, and a message naming a temporary path
    wraps where that path's length says (longer under pytest-xdist: .../popen-gw1/...), which
    could split the words a test looks for; a wide console keeps each message on one line."""
    monkeypatch.setenv("COLUMNS", "1000")


def run_main(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main(args)
    out, err = capsys.readouterr()
    return status, out, err


# --- why -------------------------------------------------------------------------------------


def test_why_a_recorded_request_finds_its_recording(folder: Path, capsys) -> None:
    recording = first_file(folder)
    scope = orjson.loads(recording.read_bytes())["scope"]
    status, out, err = run_main(
        ["rec", "why", str(recording), "--recordings", str(folder), "--scope", scope, "--json"],
        capsys,
    )
    assert status == 0, err
    document = orjson.loads(out)
    assert document["found"] and document["nearest"][0]["same_key"]
    assert document["nearest"][0]["source"].endswith(recording.name)
    assert document["key"] == orjson.loads(recording.read_bytes())["key"]
    # The same, read from stdin, in the text form.
    sys.stdin = io.TextIOWrapper(io.BytesIO(recording.read_bytes()))
    try:
        status, out, _ = run_main(
            ["rec", "why", "-", "--recordings", str(folder), "--scope", scope], capsys
        )
    finally:
        sys.stdin = sys.__stdin__
    assert status == 0 and "✓ same key" in out and '"route": "chat.completions"' in out
    # Asked in another scope: no recording there, and the scope that has it is named.
    status, out, _ = run_main(
        ["rec", "why", str(recording), "--recordings", str(folder), "--scope", "other"], capsys
    )
    assert status == 1 and f"same key in other scope(s): {scope}" in out


def test_why_traces_redaction_drops_ignores_and_placeholders(folder: Path, capsys) -> None:
    body = {
        "model": "gpt-4.1-mini",
        "user": "someone",
        "metadata": {"run": "1"},
        "messages": [
            {"role": "system", "content": "Run 123e4567-e89b-12d3-a456-426614174000 on 2025-01-02"},
            {"role": "user", "content": "Say hello. sk-proj-abcdefghijklmnopqrstuv"},
        ],
    }
    request = folder.parent / "request.json"
    request.write_bytes(orjson.dumps(body))
    args = ["rec", "why", str(request), "--recordings", str(folder), "--scope", "examples/chat"]
    status, out, _ = run_main([*args, "--ignore", "messages.0.name,nothing.here", "--json"], capsys)
    assert status == 1  # no recording has this key
    trace = orjson.loads(out)
    assert trace["redacted"] == ["messages.1.content"]
    assert trace["dropped"] == ["user", "metadata"]
    assert trace["ignored"] == [] and trace["unmatched_ignores"] == [
        "messages.0.name",
        "nothing.here",
    ]
    assert trace["placeholders"] == [
        ["123e4567-e89b-12d3-a456-426614174000", "<uuid:1>"],
        ["2025-01-02", "<date:1>"],
    ]
    text = orjson.dumps(trace["canonical"]).decode()
    assert "sk-proj" not in text and "<redacted>" in text and "someone" not in text
    nearest = trace["nearest"][0]
    assert not nearest["same_key"] and nearest["id"] and nearest["diff"]
    assert any(line.startswith("+") and "<uuid:1>" in line for line in nearest["diff"])
    # Ignoring the messages altogether, the request is the recorded one's (the recordings are
    # re-keyed under the same options, as a replay does at load).
    status, out, _ = run_main([*args, "--ignore", "messages", "--json"], capsys)
    trace = orjson.loads(out)
    assert trace["ignored"] == ["messages"]
    assert status == 0 and trace["found"], trace["nearest"]


def test_why_explain_matches_the_recorder_key() -> None:
    recording = first_file(RECORDINGS)
    value = orjson.loads(recording.read_bytes())
    interaction = folder_format.interaction_from_json(value)
    method, path, headers, body = parse_request(recording.read_bytes())
    assert (method, path) == ("POST", "/v1/chat/completions")
    trace = explain(method, path, headers, body, KeyOptions())
    expected = request_key(interaction, KeyOptions())
    assert expected is not None and trace.key == expected


@pytest.mark.parametrize(
    ("content", "extra", "message"),
    [
        (b"[1", [], "not JSON"),
        (b"[1, 2]", [], "expected a JSON object"),
        (b'{"model": "x"}', [], "pass --path"),
        (b'{"model": "x"}', ["--profile", "nope"], "invalid choice"),
    ],
)
def test_why_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys, content: bytes, extra: list[str], message: str
) -> None:
    request = tmp_path / "r.json"
    request.write_bytes(content)
    with pytest.raises(SystemExit) if "choice" in message else _nothing():
        status, _, err = run_main(
            ["rec", "why", str(request), "--recordings", str(RECORDINGS), *extra], capsys
        )
        assert status == 2 and message in err and len(err.strip().splitlines()) == 1
    if "choice" in message:
        assert message in capsys.readouterr().err


def test_why_missing_file_and_missing_database(tmp_path: Path, capsys) -> None:
    status, _, err = run_main(["rec", "why", str(tmp_path / "no.json")], capsys)
    assert status == 2 and "no.json" in err and "Traceback" not in err
    request = tmp_path / "r.json"
    request.write_bytes(b'{"model": "m", "input": "hi"}')
    status, _, err = run_main(["rec", "why", str(request), "--db", str(tmp_path / "x.db")], capsys)
    assert status == 2 and "no database" in err
    for args in (["migrate"], ["prune", "--scope", "a"]):
        status, _, err = run_main(["rec", *args, "--db", str(tmp_path / "x.db")], capsys)
        assert status == 2 and "no database" in err and not (tmp_path / "x.db").exists()


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> bool:
        return False


# --- migrate ---------------------------------------------------------------------------------


def keys_of(folder: Path) -> list[str]:
    return [i.key for i in folder_files.read_folder(folder)]


def test_migrate_a_folder_to_new_ignore_paths_and_back(folder: Path, capsys) -> None:
    before = keys_of(folder)
    files_before = sorted(p.name for p in folder.glob("*/*.json"))
    status, out, _ = run_main(
        ["rec", "migrate", str(folder), "--ignore", "messages.*.content"], capsys
    )
    assert status == 0 and f"of {len(before)} recording(s)" in out
    manifest = folder_files.read_manifest(folder)
    assert manifest["settings"] == {"profile": "default", "ignore": ["messages.*.content"]}
    after = keys_of(folder)
    assert after != before and len(after) == len(before)
    # The files are named by the new keys; no file of the old keys is left behind.
    names = sorted(p.name for p in folder.glob("*/*.json"))
    assert names != files_before and len(names) == len(files_before)
    assert all(any(k[:8] in n for n in names) for k in after)
    assert main(["rec", "verify", str(folder)]) == 0
    # A changed prompt now finds its recording: the folder's settings are why's default.
    body = {"model": "gpt-4.1-mini", "messages": [{"role": "user", "content": "Other words."}]}
    request = folder.parent / "r.json"
    request.write_bytes(orjson.dumps(body))
    why = ["rec", "why", str(request), "--recordings", str(folder), "--scope", "examples/chat"]
    assert main(why) == 0
    capsys.readouterr()
    # --profile alone replaces the settings: back to the committed keys and names.
    status, out, _ = run_main(["rec", "migrate", str(folder), "--profile", "default"], capsys)
    assert status == 0 and keys_of(folder) == before
    assert sorted(p.name for p in folder.glob("*/*.json")) == files_before
    assert main(why) == 1


def test_migrate_brings_an_old_key_version_folder_up(folder: Path, capsys) -> None:
    manifest_path = folder / "manifest.json"
    manifest = orjson.loads(manifest_path.read_bytes())
    manifest["match_key_version"] = 0
    manifest_path.write_bytes(orjson.dumps(manifest))
    recording = first_file(folder)
    value = orjson.loads(recording.read_bytes())
    value["key"], value["key_version"] = "0" * 16, 0
    recording.write_bytes(orjson.dumps(value))
    status, out, _ = run_main(["rec", "verify", str(folder)], capsys)
    assert status == 1 and "match_key_version 0" in out and "llmitm rec migrate" in out
    status, out, _ = run_main(["rec", "migrate", str(folder)], capsys)
    assert status == 0 and "re-keyed 1 of" in out
    assert folder_files.read_manifest(folder)["match_key_version"] == 1
    assert main(["rec", "verify", str(folder)]) == 0
    assert "0" * 16 not in keys_of(folder)


def test_migrate_a_database_and_verify_names_migrate(tmp_path: Path, capsys) -> None:
    db = tmp_path / "llmitm.db"
    assert main(["rec", "import", str(RECORDINGS), "--db", str(db)]) == 0
    with sqlite3.connect(db) as connection:
        (victim,) = connection.execute("SELECT id FROM rec_interactions LIMIT 1").fetchone()
        connection.execute(
            "UPDATE rec_interactions SET match_key = 'ffffffffffffffff' WHERE id = ?", (victim,)
        )
    capsys.readouterr()
    status, out, _ = run_main(["rec", "verify", "--db", str(db)], capsys)
    assert status == 1 and "llmitm rec migrate" in out and victim in out
    status, out, _ = run_main(["rec", "migrate", "--db", str(db)], capsys)
    assert status == 0 and f"re-keyed 1 of {len(keys_of(RECORDINGS))} " in out
    assert main(["rec", "verify", "--db", str(db)]) == 0
    with sqlite3.connect(db) as connection:
        keys = {row[0] for row in connection.execute("SELECT match_key FROM rec_interactions")}
    assert "ffffffffffffffff" not in keys and keys == set(keys_of(RECORDINGS))


# --- export refuses secrets ------------------------------------------------------------------


def test_export_refuses_a_high_entropy_secret_and_writes_nothing(folder: Path, capsys) -> None:
    recording = first_file(folder)
    value = orjson.loads(recording.read_bytes())
    value["client_resp"]["body"] = {"text": f"here: {PLANTED}"}
    recording.write_bytes(orjson.dumps(value))
    for kind in ([], ["--har"]):
        target = folder.parent / ("out.har" if kind else "out")
        status, _, err = run_main(
            ["rec", "export", str(target), "--from-folder", str(folder), *kind], capsys
        )
        assert status == 2 and "refusing to export" in err and "entropy ghp_R8" in err
        assert PLANTED not in err and not target.exists()


# --- progress bars ---------------------------------------------------------------------------


def many(tmp_path: Path, count: int = 30) -> Path:
    """A folder of ``count`` recordings (the examples, repeated in scopes of their own)."""
    base = folder_files.read_folder(RECORDINGS)
    interactions = []
    for n in range(count):
        one = folder_format.interaction_from_json(
            folder_format.interaction_to_json(base[n % len(base)])
        )
        one.id, one.scope, one.started_us = f"{one.id}{n:03d}", f"{one.scope}/{n // len(base)}", n
        interactions.append(one)
    target = tmp_path / "many"
    folder_files.write_folder(target, interactions)
    return target


def test_no_progress_output_when_not_a_terminal(tmp_path: Path, capsys) -> None:
    source = many(tmp_path)
    db = str(tmp_path / "x.db")
    for args in (
        ["rec", "import", str(source), "--db", db],
        ["rec", "verify", "--db", db],
        ["rec", "migrate", "--db", db],
        ["rec", "check-secrets", str(source)],
        ["rec", "export", str(tmp_path / "out"), "--db", db],
    ):
        status, out, err = run_main(args, capsys)
        assert status == 0 and err == "" and "━" not in out, (args, out, err)


def test_progress_bar_on_a_terminal_stderr(tmp_path: Path) -> None:
    source = many(tmp_path)
    leader, follower = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "100"}
    env.pop("NO_COLOR", None)
    process = subprocess.Popen(
        [str(LLMITM), "rec", "import", str(source), "--db", str(tmp_path / "x.db")],
        stdout=subprocess.PIPE,
        stderr=follower,
        env=env,
    )
    os.close(follower)
    drawn = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:
            break
        if not chunk:
            break
        drawn += chunk
    out, _ = process.communicate(timeout=60)
    os.close(leader)
    assert process.returncode == 0
    assert b"importing" in drawn and b"\xe2\x94\x81" in drawn  # the bar's "━"
    assert b"importing" not in out and out.startswith(b"imported 30 recording(s)")


def test_check_secrets_reads_a_database_value_by_value(tmp_path: Path, capsys) -> None:
    db = tmp_path / "x.db"
    assert main(["rec", "import", str(RECORDINGS), "--db", str(db)]) == 0
    capsys.readouterr()
    # Clean as imported, although the pages run ids, scopes and keys together into long
    # random-looking runs of characters.
    status, out, _ = run_main(["rec", "check-secrets", str(db)], capsys)
    assert status == 0, out
    with sqlite3.connect(db) as connection:
        connection.execute("UPDATE rec_interactions SET error = ?", (f"leaked {PLANTED}",))
    status, out, _ = run_main(["rec", "check-secrets", str(db)], capsys)
    assert status == 1 and "entropy ghp_R8" in out and PLANTED not in out


def test_check_secrets_opens_compressed_bodies(tmp_path: Path, capsys) -> None:
    """Recorded bodies are stored zstd-compressed, where the raw scan cannot see them."""
    db = tmp_path / "x.db"
    assert main(["rec", "import", str(RECORDINGS), "--db", str(db)]) == 0
    capsys.readouterr()
    key = "sk-proj-" + "Q7b" * 12
    body = b"data: " + b'{"delta":"x"}\n\n' * 200 + f'{{"delta":"{key}"}}\n\n'.encode()
    codec, stored = blob_codec.encode(body)
    assert codec == blob_codec.ZSTD and key.encode() not in stored
    with sqlite3.connect(db) as connection:
        connection.execute(
            "UPDATE rec_blobs SET codec = ?, data = ?, size = ? "
            "WHERE sha256 = (SELECT max(sha256) FROM rec_blobs)",
            (codec, stored, len(body)),
        )
    status, out, _ = run_main(["rec", "check-secrets", str(db)], capsys)
    assert status == 1 and "sk-pro" in out and key not in out


def test_verify_names_a_database_whose_shared_chunks_are_broken(tmp_path: Path, capsys) -> None:
    db = tmp_path / "llmitm.db"
    assert main(["rec", "import", str(RECORDINGS), "--db", str(db)]) == 0
    assert main(["rec", "verify", "--db", str(db)]) == 0  # an import leaves counts whole
    with sqlite3.connect(db) as connection:  # a chunk lost (edited by hand, a bad copy)
        connection.execute(
            "DELETE FROM store_chunks WHERE rowid = (SELECT max(rowid) FROM store_chunks)"
        )
    capsys.readouterr()
    status, out, _ = run_main(["rec", "verify", "--db", str(db)], capsys)
    assert status == 1 and "store: chunk" in out and "missing" in out


def test_verify_names_a_broken_folder_before_reading_it(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "recordings"
    shutil.copytree(RECORDINGS, folder)
    status, out, _ = run_main(["rec", "verify", str(folder)], capsys)
    assert status == 0, out
    manifest = orjson.loads((folder / "manifest.json").read_bytes())
    (folder / manifest["interactions"][0]).unlink()
    (folder / manifest["interactions"][1]).with_name("9999-stray.json").write_text("{}")
    status, out, _ = run_main(["rec", "verify", str(folder)], capsys)
    assert status == 1 and manifest["interactions"][0] in out and "9999-stray.json" in out
    assert "Traceback" not in out


@pytest.mark.parametrize("timing", ["coarse", "exact", "none"])
def test_export_timing(tmp_path: Path, capsys, timing: str) -> None:
    db, folder = tmp_path / "x.db", tmp_path / "out"
    assert main(["rec", "import", str(RECORDINGS), "--db", str(db)]) == 0
    status, out, _ = run_main(
        ["rec", "export", str(folder), "--db", str(db), "--export-timing", timing], capsys
    )
    assert status == 0, out
    manifest = orjson.loads((folder / "manifest.json").read_bytes())
    assert manifest["timing"] == timing
    offsets = [
        chunk["t_ms"]
        for name in manifest["interactions"]
        for leg in ("client_resp", "upstream_resp")
        for chunk in orjson.loads((folder / name).read_bytes()).get(leg, {}).get("chunks", [])
    ]
    assert offsets
    if timing == "none":
        assert set(offsets) == {0}
    if timing == "coarse":
        assert all(t % 10 == 0 for t in offsets)
