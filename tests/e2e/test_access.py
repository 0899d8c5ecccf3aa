"""Who may use a real llmitm: a "browser" (httpx sending what a cross-site page can send
without a CORS preflight) is refused before any endpoint key is injected; llmitm's status
answers only on its own address; client keys gate, and never leave, the proxy; and a
listener beyond loopback without client keys stops start-up in one line."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import httpx2 as httpx
import openai
import orjson
import pytest

from .conftest import codex_env
from .processes import LLMITM, fake_upstream, llmitm_proxy

pytestmark = pytest.mark.slow

ENDPOINT_ENV = "LLMITM_E2E_ACCESS_ENDPOINT_KEY"
ALICE_ENV = "LLMITM_E2E_ACCESS_ALICE"
BOB_ENV = "LLMITM_E2E_ACCESS_BOB"
ENV = {ENDPOINT_ENV: "sk-endpoint", ALICE_ENV: "ck-alice", BOB_ENV: "ck-bob"}
CONFIG = f"""
[llmitm]
allowed_origins = ["http://localhost:*"]

[endpoints.keyed]
kind = "compatible"
base_url = "{{fake}}/v1"
apis = ["chat", "responses"]
api_key_env = "{ENDPOINT_ENV}"

[endpoints.keyless]
kind = "compatible"
base_url = "{{fake}}/v1"
apis = ["chat", "responses"]

[[routes]]
name = "dear"
models = ["dear-*"]
endpoints = ["keyed"]

[[routes]]
name = "cheap"
models = ["cheap-*"]
endpoints = ["keyless"]

[client_keys.alice]
key_env = "{ALICE_ENV}"

[client_keys.bob]
key_env = "{BOB_ENV}"
routes = ["cheap"]
"""
BODY = orjson.dumps({"model": "dear-1", "messages": [{"role": "user", "content": "hi"}]})


def seen(fake_url: str) -> list[dict]:
    return httpx.get(f"{fake_url}/_requests").json()


def test_browsers_client_keys_and_the_status_on_a_real_proxy(tmp_path: Path) -> None:
    with (
        fake_upstream(tmp_path) as fake,
        llmitm_proxy(
            tmp_path,
            config=CONFIG.format(fake=fake.url),
            modes=[f"reverse:{fake.url}"],
            env=ENV,
        ) as proxy,
    ):
        base = f"http://127.0.0.1:{proxy.port()}"
        alice = {"authorization": "Bearer ck-alice"}
        # What a cross-site page can send without a preflight: text/plain, with its Origin.
        page = httpx.post(
            f"{base}/v1/chat/completions",
            content=BODY,
            headers={**alice, "content-type": "text/plain", "origin": "https://evil.example"},
        )
        assert page.status_code == 403 and page.json()["error"]["code"] == "origin_not_allowed"
        no_origin = httpx.post(
            f"{base}/v1/chat/completions",
            content=BODY,
            headers={**alice, "content-type": "text/plain", "sec-fetch-site": "cross-site"},
        )
        assert no_origin.status_code == 403
        plain = httpx.post(
            f"{base}/v1/chat/completions",
            content=BODY,
            headers={**alice, "content-type": "text/plain"},
        )
        assert plain.status_code == 415 and plain.json()["error"]["param"] == "content-type"
        allowed = httpx.post(
            f"{base}/v1/chat/completions",
            content=BODY,
            headers={**alice, "content-type": "application/json", "origin": "http://localhost:5"},
        )
        assert allowed.status_code == 200, allowed.text
        assert len(seen(fake.url)) == 1  # nothing refused reached the upstream

        # The SDK in its default configuration, with a client key as its API key.
        sdk = openai.OpenAI(base_url=proxy.base_url(), api_key="ck-alice", max_retries=0)
        with sdk.responses.stream(model="dear-2", input="Say hello") as stream:
            assert stream.get_final_response().output_text
        bob = openai.OpenAI(base_url=proxy.base_url(), api_key="ck-bob", max_retries=0)
        answer = bob.chat.completions.create(
            model="cheap-1", messages=[{"role": "user", "content": "hi"}]
        )
        assert answer.choices
        with pytest.raises(openai.PermissionDeniedError) as refused:
            bob.chat.completions.create(
                model="dear-3", messages=[{"role": "user", "content": "hi"}]
            )
        assert refused.value.code == "route_not_allowed"
        for key in ("sk-endpoint", "sk-someone-else"):  # an upstream key is no client key
            stranger = openai.OpenAI(base_url=proxy.base_url(), api_key=key, max_retries=0)
            with pytest.raises(openai.AuthenticationError) as unauthorised:
                stranger.responses.create(model="dear-4", input="hi")
            assert unauthorised.value.code == "invalid_api_key"
        requests = seen(fake.url)
        assert len(requests) == 3
        sent = [{k.lower(): v for k, v in r["headers"].items()} for r in requests]
        assert [h.get("authorization") for h in sent] == [
            "Bearer sk-endpoint",
            "Bearer sk-endpoint",
            None,  # the keyless endpoint: the client key does not go there either
        ]
        assert not any("ck-" in orjson.dumps(h).decode() for h in sent)

        # llmitm's status: on its own address, with a client key.
        status = httpx.get(f"{base}/_llmitm/status", headers=alice)
        assert status.status_code == 200 and "endpoints" in status.json()
        assert httpx.get(f"{base}/_llmitm/status").status_code == 401


def test_the_status_is_not_answered_as_another_host_through_the_regular_proxy(
    tmp_path: Path,
) -> None:
    with (
        fake_upstream(tmp_path) as fake,
        llmitm_proxy(
            tmp_path, config=CONFIG.format(fake=fake.url), modes=["regular"], env=ENV
        ) as proxy,
    ):
        alice = {"authorization": "Bearer ck-alice"}
        through = httpx.Client(proxy=f"http://127.0.0.1:{proxy.port('regular')}", timeout=10)
        with through:
            own = through.get(
                f"http://127.0.0.1:{proxy.port('regular')}/_llmitm/status", headers=alice
            )
            assert own.status_code == 200 and "endpoints" in own.json()
            other = through.get(f"{fake.url}/_llmitm/status", headers=alice)
        # The fake's own answer (it knows no such path), not llmitm's status.
        assert other.status_code == 404 and "endpoints" not in other.text, other.text


def test_a_public_listener_without_client_keys_stops_start_up(tmp_path: Path) -> None:
    argv = [
        str(LLMITM), "run", "--mode", "reverse:http://127.0.0.1:9",
        "--listen-host", "0.0.0.0", "--listen-port", "0",
        "--set", f"confdir={tmp_path / 'confdir'}", "--set", "llmitm_store=",
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=dict(os.environ))
    output = (done.stdout + done.stderr).strip()
    assert done.returncode == 1, output
    assert "refusing to listen on 0.0.0.0 without client keys" in output
    assert "Traceback" not in output and "listening" not in output, output
    assert len([line for line in output.splitlines() if "llmitm" in line]) == 1, output


CODEX_CONFIG = f"""
[endpoints.local]
kind = "compatible"
base_url = "{{url}}/v1"
apis = ["chat"]
api_key_env = "{ENDPOINT_ENV}"

