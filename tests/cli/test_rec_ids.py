"""Recording ids at any terminal width: ``rec ls`` prints each id as its shortest unique
prefix (at least 8 characters) and never cuts it further, every ``rec`` command that takes an
id accepts that prefix, and an ambiguous one is a one-line error naming the candidates. Run
through ``llmitm``'s ``main`` on copies of the committed example recordings, in a folder and
imported into the real SQLite store, with ``COLUMNS=80``."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmitm.cli import main
from llmitm.cli.rec.common import RecError, resolve_id, short_ids
from llmitm.replay import folder as folder_format
from llmitm.replay.model import new_id
from llmitm.store import folder as folder_files

ROOT = Path(__file__).resolve().parents[2]
RECORDINGS = ROOT / "recordings"
SAME_MICROSECOND = 1_790_000_000_000_000
HEX = "0123456789abcdef"


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main(args)
    out, err = capsys.readouterr()
    return status, out, err


@given(st.sets(st.text(HEX, min_size=19, max_size=19), min_size=1, max_size=40))
def test_short_ids_are_the_shortest_unique_prefixes(ids: set[str]) -> None:
    short = short_ids(ids)
    assert set(short) == ids
    for ident, prefix in short.items():
        assert ident.startswith(prefix) and len(prefix) >= 8
        assert [other for other in ids if other.startswith(prefix)] == [ident]
        if len(prefix) > 8:  # one character less would name another id too
            assert sum(other.startswith(prefix[:-1]) for other in ids) > 1
        assert resolve_id(prefix, list(ids)) == ident


def test_resolve_id_refuses_a_missing_or_ambiguous_prefix() -> None:
    ids = ["661960aaaa", "661961bbbb", "66196xcccc", "77"]
    with pytest.raises(RecError) as ambiguous:
        resolve_id("66196", ids)
    assert str(ambiguous.value) == (
        "'66196' starts 3 recording ids: 661960, 661961, 66196x; give more of the id"
    )
    with pytest.raises(RecError, match=r"no recording with id '99'"):
        resolve_id("99", ids)
    assert resolve_id("77", ids) == "77"  # a whole id that is another's prefix is itself
    assert resolve_id("661960…", ids) == "661960aaaa"  # pasted with a cut column's ellipsis


def crowded(tmp_path: Path, count: int = 12) -> Path:
    """The examples several times over, all ids minted in one microsecond: they differ only
    in their random tail, so their unique prefixes are long (14+ characters)."""
    examples = folder_files.read_folder(RECORDINGS)
    interactions = []
    for n in range(count):
        copy = folder_format.interaction_from_json(
            folder_format.interaction_to_json(examples[n % len(examples)])
        )
        copy.id, copy.started_us = new_id(SAME_MICROSECOND), n
        copy.scope = f"{copy.scope}-{n}"
        interactions.append(copy)
    target = tmp_path / "crowded"
    folder_files.write_folder(target, interactions)
    return target


def listed_ids(table: str) -> list[str]:
    return re.findall(r"^│ (\S+)\s+│", table, flags=re.MULTILINE)


@pytest.fixture
def narrow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")


@pytest.mark.usefixtures("narrow")
def test_ls_ids_at_80_columns_are_accepted_by_show_diff_export_and_prune(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = crowded(tmp_path)
    db = tmp_path / "x.db"
    assert run(["rec", "import", str(folder), "--db", str(db)], capsys)[0] == 0
    full = [
        row["id"] for row in orjson.loads(run(["rec", "ls", "--db", str(db), "--json"], capsys)[1])
    ]
    status, table, _ = run(["rec", "ls", "--db", str(db)], capsys)
    assert status == 0 and max(map(len, table.splitlines())) <= 80
    shown = listed_ids(table)
    assert len(shown) == len(full) == 12 and "…" not in table
    assert all(14 <= len(ident) < 19 for ident in shown)  # cut, but to a unique prefix
    assert sorted(shown) == sorted(short_ids(full).values())

    for source in (["--db", str(db)], ["--folder", str(folder)]):
        status, out, err = run(["rec", "show", shown[0], *source], capsys)
        assert status == 0, err
        assert out.startswith(f"{next(i for i in full if i.startswith(shown[0]))} · ")
    status, _, err = run(["rec", "diff", shown[0], shown[1], "--db", str(db)], capsys)
    assert status in (0, 1) and not err
    exported = tmp_path / "one"
    status, out, err = run(
        ["rec", "export", str(exported), "--db", str(db), "--id", shown[2]], capsys
    )
    assert status == 0, err
    assert [i.id for i in folder_files.read_folder(exported)] == [
        i for i in full if i.startswith(shown[2])
    ]
    status, out, err = run(["rec", "prune", "--db", str(db), "--id", shown[3]], capsys)
    assert status == 0 and "pruned 1; 11 recording(s) left" in out, err


@pytest.mark.usefixtures("narrow")
def test_an_ambiguous_prefix_is_one_line_naming_the_candidates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = crowded(tmp_path, count=3)
    common = f"{SAME_MICROSECOND:013x}"  # every id starts with it
    for command in (
        ["show", common],
        ["diff", common, common],
        ["export", str(tmp_path / "x"), "--from-folder", str(folder), "--id", common],
    ):
        args = ["rec", *command] + ([] if "--from-folder" in command else ["--folder", str(folder)])
        status, out, err = run(args, capsys)
        assert status == 2 and not out
        line = err.strip()
        assert "\n" not in line and f"'{common}' starts 3 recording ids: " in line
        assert line.endswith("; give more of the id")
        for ident in (i.id for i in folder_files.read_folder(folder)):
            assert ident[: len(common) + 1] in line
    assert not (tmp_path / "x").exists()


def test_show_prints_the_conversation_and_raw_and_json_on_request(
    capsys: pytest.CaptureFixture[str],
) -> None:
    examples = {i.scope: i for i in folder_files.read_folder(RECORDINGS)}
    tools = examples["examples/tools"]  # a Responses stream the proxy made from a chat one
    source = ["--folder", str(RECORDINGS)]
    status, out, _ = run(["rec", "show", tools.id[:12], *source], capsys)
    assert status == 0
    sent, got = out.split("══ client sent ", 1)[1].split("══ client got ", 1)
    assert "llmitm · Responses request · model over-chat-mini" in sent
    assert "── user " in sent
    assert "llmitm · Responses stream" in got and "── assistant " in got
    assert "[tool call] lookup" in got
    assert "event: response." not in out  # the conversation, not the events
    assert "authorization" not in out

    status, raw, _ = run(["rec", "show", tools.id[:12], "--raw", *source], capsys)
    assert status == 0
    for leg in ("client_req", "upstream_req", "upstream_resp", "client_resp"):
        assert f"── {leg}  " in raw
    assert "authorization: Bearer <redacted>" in raw
    assert "event: response.completed" in raw  # the client's stream, as sent

    status, document, _ = run(["rec", "show", tools.id[:12], "--json", *source], capsys)
    assert status == 0 and orjson.loads(document)["id"] == tools.id
