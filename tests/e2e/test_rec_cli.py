"""``llmitm rec`` over recordings made by a real llmitm in front of the fake upstream: export →
import into a fresh store → replay from that store gives the same answers; prune by scope and
by age removes what it should and replay then misses it; ``rec why`` and ``rec migrate`` on a
database; ``llmitm run --junit``.

Every replay runs behind a tripwire (no upstream connection allowed), as in
``test_record_replay``.
"""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

from llmitm.replay.model import Interaction
from llmitm.store import SqliteStore

from .processes import TWO_ENDPOINTS, Proxy, fake_upstream, llmitm_proxy
from .test_record_replay import REPLAY_CLIENT, llmitm, raw_post, tripwire

pytestmark = pytest.mark.slow

HELLO = [{"role": "user", "content": "Say hello."}]
# (scope, path, body, headers): two scopes, passthrough and translated, streamed and not.
CALLS: list[tuple[str, str, dict[str, Any], dict[str, str]]] = [
    ("alpha", "/v1/chat/completions", {"model": "gpt-pass", "messages": HELLO}, {}),
    ("alpha", "/v1/chat/completions", {"model": "gpt-pass", "messages": HELLO, "stream": True}, {}),
    ("beta", "/v1/responses", {"model": "over-chat-1", "input": "Say hello."}, {}),
    (
        "beta",
        "/v1/chat/completions",
        {"model": "over-responses-1", "messages": HELLO, "stream": True},
        {"x-fake-scenario": "reasoning"},
    ),
]


@dataclass
class Session:
    tmp: Path
    db: Path
    folder: Path
    bodies: list[bytes] = field(default_factory=list)


def post(proxy: Proxy, scope: str, path: str, body: dict[str, Any], headers: dict[str, str]):
    return raw_post(proxy, path, body, **{"x-llmitm-scope": scope, **headers})


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Session:
    tmp = tmp_path_factory.mktemp("rec-cli")
    result = Session(tmp, tmp / "recorded.db", tmp / "recordings")
    with fake_upstream(tmp) as up:
        config = TWO_ENDPOINTS.format(chat=up.url, responses=up.url)
        extra = ["--set", f"llmitm_store={result.db}"]
        with llmitm_proxy(tmp, config=config, modes=[f"reverse:{up.url}"], extra=extra) as proxy:
            for scope, path, body, headers in CALLS:
                response = post(proxy, scope, path, body, headers)
                assert response.status_code == 200, response.text
                result.bodies.append(response.content)
    exported = llmitm("rec", "export", str(result.folder), "--db", str(result.db))
    assert exported.returncode == 0, exported.stderr
    assert exported.stderr == ""  # no progress bar or colour in a pipe
    return result


@contextmanager
def replaying(session: Session, name: str, db: Path) -> Iterator[Proxy]:
    with tripwire() as wire:
        config = TWO_ENDPOINTS.format(chat=wire.url, responses=wire.url)
        extra = [
            "--set", "llmitm_record=replay",
            "--set", f"llmitm_store={db}",
            "--set", "llmitm_replay_from=client",
        ]  # fmt: skip
        with llmitm_proxy(
            session.tmp / name, config=config, modes=[f"reverse:{wire.url}"], extra=extra
        ) as proxy:
            yield proxy


def fresh_import(session: Session, name: str) -> Path:
    db = session.tmp / f"{name}.db"
    done = llmitm("rec", "import", str(session.folder), "--db", str(db))
    assert done.returncode == 0 and f"imported {len(CALLS)} recording(s)" in done.stdout
    return db


def count(db: Path) -> dict[str, int]:
    with sqlite3.connect(db) as connection:
        rows = connection.execute("SELECT scope, count(*) FROM rec_interactions GROUP BY scope")
        return dict(rows.fetchall())


