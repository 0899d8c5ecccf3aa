"""llmitm with its store in PostgreSQL, end to end: real ``llmitm run`` processes pointed at
a real server with ``--set llmitm_store=postgresql://…`` (the password in ``PGPASSWORD``),
the official SDK through them, then ``llmitm usage`` and ``llmitm rec`` against the same
database. A second proxy on the same database continues a Responses chain the first began,
and reads the same keys. A password in the URL is refused, in the configuration file and on
the command line, without being repeated."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest

from .processes import LLMITM, TWO_ENDPOINTS, fake_upstream, llmitm_proxy
from .test_record_replay import llmitm

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def sdk(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="sk-fleet", max_retries=0, timeout=30)


def test_a_proxy_on_postgresql_then_usage_and_rec_on_the_same_database(
    tmp_path: Path, pg_dsn: str
) -> None:
    with fake_upstream(tmp_path) as up:
        config = TWO_ENDPOINTS.format(chat=up.url, responses=up.url)
        extra = ["--set", f"llmitm_store={pg_dsn}"]
        with llmitm_proxy(
            tmp_path / "one", config=config, modes=[f"reverse:{up.url}"], extra=extra
        ) as proxy:
            client = sdk(proxy.base_url())
            chat = client.chat.completions.create(
                model="over-chat-1", messages=[{"role": "user", "content": "Say hello."}]
            )
            assert chat.choices[0].message.content
            # Responses over a chat-only endpoint: llmitm keeps the state, in PostgreSQL.
            first = client.responses.create(model="over-chat-1", input="Remember 7.", store=True)
            second = client.responses.create(
                model="over-chat-1", input="What number?", previous_response_id=first.id
            )
            assert client.responses.retrieve(first.id).id == first.id
            client.close()
            assert "Traceback" not in proxy.log_text()
        # Another proxy on the same database (the first is gone: its writes are there)
        # continues the chain and retrieves what the first stored.
        with llmitm_proxy(
            tmp_path / "two", config=config, modes=[f"reverse:{up.url}"], extra=extra
        ) as other:
            client = sdk(other.base_url())
            third = client.responses.create(
                model="over-chat-1", input="And again?", previous_response_id=second.id
            )
            assert third.status == "completed"
            assert client.responses.retrieve(second.id).output_text == second.output_text
            assert [i.type for i in client.responses.input_items.list(third.id).data] == ["message"]
            client.close()
            assert "Traceback" not in other.log_text()
        logs = proxy.log_text() + other.log_text()  # after both stopped: every write landed
        assert "dropped" not in logs and "failed" not in logs, logs

    usage = llmitm("usage", "--db", pg_dsn, "--json", "--by", "model")
    assert usage.returncode == 0, usage.stderr
    document = orjson.loads(usage.stdout)
    assert document["total"]["requests"] == 4  # one upstream call per SDK call
    assert "PGPASSWORD" not in usage.stdout

    listed = llmitm("rec", "ls", "--db", pg_dsn, "--json")
    assert listed.returncode == 0, listed.stderr
    recordings = orjson.loads(listed.stdout)
    # The four model calls, and the three state reads (retrieve, input items) answered
    # locally, recorded as well.
    assert sorted(r["method"] for r in recordings) == ["GET"] * 3 + ["POST"] * 4
    shown = llmitm("rec", "show", recordings[0]["id"][:12], "--db", pg_dsn, "--json")
    assert shown.returncode == 0, shown.stderr
    assert orjson.loads(shown.stdout)["id"] == recordings[0]["id"]
    folder = tmp_path / "exported"
    exported = llmitm("rec", "export", str(folder), "--db", pg_dsn)
    assert exported.returncode == 0, exported.stderr
    manifest = orjson.loads((folder / "manifest.json").read_bytes())
    assert len(manifest["interactions"]) == 7
    # The second proxy sent the endpoint the whole chain, read from what the first stored.
    texts = [p.read_text() for p in folder.rglob("*.json")]
    (last,) = [t for t in texts if "And again?" in t and "/v1/chat/completions" in t]
    assert "Remember 7." in last and "What number?" in last
    verified = llmitm("rec", "verify", "--db", pg_dsn)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def _refused(result: Any, secret: str) -> str:
    text = result.stdout + result.stderr
    assert result.returncode != 0, text
    assert secret not in text
    return text


def test_a_password_in_the_store_url_is_refused_without_being_shown(
    tmp_path: Path, pg_dsn: str
) -> None:
    with_password = pg_dsn.replace("@", ":pw-in-url@", 1)
    config = tmp_path / "llmitm.toml"
    config.write_text(f'[llmitm]\nstore = "{with_password}"\n')
    run = [str(LLMITM), "run", "--listen-port", "0", "--set", f"confdir={tmp_path / 'c'}"]
    from_file = subprocess.run(
        [*run, "--config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert "PGPASSWORD" in _refused(from_file, "pw-in-url")
    from_option = subprocess.run(
        [*run, "--set", f"llmitm_store={with_password}"], capture_output=True, text=True, timeout=60
    )
    assert "PGPASSWORD" in _refused(from_option, "pw-in-url")
    usage = llmitm("usage", "--db", with_password)  # a wrong password: refused, not shown
    _refused(usage, "pw-in-url")


def test_an_unreachable_database_never_holds_up_an_answer(tmp_path: Path) -> None:
    dead = f"postgresql://llmitm@127.0.0.1:{free_port()}/llmitm"  # nothing listens there
    with fake_upstream(tmp_path) as up:
        config = TWO_ENDPOINTS.format(chat=up.url, responses=up.url)
        with llmitm_proxy(
            tmp_path / "proxy",
            config=config,
            modes=[f"reverse:{up.url}"],
            extra=["--set", f"llmitm_store={dead}"],
            env={"PGPASSWORD": "unused"},
        ) as proxy:
            client = sdk(proxy.base_url())
            for _ in range(3):  # answers flow; their usage and recordings wait in the queue
                chat = client.chat.completions.create(
                    model="over-chat-1", messages=[{"role": "user", "content": "Say hello."}]
                )
                assert chat.choices[0].message.content
            # Stored Responses state needs the database: a clear, retryable error.
            with pytest.raises(openai.APIStatusError) as info:
                client.responses.create(model="over-chat-1", input="Remember 7.")
            assert info.value.status_code == 503
            assert "store is unreachable" in info.value.message
            ready = httpx.get(f"http://127.0.0.1:{proxy.port()}/_llmitm/readyz", timeout=10)
            assert ready.status_code == 200  # still serving; the check says why it waits
            assert "database unreachable" in ready.json()["checks"]["store"]["detail"]
            client.close()
        log = proxy.log_text()
    assert "the database is unreachable" in log and "starting without it" in log
    # Stopped, it gave up what it could not write, and said how much (bounded, not a hang).
    assert "write(s) dropped and" in log and "failed" in log
    assert "unused" not in log
    # A command does not wait for it: one line, exit 2.
    for command in (("usage", "--db", dead), ("rec", "ls", "--db", dead)):
        done = llmitm(*command, env={**os.environ, "PGPASSWORD": "unused"})
        assert done.returncode == 2 and "unreachable" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and "unused" not in done.stderr
