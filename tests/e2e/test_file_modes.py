"""A real ``llmitm run`` under ``umask 000`` creates its store folder, database files and
recordings folder owner-only."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import openai
import pytest

from .processes import fake_upstream, llmitm_proxy

pytestmark = pytest.mark.slow


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_store_and_recordings_are_owner_only_under_umask_000(tmp_path: Path) -> None:
    store = tmp_path / "new-store-folder" / "llmitm.db"
    recordings = tmp_path / "recordings"
    previous = os.umask(0)  # the proxy process inherits it
    try:
        with (
            fake_upstream(tmp_path) as fake,
            llmitm_proxy(
                tmp_path / "proxy",
                modes=[f"reverse:{fake.url}"],
                extra=[
                    "--set", f"llmitm_store={store}",
                    "--set", "llmitm_record=record",
                    "--set", f"llmitm_recordings={recordings}",
                    "--set", "llmitm_allow_record_in_ci=true",  # records on purpose
                ],
            ) as proxy,
        ):  # fmt: skip
            client = openai.OpenAI(base_url=proxy.base_url(), api_key="sk-x", max_retries=0)
            answer = client.chat.completions.create(
                model="gpt-pass", messages=[{"role": "user", "content": "hi"}]
            )
            assert answer.choices
    finally:
        os.umask(previous)
    assert mode(store.parent) == 0o700
    database_files = [p for p in store.parent.iterdir() if p.name.startswith(store.name)]
    assert store in database_files and {mode(p) for p in database_files} == {0o600}
    written = list(recordings.rglob("*"))
    assert any(p.suffix == ".json" and p.parent != recordings for p in written)
    assert mode(recordings) == 0o700
    assert {mode(p) for p in written if p.is_dir()} == {0o700}
    assert {mode(p) for p in written if p.is_file()} == {0o600}