def test_export_import_and_replay_from_the_imported_store(session: Session) -> None:
    manifest = orjson.loads((session.folder / "manifest.json").read_bytes())
    assert len(manifest["interactions"]) == len(CALLS)
    db = fresh_import(session, "imported")
    assert count(db) == {"alpha": 2, "beta": 2}
    # Nothing credential-shaped in the folder or in the raw bytes of either database.
    for target in (session.folder, session.db, db):
        scanned = llmitm("rec", "check-secrets", str(target))
        assert scanned.returncode == 0, scanned.stdout
    assert llmitm("rec", "verify", "--db", str(db)).returncode == 0
    with replaying(session, "replay-imported", db) as proxy:
        for (scope, path, body, headers), expected in zip(CALLS, session.bodies, strict=True):
            replayed = post(proxy, scope, path, body, headers)
            assert replayed.headers.get("x-llmitm-replay") == "hit", replayed.text
            assert replayed.content == expected
        # Each recording answers once: a second ask of the first one is exhausted.
        again = post(proxy, *CALLS[0])
        assert again.status_code == 400 and "exhausted" in again.text


def test_prune_by_scope_and_by_age_then_replay_misses(session: Session) -> None:
    db = fresh_import(session, "pruned")
    pruned = llmitm("rec", "prune", "--db", str(db), "--scope", "alpha")
    assert pruned.returncode == 0 and f"{len(CALLS) - 2} recording(s) left" in pruned.stdout
    assert count(db) == {"beta": 2}
    # Make the first beta recording two days old; a one-day prune takes it and nothing else.
    two_days_us = 2 * 86_400 * 1_000_000
    with sqlite3.connect(db) as connection:
        (first,) = connection.execute(
            "SELECT id FROM rec_interactions ORDER BY started_us LIMIT 1"
        ).fetchone()
        connection.execute(
            "UPDATE rec_interactions SET started_us = started_us - ? WHERE id = ?",
            (two_days_us, first),
        )
    assert llmitm("rec", "prune", "--db", str(db), "--older-than", "7d").returncode == 0
    assert count(db) == {"beta": 2}
    assert llmitm("rec", "prune", "--db", str(db), "--older-than", "1d").returncode == 0
    assert count(db) == {"beta": 1}
    with sqlite3.connect(db) as connection:
        assert connection.execute("SELECT count(*) FROM rec_blobs").fetchone()[0] > 0
        assert connection.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    with replaying(session, "replay-pruned", db) as proxy:
        gone = post(proxy, *CALLS[0])
        assert gone.status_code == 400 and gone.headers["x-llmitm-replay"] == "miss"
        assert "alpha" in gone.text
        old = post(proxy, *CALLS[2])  # the beta recording pruned by age
        assert old.status_code == 400 and old.headers["x-llmitm-replay"] == "miss"
        kept = post(proxy, *CALLS[3])
        assert kept.headers.get("x-llmitm-replay") == "hit" and kept.content == session.bodies[3]
    bad = llmitm("rec", "prune", "--db", str(db))
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_why_on_the_recorded_database(session: Session, tmp_path: Path) -> None:
    file = next(p for p in sorted(session.folder.glob("alpha-*/*.json")))
    why = llmitm("rec", "why", str(file), "--db", str(session.db), "--scope", "alpha")
    assert why.returncode == 0, why.stdout + why.stderr
    assert "✓ same key" in why.stdout and '"model": "gpt-pass"' in why.stdout
    other_scope = llmitm("rec", "why", str(file), "--db", str(session.db), "--scope", "beta")
    assert other_scope.returncode == 1
    changed = tmp_path / "changed.json"
    body = {"model": "gpt-pass", "messages": [{"role": "user", "content": "Say goodbye."}]}
    changed.write_bytes(orjson.dumps({**body, "user": "x", "metadata": {"a": "b"}}))
    why = llmitm("rec", "why", str(changed), "--db", str(session.db), "--scope", "alpha", "--json")
    assert why.returncode == 1, why.stderr
    document = orjson.loads(why.stdout)
    assert document["dropped"] == ["user", "metadata"] and document["recordings_in_scope"] == 2
    closest = document["nearest"][0]
    assert not closest["same_key"]
    assert '-        "content": "Say hello.",' in closest["diff"]
    assert '+        "content": "Say goodbye.",' in closest["diff"]
    # Ignoring the prompt, the recorded request and this one share a key.
    ignored = llmitm(
        "rec", "why", str(changed), "--db", str(session.db), "--scope", "alpha",
        "--ignore", "messages.*.content",
    )  # fmt: skip
    assert ignored.returncode == 0, ignored.stdout


