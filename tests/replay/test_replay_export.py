"""Exports of the committed example recordings: HAR 1.2 and mitmproxy's flow file, both
readable by their tools' own parsers, both without credentials; and folder round trips."""

from __future__ import annotations

from pathlib import Path

import orjson
from mitmproxy import io

from llmitm.cli import main
from llmitm.store.folder import read_folder

FOLDER = Path(__file__).resolve().parents[2] / "recordings"


def test_har_export(tmp_path: Path) -> None:
    target = tmp_path / "x.har"
    assert main(["rec", "export", str(target), "--har", "--from-folder", str(FOLDER)]) == 0
    har = orjson.loads(target.read_bytes())["log"]
    assert har["version"] == "1.2" and len(har["entries"]) == len(read_folder(FOLDER))
    streamed = [e for e in har["entries"] if e["_llmitm"]["chunks"]]
    assert streamed and all(e["response"]["content"]["text"] for e in streamed)
    assert all(e["timings"]["wait"] >= 0 for e in har["entries"])
    assert main(["rec", "check-secrets", str(target)]) == 0


def test_flow_file_export_opens_in_mitmproxy(tmp_path: Path) -> None:
    target = tmp_path / "x.flows"
    assert main(["rec", "export", str(target), "--flows", "--from-folder", str(FOLDER)]) == 0
    with target.open("rb") as data:
        flows = list(io.FlowReader(data).stream())
    recorded = read_folder(FOLDER)
    assert len(flows) == len(recorded)
    assert [f.response.content for f in flows] == [  # type: ignore[union-attr]
        i.legs["client_resp"].body() for i in recorded
    ]
    assert {f.metadata["llmitm"]["scope"] for f in flows} == {i.scope for i in recorded}


def test_check_secrets_and_verify_on_the_examples() -> None:
    assert main(["rec", "check-secrets", str(FOLDER)]) == 0
    assert main(["rec", "verify", str(FOLDER)]) == 0
