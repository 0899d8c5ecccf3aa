"""The recordings folder's format 2: shared big values stored once as blobs (and checked by
:func:`folder_problems`), coarse/exact/no export timing, byte-stable re-exports, and format 1
folders (the committed examples) still read."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest

from llmitm.cli import main
from llmitm.replay.folder import BLOB_MIN_BYTES, FORMAT_VERSION
from llmitm.replay.keys import match_key
from llmitm.replay.model import Interaction, Message
from llmitm.replay.timing import parse_timing, schedule
from llmitm.store.folder import folder_problems, read_folder, read_manifest, write_folder

EXAMPLES = Path(__file__).resolve().parents[2] / "recordings"
FORMAT_1 = Path(__file__).resolve().parent / "data" / "recordings-format-1"
"""The committed examples as an earlier llmitm wrote them (format 1: no blobs, exact times)."""
SYSTEM = "You are a careful assistant. " * 1200  # ~35 KB: a long system prompt
TOOLS = [
    {"type": "function", "name": f"tool_{n}", "description": "d" * 400, "parameters": {}}
    for n in range(60)
]  # ~30 KB of tool schemas


def interaction(scope: str, question: str, started_us: int) -> Interaction:
    body = orjson.dumps(
        {
            "model": "gpt-x",
            "stream": True,
            "tools": TOOLS,
            "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": question},
            ],
        }
    )
    key = match_key("POST", "/v1/chat/completions", [], body)
    chunks = [
        (123_456, b'data: {"choices":[{"delta":{"content":"Hel"}}]}\n\n'),
        (131_004, b'data: {"choices":[{"delta":{"content":"lo"}}]}\n\n'),
        (250_987, b"data: [DONE]\n\n"),
    ]
    return Interaction(
        id=f"id-{scope}-{question}",
        scope=scope,
        key=key.key,
        key_version=key.version,
        method="POST",
        route="chat.completions",
        model="gpt-x",
        stream=True,
        canonical_utf8=key.canonical_utf8,
        started_us=started_us,
        status=200,
        ttfb_us=118_765,
        duration_us=251_234,
        legs={
            "client_req": Message(
                headers=[("content-type", "application/json")],
                content=body,
                method="POST",
                url="https://api.openai.com/v1/chat/completions",
            ),
            "client_resp": Message(
                headers=[("content-type", "text/event-stream")], chunks=chunks, status=200
            ),
        },
    )


def suite() -> list[Interaction]:
    return [
        interaction("t::a", "What is 2+2?", 1),
        interaction("t::a", "And 3+3?", 2),
        interaction("t::b", "What is 2+2?", 3),
    ]


def test_shared_big_values_are_stored_once_and_read_back(tmp_path: Path) -> None:
    originals = suite()
    files = write_folder(tmp_path, originals)
    blobs = sorted((tmp_path / "_blobs").iterdir())
    contents = [orjson.loads(b.read_bytes()) for b in blobs]
    assert SYSTEM in contents and TOOLS in contents  # each stored once, whole
    for file in files:
        text = file.read_text()
        assert '"$blob"' in text and "careful assistant" not in text
        assert len(text) < BLOB_MIN_BYTES  # the interaction files stay small
    back = read_folder(tmp_path)
    assert [i.legs["client_req"].body() for i in back] == [
        i.legs["client_req"].body() for i in originals
    ]  # byte for byte
    assert [i.canonical for i in back] == [i.canonical for i in originals]
    assert [i.key for i in back] == [i.key for i in originals]
    assert folder_problems(tmp_path) == []
    # One interaction: its tool list (once in the body, once key-sorted in the canonical
    # request) is no longer shared and goes back inline; the prompt, in both, stays a blob.
    write_folder(tmp_path, [interaction("t::a", "alone", 1)])
    assert [orjson.loads(b.read_bytes()) for b in (tmp_path / "_blobs").iterdir()] == [SYSTEM]
    assert folder_problems(tmp_path) == []


def test_a_value_used_once_stays_inline(tmp_path: Path) -> None:
    one = interaction("t::a", "Hi", 1)
    one.canonical_utf8 = b"{}"  # else the prompt is in the body and the canonical request: twice
    write_folder(tmp_path, [one])
    assert not (tmp_path / "_blobs").exists()
    assert "careful assistant" in next(tmp_path.glob("t_a-*/*.json")).read_text()


def test_folder_problems_finds_missing_orphan_and_edited_blobs(tmp_path: Path) -> None:
    write_folder(tmp_path, suite())
    blobs = sorted((tmp_path / "_blobs").iterdir())
    blobs[0].unlink()
    (tmp_path / "_blobs" / ("0" * 64 + ".json")).write_text('"stray"\n')
    blobs[1].write_text('"edited"\n')
    shutil.copy(next(tmp_path.glob("t_a-*/0000-*.json")), tmp_path / "t_a-x.json")
    (tmp_path / "extra").mkdir()
    (tmp_path / "extra" / "0000-x.json").write_text("{}")
    problems = folder_problems(tmp_path)
    assert any(
        p.startswith(f"_blobs/{blobs[0].name}: missing (referred to by t_a-") for p in problems
    )
    assert f"_blobs/{'0' * 64}.json: orphan blob (no interaction file refers to it)" in problems
    assert any(p.startswith(f"_blobs/{blobs[1].name}: content does not match") for p in problems)
    assert "extra/0000-x.json: not listed in manifest.json" in problems
    assert len(problems) == 4, problems
    # Reading says which blob is missing, in one line.
    with pytest.raises(Exception, match=rf"{blobs[0].name}: missing blob"):
        read_folder(tmp_path)
    (tmp_path / "manifest.json").unlink()
    assert folder_problems(tmp_path) == [f"{tmp_path}: no manifest.json (not a recordings folder)"]


def chunk_times(folder: Path) -> list[object]:
    value = orjson.loads(next(folder.glob("t_a-*/0000-*.json")).read_bytes())
    return [
        value["ttfb_ms"],
        value["duration_ms"],
        *(c["t_ms"] for c in value["client_resp"]["chunks"]),
    ]


def test_export_timing_coarse_exact_none(tmp_path: Path) -> None:
    for timing in ("coarse", "exact", "none"):
        write_folder(tmp_path / timing, suite(), timing=timing)
        assert read_manifest(tmp_path / timing)["timing"] == timing
    assert chunk_times(tmp_path / "coarse") == [120, 250, 120, 130, 250]
    assert chunk_times(tmp_path / "exact") == [118.765, 251.234, 123.456, 131.004, 250.987]
    assert chunk_times(tmp_path / "none") == [0, 0, 0, 0, 0]
    with pytest.raises(ValueError, match="coarse, exact, none"):
        write_folder(tmp_path / "x", suite(), timing="fine")
    # Realtime replay of a coarse folder: every send moment within 10 ms of the recording's.
    realtime = parse_timing("realtime", 0)
    exact, coarse = read_folder(tmp_path / "exact")[0], read_folder(tmp_path / "coarse")[0]
    plans = []
    for recorded in (exact, coarse):
        offsets = [t for t, _ in recorded.legs["client_resp"].chunks or []]
        plans.append(schedule(recorded.ttfb_us, offsets, realtime))
    (head_e, sends_e), (head_c, sends_c) = plans
    assert abs(head_e - head_c) <= 0.010
    assert all(abs(a - b) <= 0.010 for a, b in zip(sends_e, sends_c, strict=True))
    assert abs(sends_c[0] - 0.123456) <= 0.010  # time to first token


def test_re_exports_are_byte_identical(tmp_path: Path) -> None:
    def snapshot(folder: Path) -> dict[str, bytes]:
        return {
            str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()
        }

    write_folder(tmp_path / "a", suite())
    first = snapshot(tmp_path / "a")
    # Through the CLI: the folder read back and exported again, elsewhere and in place.
    assert main(["rec", "export", str(tmp_path / "b"), "--from-folder", str(tmp_path / "a")]) == 0
    assert main(["rec", "export", str(tmp_path / "a"), "--from-folder", str(tmp_path / "a")]) == 0
    assert snapshot(tmp_path / "b") == first == snapshot(tmp_path / "a")
    # The committed examples (format 1, exact times) re-export once to format 2; from then on
    # every re-export is the same bytes.
    assert main(["rec", "export", str(tmp_path / "c"), "--from-folder", str(EXAMPLES)]) == 0
    assert main(["rec", "export", str(tmp_path / "d"), "--from-folder", str(tmp_path / "c")]) == 0
    assert snapshot(tmp_path / "c") == snapshot(tmp_path / "d")
    assert read_manifest(tmp_path / "c")["format_version"] == FORMAT_VERSION


def test_format_1_folders_still_read() -> None:
    assert read_manifest(FORMAT_1)["format_version"] == 1
    examples = read_folder(FORMAT_1)
    assert examples and all(i.legs.get("client_resp") for i in examples)
    assert folder_problems(FORMAT_1) == []


def test_migrate_reads_blobs_and_format_1(tmp_path: Path) -> None:
    write_folder(tmp_path / "blobs", suite())
    shutil.copytree(FORMAT_1, tmp_path / "v1")
    for folder in (tmp_path / "blobs", tmp_path / "v1"):
        before = [i.legs["client_req"].body() for i in read_folder(folder)]
        assert main(["rec", "migrate", str(folder), "--ignore", "messages.*.content"]) == 0
        assert [i.legs["client_req"].body() for i in read_folder(folder)] == before
        assert folder_problems(folder) == []
