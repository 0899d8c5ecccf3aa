"""The egress policy and the recording filter with real processes: ``llmitm run -- COMMAND``
around a real openai-agents run at its default base URL and an httpx client posting an OTLP
export and a plugin look-up through ``HTTPS_PROXY``, as Codex does.

The "real host" of the telemetry is a loopback HTTP server this test owns, so what reaches it
is counted: under ``llmitm_egress=local`` nothing does, and each request gets llmitm's local
answer; under the default ``pass`` both arrive (the same client, so the local run's zero is not
an accident of the client). Either way only the LLM calls are recorded, unless
``llmitm_record_all`` says otherwise.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import orjson
import pytest
from wsproto.connection import Connection as WSConnection
from wsproto.connection import ConnectionType
from wsproto.events import TextMessage as Message

from llmitm.store.folder import read_folder

from .conftest import CODEX_UNATTENDED, codex_env
from .processes import LLMITM, ROOT, Upstream, fake_upstream, llmitm_proxy

pytestmark = pytest.mark.slow

CONFIG = """
[endpoints.local]
kind = "compatible"
base_url = "{url}/v1"
apis = ["chat"]

[[routes]]
hosts = ["api.openai.com"]
endpoints = ["local"]
"""

# The app: an agent at OpenAI's default base URL (llmitm routes its Responses calls to the
# chat-only fake), whose trace exporter uploads to api.openai.com/v1/traces/ingest when
# flushed; then Codex's two kinds of side traffic, sent to the telemetry host given.
AGENT = """
import logging, os, sys
out = open(sys.argv[1], "w")
from agents import Agent, Runner
from agents.tracing import get_trace_provider

seen = []
class Keep(logging.Handler):
    def emit(self, record):
        seen.append(record.getMessage())
log = logging.getLogger("openai.agents")
log.setLevel(logging.DEBUG)
log.addHandler(Keep())
agent = Agent(name="helper", instructions="Be brief.", model="gpt-4o")
print("OUTPUT:", Runner.run_sync(agent, "Say hello").final_output, file=out)
get_trace_provider().force_flush()
exported = any(m.startswith("Exported") for m in seen)
problems = [m for m in seen if "Tracing" in m]
print("TRACES:", "exported" if exported else "not exported", problems, file=out)
"""
SIDE_TRAFFIC = """
import os, sys
import httpx2 as httpx
host, out = sys.argv[1], open(sys.argv[2], "w")
with httpx.Client(proxy=os.environ["HTTPS_PROXY"], timeout=10) as client:
    otlp = client.post(host + "/otlp/v1/metrics", content=b"\\x0a\\x00" * 64,
                       headers={"content-type": "application/x-protobuf"})
    egress = otlp.headers.get("x-llmitm-egress")
    print("OTLP:", otlp.status_code, egress, len(otlp.content), file=out)
    plugins = client.get(host + "/repos/openai/plugins")
    code = plugins.json().get("error", {}).get("code") if plugins.status_code >= 400 else None
    print("PLUGINS:", plugins.status_code, code, file=out)
"""


class Sink(BaseHTTPRequestHandler):
    """The telemetry and plugin hosts: answers 200 and remembers what reached it."""

    seen: ClassVar[list[str]] = []

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        self.rfile.read(length)
        Sink.seen.append(f"{self.command} {self.path}")
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    do_GET = do_POST = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def sink() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    with fake_upstream(tmp_path_factory.mktemp("egress-upstream"), "chat") as fake:
        yield fake


class Run:
    """One ``llmitm run -- python app.py``: what the app wrote, and the proxy's output."""

    def __init__(self, result: subprocess.CompletedProcess[str], written: Path) -> None:
        self.status = result.returncode
        self.proxy = result.stdout + result.stderr
        self.app = written.read_text() if written.is_file() else ""