[[routes]]
models = ["*"]
hosts = ["api.openai.com"]
endpoints = ["local"]

[client_keys.codex]
key_env = "{ALICE_ENV}"
"""


def codex_with_key(codex_bin: Path, tmp: Path, config: str, key: str) -> tuple[int, str]:
    """``llmitm run --config … -- codex exec`` with Codex in its default configuration (a
    fresh home, no config.toml) holding ``key`` as ``codex exec``'s API key variable."""
    (tmp / "work").mkdir(parents=True, exist_ok=True)
    (tmp / "llmitm.toml").write_text(config)
    (tmp / "home").mkdir(exist_ok=True)
    env = codex_env(tmp / "home", {"CODEX_API_KEY": key, ENDPOINT_ENV: "sk-endpoint"})
    env[ALICE_ENV] = "ck-codex"
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY"):
        env.pop(name, None)  # llmitm run sets the proxy; nothing else may
    argv = [
        str(LLMITM), "run", "--config", str(tmp / "llmitm.toml"),
        "--set", f"confdir={tmp / 'confdir'}", "--set", f"llmitm_store={tmp / 'llmitm.db'}",
        "-q", "--", str(codex_bin), "exec", "--skip-git-repo-check", "Say hello.",
    ]  # fmt: skip
    done = subprocess.run(
        argv, cwd=tmp / "work", env=env, stdin=subprocess.DEVNULL, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    return done.returncode, done.stdout + done.stderr


def test_default_codex_presents_its_api_key_as_a_client_key(
    codex_bin: Path, tmp_path: Path
) -> None:
    """``codex exec`` sends its key (``CODEX_API_KEY``) as ``Authorization: Bearer``:
    configured as a client key, its calls (over the WebSocket llmitm serves, each sent back
    through the proxy with the handshake's credentials) are served, and the upstream sees
    the endpoint's key, never Codex's."""
    with fake_upstream(tmp_path / "fake", "chat") as fake:
        config = CODEX_CONFIG.format(url=fake.url)
        status, output = codex_with_key(codex_bin, tmp_path / "ok", config, "ck-codex")
        sent = seen(fake.url)
        assert status == 0, output[-4000:]
        assert sent and "Falling back" not in output, output[-4000:]
        for request in sent:
            headers = {k.lower(): v for k, v in request["headers"].items()}
            assert headers["authorization"] == "Bearer sk-endpoint"
            assert "ck-codex" not in orjson.dumps(headers).decode()