async def stored_recordings(db: Path) -> list[Interaction]:
    """The recordings as the store reads them (canonical texts may sit in shared chunks)."""
    async with SqliteStore(db, read_only=True) as store:
        return await store.recordings()


def test_migrate_a_database_then_verify_and_replay(session: Session) -> None:
    db = session.tmp / "migrated.db"
    shutil.copy(fresh_import(session, "to-migrate"), db)
    with sqlite3.connect(db) as connection:
        stale = connection.execute("SELECT id, match_key FROM rec_interactions").fetchall()
        # Stale keys and canonical texts, as an older llmitm's rules left them (the text kept
        # in the row: the shared chunk it had is simply no longer named).
        connection.execute(
            "UPDATE rec_interactions SET match_key = 'k' || id, canonical = '{}', "
            "canonical_chunk = NULL"
        )
    verified = llmitm("rec", "verify", "--db", str(db))
    assert verified.returncode == 1 and "llmitm rec migrate" in verified.stdout
    migrated = llmitm("rec", "migrate", "--db", str(db))
    assert migrated.returncode == 0, migrated.stderr
    assert f"re-keyed {len(CALLS)} of {len(CALLS)}" in migrated.stdout
    assert llmitm("rec", "verify", "--db", str(db)).returncode == 0
    with sqlite3.connect(db) as connection:
        now = connection.execute("SELECT id, match_key FROM rec_interactions").fetchall()
    assert sorted(now) == sorted(stale)
    assert all(orjson.loads(i.canonical)["route"] for i in asyncio.run(stored_recordings(db)))
    # Under other rules the stored keys change (verify, under the default rules, says so), and
    # a replay still hits: it re-keys at load under its own options, as `rec why` does.
    other = llmitm("rec", "migrate", "--db", str(db), "--ignore", "messages")
    assert other.returncode == 0 and "ignoring messages" in other.stdout, other.stdout
    assert f"re-keyed 3 of {len(CALLS)}" in other.stdout  # the Responses call has no messages
    assert llmitm("rec", "verify", "--db", str(db)).returncode == 1
    with replaying(session, "replay-migrated", db) as proxy:
        hit = post(proxy, *CALLS[1])
        assert hit.headers.get("x-llmitm-replay") == "hit" and hit.content == session.bodies[1]


def test_run_replay_writes_junit(session: Session, tmp_path: Path) -> None:
    client = tmp_path / "client.py"
    client.write_text(REPLAY_CLIENT)
    config = tmp_path / "llmitm.toml"
    junit = tmp_path / "junit.xml"
    calls = [
        (path, body, {"x-llmitm-scope": scope, **headers})
        for scope, path, body, headers in CALLS[:3]
    ]
    calls.append(
        ("/v1/chat/completions", {"model": "gpt-pass", "messages": []}, {"x-llmitm-scope": "alpha"})
    )
    with tripwire() as wire:
        config.write_text(TWO_ENDPOINTS.format(chat=wire.url, responses=wire.url))
        started = time.monotonic()
        done = llmitm(
            "run", "--replay", str(session.folder), "--config", str(config), "--base-url",
            "--junit", str(junit), "--fail-on-unused",
            "--set", "llmitm_store=", "--set", f"confdir={tmp_path / 'conf'}",
            "--set", "termlog_verbosity=warn", "--set", "flow_detail=0",
            "--", sys.executable, str(client), orjson.dumps(calls).decode(),
        )  # fmt: skip
        assert time.monotonic() - started < 120
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAILED 1" in done.stdout
    root = ET.fromstring(junit.read_bytes())
    assert root.get("tests") == "2" and root.get("failures") == "2"
    cases = {case.get("name"): case for case in root.iter("testcase")}
    alpha, beta = cases["alpha"].find("failure"), cases["beta"].find("failure")
    assert alpha is not None and alpha.get("message") == "1 miss(es)"
    assert "miss (no-key): POST chat.completions model=gpt-pass" in (alpha.text or "")
    assert beta is not None and beta.get("message") == "1 unused recording(s)"
    properties = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert properties["hits"] == "3" and properties["loaded"] == str(len(CALLS))