def run_app(
    tmp: Path, upstream: Upstream, script: str, *args: str, sets: tuple[str, ...] = ()
) -> Run:
    tmp.mkdir(parents=True, exist_ok=True)
    config = tmp / "llmitm.toml"
    config.write_text(CONFIG.format(url=upstream.url))
    app = tmp / "app.py"
    app.write_text(script)
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_BASE_URL", "HTTPS_PROXY")}
    env["OPENAI_API_KEY"] = "sk-unmodified-app"
    extra = [item for name in sets for item in ("--set", name)]
    written = tmp / "app.out"
    result = subprocess.run(
        [str(LLMITM), "run", "--config", str(config), "--set", f"confdir={tmp / 'confdir'}",
         "--set", f"llmitm_store={tmp / 'llmitm.db'}", *extra,
         "--", sys.executable, str(app), *args, str(written)],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip
    return Run(result, written)


def recorded(tmp: Path) -> list[str]:
    """The client requests recorded in the run's store, as ``METHOD URL``."""
    with sqlite3.connect(tmp / "llmitm.db") as db:
        rows = db.execute("SELECT method, url FROM rec_messages WHERE leg = 'client_req'")
        return sorted(f"{method} {url}" for method, url in rows)


def test_local_answers_an_agents_trace_upload_and_codex_side_traffic_here(
    tmp_path: Path, upstream: Upstream, sink: str
) -> None:
    Sink.seen.clear()
    agent = run_app(tmp_path / "agent", upstream, AGENT, sets=("llmitm_egress=local",))
    assert agent.status == 0, agent.app + agent.proxy
    assert "OUTPUT: Hello from the fake upstream." in agent.app
    # Answered with a success, so the exporter reports its items sent and logs no failure.
    assert "TRACES: exported []" in agent.app, agent.app + agent.proxy
    assert "egress: local" in agent.proxy  # the first screen says which policy is on
    assert "POST api.openai.com/v1/traces/ingest — trace upload dropped" in agent.proxy
    assert recorded(tmp_path / "agent") == ["POST https://api.openai.com/v1/responses"]

    side = run_app(tmp_path / "side", upstream, SIDE_TRAFFIC, sink, sets=("llmitm_egress=local",))
    assert side.status == 0, side.app + side.proxy
    assert "OTLP: 200 local 0" in side.app
    assert "PLUGINS: 403 egress_refused" in side.app
    assert Sink.seen == []  # nothing left the proxy
    assert recorded(tmp_path / "side") == []


def test_pass_sends_side_traffic_on_and_records_only_llm_calls(
    tmp_path: Path, upstream: Upstream, sink: str
) -> None:
    Sink.seen.clear()
    side = run_app(tmp_path / "pass", upstream, SIDE_TRAFFIC, sink)
    assert side.status == 0, side.app + side.proxy
    assert "OTLP: 200 None 2" in side.app and "PLUGINS: 200 None" in side.app
    assert sorted(Sink.seen) == ["GET /repos/openai/plugins", "POST /otlp/v1/metrics"]
    assert "egress: pass" in side.proxy
    assert recorded(tmp_path / "pass") == []  # proxied, not recorded

    every = run_app(
        tmp_path / "all", upstream, SIDE_TRAFFIC, sink, sets=("llmitm_record_all=true",)
    )
    assert every.status == 0, every.app + every.proxy
    assert recorded(tmp_path / "all") == [
        f"GET {sink}/repos/openai/plugins",
        f"POST {sink}/otlp/v1/metrics",
    ]


def exchange(port: int, *messages: bytes) -> bytes:
    """Send each message to the proxy in turn on one connection (waiting for an answer to
    each but the last) and read until it closes: what a client sees, bounded in time."""
    received = b""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
        for index, message in enumerate(messages):
            client.sendall(message)
            if index < len(messages) - 1:
                while b"\r\n\r\n" not in received:
                    chunk = client.recv(4096)
                    if not chunk:
                        return received
                    received += chunk
        try:
            while chunk := client.recv(4096):
                received += chunk
        except TimeoutError:
            pass
    return received


@pytest.mark.parametrize("policy", ["local", "pass"])
def test_tunnels_and_websockets_nothing_routes(
    tmp_path: Path, upstream: Upstream, sink: str, policy: str
) -> None:
    Sink.seen.clear()
    target = sink.removeprefix("http://")
    # The tunnel to the sink is passed through unseen (ignore_hosts), as a user may set it.
    sets = [f"llmitm_egress={policy}", f"ignore_hosts=^{target.replace('.', chr(92) + '.')}$"]
    with llmitm_proxy(
        tmp_path, config=CONFIG.format(url=upstream.url), modes=("regular",),
        extra=[item for value in sets for item in ("--set", value)],
    ) as proxy:  # fmt: skip
        port = proxy.port("regular")
        connect = f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode()
        inner = b"GET /through-the-tunnel HTTP/1.1\r\nHost: sink\r\nConnection: close\r\n\r\n"
        tunnelled = exchange(port, connect, inner)
        upgrade = (
            b"GET http://api.openai.com/v1/responses HTTP/1.1\r\nHost: api.openai.com\r\n"
            b"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
        )
        events = socket_turn(port, upgrade) if policy == "local" else []
    assert tunnelled.startswith(b"HTTP/1.1 200")  # the CONNECT itself is answered
    if policy == "pass":
        assert Sink.seen == ["GET /through-the-tunnel"] and b"\r\n\r\n{}" in tunnelled
        return
    assert Sink.seen == [] and b"{}" not in tunnelled  # closed before anything was dialled
    # The Responses socket is llmitm's own: served, its call routed to the local endpoint.
    assert events[0]["type"] == "response.created", events
    assert events[-1]["type"] == "response.completed", events


def socket_turn(port: int, upgrade: bytes) -> list[dict]:
    """Open the socket through the proxy, send one response.create and read its events."""
    client = WSConnection(ConnectionType.CLIENT)
    events: list[dict] = []
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        raw.sendall(upgrade)
        head = b""
        while b"\r\n\r\n" not in head:
            head += raw.recv(4096)
        assert head.startswith(b"HTTP/1.1 101"), head
        create = {"type": "response.create", "model": "gpt-x", "input": "hi", "store": False}
        raw.sendall(client.send(Message(data=orjson.dumps(create).decode())))
        while not events or events[-1]["type"] not in ("response.completed", "error"):
            data = raw.recv(65536)
            assert data, events
            client.receive_data(data)
            events += [orjson.loads(e.data) for e in client.events() if isinstance(e, Message)]
    return events


def test_a_replayed_session_with_no_routes_stays_whole_under_local(tmp_path: Path) -> None:
    """CI with everything local: the committed recordings served with no configuration (no
    route matches anything), so every answer comes from the recorder, never refused."""
    out = tmp_path / "bodies.json"
    done = subprocess.run(
        [str(LLMITM), "run", "--replay", str(ROOT / "recordings"), "--base-url",
         "--fail-on-unused", "--set", "llmitm_store=", "--set", f"confdir={tmp_path / 'c'}",
         "--set", "llmitm_replay_from=client", "--set", "llmitm_egress=local",
         "--", sys.executable, str(ROOT / "scripts" / "example_client.py"), "--out", str(out)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 hit(s), 0 miss(es), 0 unused" in done.stderr
    assert "egress: local" in done.stdout + done.stderr
    replayed = sorted(orjson.loads(out.read_bytes()))
    assert replayed == sorted(
        i.legs["client_resp"].body().decode() for i in read_folder(ROOT / "recordings")
    )


def test_codex_in_its_default_configuration_keeps_its_side_traffic_here(
    tmp_path: Path, upstream: Upstream, codex_bin: Path
) -> None:
    """Codex 0.171 with a fresh CODEX_HOME and only OPENAI_API_KEY, under ``llmitm run`` with
    ``egress = "local"``: its answer comes from the routed model, its plugin look-ups and
    OpenTelemetry export are answered here, and its Responses WebSocket is llmitm's own (no
    failed socket, no fallback to HTTPS)."""
    config = tmp_path / "llmitm.toml"
    # The fake would call Codex's exec tool; its "text" scenario answers plainly.
    routed = CONFIG.format(url=upstream.url) + 'model = "text"\n'
    config.write_text('[llmitm]\negress = "local"\n' + routed)
    (tmp_path / "work").mkdir()
    (tmp_path / "codex-home").mkdir()
    env = codex_env(tmp_path / "codex-home", {"OPENAI_API_KEY": "sk-test"})
    env.pop("HTTPS_PROXY", None)
    done = subprocess.run(
        [str(LLMITM), "run", "--config", str(config), "--set", f"confdir={tmp_path / 'c'}",
         "--set", f"llmitm_store={tmp_path / 'llmitm.db'}",
         "--", str(codex_bin), "exec", "--skip-git-repo-check", *CODEX_UNATTENDED,
         "--color", "never", "Say hello."],
        cwd=tmp_path / "work", env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "Hello from the fake upstream." in done.stdout
    assert "egress: local" in output
    assert "GET api.github.com/repos/openai/plugins — refused" in output
    assert "POST ab.chatgpt.com/otlp/v1/metrics — telemetry dropped" in output
    assert "failed to connect to Responses WebSocket" not in output
    assert "Falling back" not in output
    assert "POST api.openai.com/v1/responses —" not in output  # routed, never refused
    calls = recorded(tmp_path)
    assert "POST https://api.openai.com/v1/responses" in calls
    assert all(call.endswith("api.openai.com/v1/responses") for call in calls), calls
