"""``rec check-secrets`` and the export refusal name the recording and the field of each hit,
and ``rec prune`` removes recordings by id and by host and path — run through ``llmitm``'s
``main`` on copies of the committed example recordings and the real SQLite store they are
imported into."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import orjson
import pytest

from llmitm.cli import main
from llmitm.replay import folder as folder_format
from llmitm.replay.scan import scan_text
from llmitm.replay.scan_fields import interaction_fields, locate
from llmitm.store import folder as folder_files

ROOT = Path(__file__).resolve().parents[2]
RECORDINGS = ROOT / "recordings"
PLANTED = "ghp_" + "R8xk2Lq9Vt4Zm7Nw1Pc6Hy3Js5Bd0Fg8Ke2T"


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main(args)
    out, err = capsys.readouterr()
    return status, out, err


def with_extra(tmp_path: Path) -> Path:
    """The examples plus two flows an app sends beside its model calls, as
    ``llmitm_record_all`` records them: an OTLP export and a plugin look-up."""
    interactions = folder_files.read_folder(RECORDINGS)
    template = interactions[0]
    for n, url in enumerate(
        ("https://ab.chatgpt.com/otlp/v1/metrics", "https://api.github.com/repos/openai/plugins")
    ):
        extra = folder_format.interaction_from_json(folder_format.interaction_to_json(template))
        extra.id, extra.started_us = f"{template.id}x{n}", 100 + n
        extra.legs["client_req"].url = url
        interactions.append(extra)
    target = tmp_path / "source"
    folder_files.write_folder(target, interactions)
    return target


def imported(tmp_path: Path, source: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    db = tmp_path / "x.db"
    assert main(["rec", "import", str(source), "--db", str(db)]) == 0
    capsys.readouterr()
    return db


def test_fields_name_legs_from_the_clients_side() -> None:
    interaction = folder_files.read_folder(RECORDINGS)[0]
    names = {name for name, _ in interaction_fields(interaction)}
    assert {"request.url", "request.body", "response.body", "upstream_request.body"} <= names
    assert "request.headers.content-type" in names


def test_a_finding_is_named_by_recording_and_field() -> None:
    interactions = folder_files.read_folder(RECORDINGS)
    leaky = interactions[1]
    leaky.legs["client_req"].headers.append(("X-Upload-Token", PLANTED))
    findings = scan_text(f"anything {PLANTED} around it")
    (located,) = locate(findings, interactions)
    assert (located.recording, located.field) == (leaky.id, "request.headers.x-upload-token")
    assert PLANTED not in located.label()
    (nowhere,) = locate(findings, interactions[2:])
    assert nowhere.recording is None and "(in no recording)" in nowhere.label()


def test_check_secrets_names_the_recording_file_and_field_in_a_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = with_extra(tmp_path)
    file = sorted(source.glob("examples_tools-*/*.json"))[0]
    value = orjson.loads(file.read_bytes())
    value["client_req"]["headers"].append(f"x-upload-token: {PLANTED}")
    file.write_bytes(orjson.dumps(value))
    status, out, _ = run(["rec", "check-secrets", str(source)], capsys)
    assert status == 1 and PLANTED not in out
    (line,) = [line for line in out.splitlines() if "entropy ghp_R8" in line]
    expected = f"{file}: {value['id']} request.headers.x-upload-token: entropy ghp_R8"
    assert expected in line
    target = tmp_path / "out"
    status, _, err = run(["rec", "export", str(target), "--from-folder", str(source)], capsys)
    assert status == 2 and not target.exists()
    assert f"{value['id']} request.headers.x-upload-token: entropy ghp_R8" in err
    assert "prune" not in err  # a folder is fixed by editing it, not pruned


def test_check_secrets_names_the_recording_and_field_in_a_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = imported(tmp_path, with_extra(tmp_path), capsys)
    assert run(["rec", "check-secrets", str(db)], capsys)[0] == 0
    with sqlite3.connect(db) as connection:
        ident, headers = connection.execute(
            "SELECT interaction_id, headers_json FROM rec_messages WHERE leg = 'upstream_req' "
            "ORDER BY interaction_id LIMIT 1"
        ).fetchone()
        leaked = orjson.dumps([*orjson.loads(headers), ["x-upload-token", PLANTED]]).decode()
        connection.execute(
            "UPDATE rec_messages SET headers_json = ? WHERE interaction_id = ? AND leg = ?",
            (leaked, ident, "upstream_req"),
        )
    status, out, _ = run(["rec", "check-secrets", str(db)], capsys)
    assert status == 1 and PLANTED not in out
    assert f"{ident} upstream_request.headers.x-upload-token: entropy ghp_R8" in out


def test_export_names_each_hit_and_prune_by_id_clears_the_way(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = imported(tmp_path, with_extra(tmp_path), capsys)
    with sqlite3.connect(db) as connection:
        ident = connection.execute(
            "SELECT id FROM rec_interactions ORDER BY id DESC LIMIT 1"
        ).fetchone()[0]
        connection.execute(
            "UPDATE rec_interactions SET error = ? WHERE id = ?", (f"leaked {PLANTED}", ident)
        )
    target = tmp_path / "out"
    status, _, err = run(["rec", "export", str(target), "--db", str(db)], capsys)
    assert status == 2 and not target.exists() and PLANTED not in err
    assert f"in 1 recording(s): {ident} error: entropy ghp_R8" in err
    assert f"`llmitm rec prune --id {ident}`" in err
    status, out, _ = run(["rec", "prune", "--db", str(db), "--id", ident[:-1]], capsys)
    assert status == 0 and "pruned 1; 5 recording(s) left" in out
    assert run(["rec", "export", str(target), "--db", str(db)], capsys)[0] == 0
    assert len(folder_files.read_folder(target)) == 5


def test_prune_by_host_and_by_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = imported(tmp_path, with_extra(tmp_path), capsys)
    prune = ["rec", "prune", "--db", str(db)]
    assert "pruned 0; 6 recording(s) left" in run([*prune, "--host", "nowhere.example"], capsys)[1]
    # Both given: only what matches both.
    out = run([*prune, "--host", "api.openai.com", "--path", "/otlp/*"], capsys)[1]
    assert "pruned 0; 6" in out
    assert "pruned 1; 5" in run([*prune, "--host", "AB.chatgpt.com"], capsys)[1]
    assert "pruned 1; 4" in run([*prune, "--path", "/repos/*/plugins"], capsys)[1]
    left = [
        url
        for (url,) in sqlite3.connect(db).execute(
            "SELECT url FROM rec_messages WHERE leg = 'client_req'"
        )
    ]
    assert len(left) == 4 and all(url.startswith("https://api.openai.com/v1/") for url in left)
    assert "pruned 3; 1" in run([*prune, "--path", "/v1/chat/*"], capsys)[1]


def test_prune_of_an_unknown_id_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = imported(tmp_path, RECORDINGS, capsys)
    status, _, err = run(["rec", "prune", "--db", str(db), "--id", "nope"], capsys)
    assert status == 2 and err.strip() == (
        "llmitm rec prune: no recording with id 'nope' (llmitm rec ls lists them)"
    )
    assert run(["rec", "ls", "--db", str(db), "--json"], capsys)[1].count('"id"') == 4
