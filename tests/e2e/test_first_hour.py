"""What a newcomer meets in the first minutes, with real processes: the first screen of
``llmitm run`` (and of ``mitmdump -s addon/llmitm_addon.py``) is enough to point the openai
SDK at the proxy; around a wrapped command llmitm prints nothing on the command's stdout and
mitmproxy's connection log only with ``-v``; curl works on a machine that sets
``CURL_CA_BUNDLE``. The upstream is the local fake; no network is used."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .first_screen import read_first_screen, screen_field, sdk_environment
from .processes import LLMITM, ROOT, Upstream, _stop, fake_upstream

pytestmark = pytest.mark.slow

CONFIG = """
[endpoints.local]
kind = "compatible"
base_url = "{url}/v1"
apis = ["chat"]

[[routes]]
name = "everything"
endpoints = ["local"]
"""

# An app that knows nothing of llmitm: the SDK's default base URL, its environment only.
SDK_CLIENT = """
import openai
client = openai.OpenAI(api_key="sk-newcomer", max_retries=0, timeout=30)
completion = client.chat.completions.create(
    model="gpt-5", messages=[{"role": "user", "content": "hi"}]
)
print(completion.choices[0].message.content)
"""
SYSTEM_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    with fake_upstream(tmp_path_factory.mktemp("first-hour-upstream"), "chat") as fake:
        yield fake


@pytest.fixture
def config(tmp_path: Path, upstream: Upstream) -> Path:
    path = tmp_path / "llmitm.toml"
    path.write_text(CONFIG.format(url=upstream.url))
    return path


def private(tmp_path: Path) -> list[str]:
    """mitmdump options that keep a test's CA and store out of the user's home."""
    return ["--set", f"confdir={tmp_path / 'confdir'}", "--set", f"llmitm_store={tmp_path / 'db'}"]


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without proxy, base-URL or CA variables a developer may have set."""
    dropped = ("PROXY", "OPENAI_BASE_URL", "SSL_CERT", "CA_BUNDLE", "CA_CERT")
    env = {k: v for k, v in os.environ.items() if not any(d in k.upper() for d in dropped)}
    return {**env, **extra}


def ask_with(environment: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SDK_CLIENT],
        env=clean_env(**environment),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_first_screen_alone_points_the_sdk_at_the_proxy(tmp_path: Path, config: Path) -> None:
    proxy = subprocess.Popen(
        [str(LLMITM), "run", "--config", str(config), "--listen-port", "0", *private(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env=clean_env(),
    )
    try:
        lines = read_first_screen(proxy)
        assert (
            screen_field(lines, "config") == f"{config}: 1 endpoint (local), 1 route (everything)"
        )
        assert screen_field(lines, "store") == f"{tmp_path / 'db'}; recording every call"
        assert screen_field(lines, "CA") == str(tmp_path / "confdir" / "mitmproxy-ca-cert.pem")
        answer = ask_with(sdk_environment(lines))
        assert answer.returncode == 0, answer.stderr
        assert answer.stdout == "Hello from the fake upstream.\n"
    finally:
        _stop(proxy)
    rest = proxy.stdout.read() if proxy.stdout else ""
    # Quiet by default: none of mitmproxy's connection or flow lines.
    assert "client connect" not in rest
    assert "<< 200" not in rest


def test_a_reverse_listener_gives_the_base_url_line(tmp_path: Path, config: Path) -> None:
    proxy = subprocess.Popen(
        [str(LLMITM), "run", "--config", str(config), "--mode", "reverse:https://api.openai.com",
         "--listen-port", "0", *private(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env=clean_env(),
    )  # fmt: skip
    try:
        lines = read_first_screen(proxy)
        environment = sdk_environment(lines)
        assert list(environment) == ["OPENAI_BASE_URL"]
        answer = ask_with(environment)
        assert answer.returncode == 0, answer.stderr
        assert answer.stdout == "Hello from the fake upstream.\n"
    finally:
        _stop(proxy)


def test_mitmdump_with_the_addon_script_shows_the_first_screen(tmp_path: Path) -> None:
    mitmdump = Path(sys.executable).with_name("mitmdump")
    proxy = subprocess.Popen(
        [str(mitmdump), "-s", str(ROOT / "addon" / "llmitm_addon.py"), "--listen-host",
         "127.0.0.1", "--listen-port", "0", *private(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env=clean_env(),
    )  # fmt: skip
    try:
        lines = read_first_screen(proxy)
    finally:
        _stop(proxy)
    assert any(line.startswith("llmitm ") and "(HTTP(S) proxy)" in line for line in lines)
    assert "HTTPS_PROXY=http://127.0.0.1:" in screen_field(lines, "sdk")


def wrapped(
    tmp_path: Path, *argv: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``llmitm run ARGV`` (options, ``--``, a command) to its end."""
    return subprocess.run(
        [str(LLMITM), "run", *private(tmp_path), *argv],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=90,
        check=False,
        env=env or clean_env(),
    )


def test_a_wrapped_commands_stdout_is_exactly_its_own(tmp_path: Path) -> None:
    result = wrapped(tmp_path, "--", sys.executable, "-c", "print('hi')")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "hi\n"
    assert "llmitm 0.1.0 listening at 127.0.0.1:" in result.stderr
    assert "running now, with the proxy and CA variables set" in result.stderr


# The command reaches the fake upstream through the proxy's own address (loopback is in
# NO_PROXY for ordinary clients, so curl is told the proxy explicitly).
CURL_THROUGH_PROXY = 'curl -sS --noproxy "" -x "$HTTP_PROXY" -o /dev/null {url}/v1/models'


@pytest.mark.parametrize("verbose", [False, True])
def test_mitmproxys_connection_log_only_with_verbose(
    tmp_path: Path, upstream: Upstream, verbose: bool
) -> None:
    command = CURL_THROUGH_PROXY.format(url=upstream.url)
    result = wrapped(tmp_path, *(["-v"] if verbose else []), "--", "sh", "-c", command)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert ("client connect" in result.stderr) is verbose, result.stderr
    assert ("GET http://127.0.0.1" in result.stderr) is verbose, result.stderr


@pytest.mark.skipif(not SYSTEM_BUNDLE.is_file(), reason="needs Debian's CA bundle")
def test_curl_trusts_the_proxy_when_curl_ca_bundle_is_already_set(
    tmp_path: Path, config: Path
) -> None:
    # A machine that points CURL_CA_BUNDLE at the system bundle: curl reads only that file,
    # so the command's copy must hold the system's CAs and mitmproxy's.
    env = clean_env(CURL_CA_BUNDLE=str(SYSTEM_BUNDLE))
    result = wrapped(
        tmp_path,
        "--config",
        str(config),
        "--",
        "curl", "-sS", "--fail-with-body", "https://api.openai.com/v1/chat/completions",
        "-H", "content-type: application/json", "-H", "authorization: Bearer sk-curl",
        "-d", '{"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}]}',
        env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert '"content":"Hello from the fake upstream."' in result.stdout
