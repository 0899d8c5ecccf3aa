"""Calls a real llmitm refuses itself (a browser origin, a body that is not JSON, a missing or
unknown client key) are recorded like every other answered call: ``llmitm rec ls`` lists them
with their 403/415/401, and neither the store nor an export holds the key that was presented.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx2 as httpx
import orjson
import pytest

from .processes import LLMITM, fake_upstream, llmitm_proxy

pytestmark = pytest.mark.slow

ALICE_ENV = "LLMITM_E2E_REFUSED_ALICE"
ALICE = "ck-alice-refusal-secret"
WRONG = "ck-wrong-refusal-secret"
CONFIG = f"""
[endpoints.fake]
kind = "compatible"
base_url = "{{fake}}/v1"
apis = ["chat", "responses"]

[[routes]]
models = ["m-*"]
endpoints = ["fake"]

[client_keys.alice]
key_env = "{ALICE_ENV}"
"""


def rec(*args: str) -> str:
    done = subprocess.run(
        [str(LLMITM), "rec", *args], capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout


def test_refused_calls_are_recorded_without_the_presented_key(tmp_path: Path) -> None:
    with (
        fake_upstream(tmp_path) as fake,
        llmitm_proxy(
            tmp_path,
            config=CONFIG.format(fake=fake.url),
            modes=[f"reverse:{fake.url}"],
            env={ALICE_ENV: ALICE},
        ) as proxy,
    ):
        url = f"http://127.0.0.1:{proxy.port()}/v1/chat/completions"

        def call(model: str, headers: dict[str, str]) -> int:
            body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
            return httpx.post(url, content=orjson.dumps(body), headers=headers).status_code

        json_type = {"content-type": "application/json"}
        alice = {"authorization": f"Bearer {ALICE}"}
        cases = {
            "m-origin": (403, {**alice, **json_type, "origin": "https://evil.example"}),
            "m-plain": (415, {**alice, "content-type": "text/plain"}),
            "m-nokey": (401, json_type),
            "m-wrong": (401, {**json_type, "x-api-key": WRONG}),
            "m-served": (200, {**alice, **json_type}),
        }
        for model, (status, headers) in cases.items():
            assert call(model, headers) == status, model
    # The proxy has stopped: everything it recorded is in the store.
    db = str(tmp_path / "llmitm.db")
    listed = orjson.loads(rec("ls", "--db", db, "--limit", "0", "--json"))
    recorded = {row["model"]: row["status"] for row in listed}
    assert recorded == {model: status for model, (status, _) in cases.items()}, listed
    export = tmp_path / "export"
    rec("export", "--db", db, str(export))
    stored = [tmp_path / "llmitm.db", *(p for p in export.rglob("*") if p.is_file())]
    for path in stored:
        data = path.read_bytes()
        assert ALICE.encode() not in data and WRONG.encode() not in data, path
