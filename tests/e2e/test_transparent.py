"""``llmitm run --transparent -- COMMAND``: clients that ignore proxy variables, for real.

Each command runs in the network namespace ``llmitm run`` makes (root, iproute2 and nftables
needed: skipped with the reason where the machine refuses). The clients use their default base
URL ``https://api.openai.com`` and no proxy variable: curl with ``--noproxy '*'`` and the CA
variables unset (so only the namespace's bound system bundle can make it trust llmitm), and the
openai SDK on an httpx client with ``trust_env=False``. The namespace resolves the name, llmitm
intercepts TLS and routes ``hosts = ["api.openai.com"]`` to a chat-only fake upstream on the
loopback; no network is used. Afterwards no link or nftables table of the run may remain, also
when the command or llmitm is killed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import orjson
import pytest

from llmitm.transparent.namespace import prerequisites_problem

from .conftest import codex_env, find_codex_bin
from .processes import LLMITM, Upstream, fake_upstream

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

CURL = """
unset SSL_CERT_FILE CURL_CA_BUNDLE REQUESTS_CA_BUNDLE SSL_CERT_DIR
curl --noproxy '*' -sS --fail-with-body --max-time 20 https://api.openai.com/v1/chat/completions \
  -H 'authorization: Bearer sk-transparent' -H 'content-type: application/json' \
  -d '{"model": "gpt-5", "messages": [{"role": "user", "content": "through the namespace"}]}'
"""

SDK_CLIENT = """
import os, httpx2 as httpx, openai
assert not any(k.lower().endswith("_proxy") for k in os.environ), "no proxy variables inside"
http = httpx.Client(trust_env=False, verify="/etc/ssl/certs/ca-certificates.crt")
client = openai.OpenAI(api_key="sk-transparent", max_retries=0, http_client=http)
with client.responses.stream(model="gpt-5", input="Say hello") as stream:
    for _ in stream:
        pass
    final = stream.get_final_response()
print("OUTPUT:", final.output_text)
"""


def _namespace_problem() -> str | None:
    problem = prerequisites_problem()
    if problem and "command" in problem:
        # A tool the project installs, not a refusal of the machine: like the rest of e2e.
        pytest.fail(f"{problem}: run make netns-tools")
    if problem:
        return problem
    probe = subprocess.run(
        ["unshare", "--net", "--mount", "true"], capture_output=True, text=True, timeout=10
    )
    if probe.returncode:
        return f"the kernel refuses new namespaces: {probe.stderr.strip()}"
    return None


@pytest.fixture(scope="module")
def namespaces() -> None:
    problem = _namespace_problem()
    if problem:
        pytest.skip(problem)


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory, namespaces: None) -> Iterator[Upstream]:
    with fake_upstream(tmp_path_factory.mktemp("transparent-upstream"), "chat") as fake:
        yield fake


def llmitm_argv(tmp: Path, upstream: Upstream | None, *extra: str) -> list[str]:
    argv = [str(LLMITM), "run", "--set", f"confdir={tmp / 'confdir'}", "--set", "llmitm_store="]
    if upstream is not None:
        config = tmp / "llmitm.toml"
        config.write_text(CONFIG.format(url=upstream.url))
        argv += ["--config", str(config)]
    return [*argv, "-q", *extra]


def run_transparent(
    tmp: Path, upstream: Upstream | None, *command: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*llmitm_argv(tmp, upstream, "--transparent"), "--", *command],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def upstream_requests(upstream: Upstream) -> list[dict]:
    return orjson.loads(httpx.get(f"{upstream.url}/_requests").content)


def left_behind(token: str) -> list[str]:
    """What of run ``token`` still exists on the host: its link, its table."""
    assert len(token) == 8, token
    found = []
    link = subprocess.run(["ip", "link", "show", f"llm{token}o"], capture_output=True, timeout=10)
    if link.returncode == 0:
        found.append(f"link llm{token}o")
    table = subprocess.run(
        ["nft", "list", "table", "ip", f"llmitm_{token}"], capture_output=True, timeout=10
    )
    if table.returncode == 0:
        found.append(f"table llmitm_{token}")
    return found


PRINT_TOKEN = 'echo "token=$LLMITM_NAMESPACE"; '


def token_of(output: str) -> str:
    line = next(line for line in output.splitlines() if line.startswith("token="))
    return line.removeprefix("token=")


def test_curl_ignoring_proxy_variables_is_intercepted_and_routed(
    tmp_path: Path, upstream: Upstream
) -> None:
    before = len(upstream_requests(upstream))
    result = run_transparent(tmp_path, upstream, "sh", "-c", PRINT_TOKEN + CURL)
    assert result.returncode == 0, result.stdout + result.stderr
    answer = orjson.loads(result.stdout.splitlines()[-1])
    assert answer["choices"][0]["message"]["content"] == "Hello from the fake upstream."
    seen = upstream_requests(upstream)[before:]
    assert [(r["method"], r["path"]) for r in seen] == [("POST", "/v1/chat/completions")]
    assert seen[0]["body"]["messages"] == [{"role": "user", "content": "through the namespace"}]
    assert left_behind(token_of(result.stdout)) == []


def test_the_openai_sdk_without_proxy_variables_gets_a_translated_stream(
    tmp_path: Path, upstream: Upstream
) -> None:
    """A Responses stream over the chat-only upstream, checked by the SDK's own accumulator."""
    client = tmp_path / "client.py"
    client.write_text(SDK_CLIENT)
    before = len(upstream_requests(upstream))
    result = run_transparent(tmp_path, upstream, sys.executable, str(client))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OUTPUT: Hello from the fake upstream." in result.stdout
    seen = upstream_requests(upstream)[before:]
    assert [r["path"] for r in seen] == ["/v1/chat/completions"]


def test_codex_in_its_default_configuration_runs_its_tool_loop_in_the_namespace(
    tmp_path: Path, upstream: Upstream
) -> None:
    """Codex as it comes, with no proxy variable at all: its WebSocket to api.openai.com is
    redirected to llmitm, which serves it (its calls go back through a regular listener on
    the host's loopback, out of the namespace's reach), and its tool loop runs."""
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    env = codex_env(home, {"OPENAI_API_KEY": "sk-transparent"})
    before = len(upstream_requests(upstream))
    result = subprocess.run(
        [*llmitm_argv(tmp_path, upstream, "--transparent"), "--", str(find_codex_bin()),
         "exec", "--skip-git-repo-check", "Run the command."],
        cwd=work, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    shown = result.stdout[-2000:] + result.stderr[-3000:]
    assert result.returncode == 0, shown
    assert "Tool result:" in result.stdout and "llmitm-tool-ok" in result.stdout, shown
    for trouble in ("failed to connect to Responses WebSocket", "Reconnecting", "Falling back"):
        assert trouble not in result.stderr, shown
    seen = upstream_requests(upstream)[before:]
    assert [r["path"] for r in seen] == ["/v1/chat/completions"] * 2


def test_the_commands_exit_status_is_llmitms_and_nothing_is_left(
    tmp_path: Path, namespaces: None
) -> None:
    result = run_transparent(tmp_path, None, "sh", "-c", PRINT_TOKEN + "exit 7")
    assert result.returncode == 7, result.stderr
    assert left_behind(token_of(result.stdout)) == []


def test_a_killed_command_is_reported_as_a_shell_would_and_leaves_nothing(
    tmp_path: Path, namespaces: None
) -> None:
    result = run_transparent(tmp_path, None, "sh", "-c", PRINT_TOKEN + "kill -KILL $$")
    assert result.returncode == 128 + signal.SIGKILL, result.stderr
    assert left_behind(token_of(result.stdout)) == []


def test_a_missing_command_is_127_in_one_line_and_leaves_nothing(
    tmp_path: Path, namespaces: None
) -> None:
    def ours() -> set[str]:
        listed = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True)
        return {line for line in listed.stdout.splitlines() if "llmitm_" in line}

    tables = ours()
    result = run_transparent(tmp_path, None, "no-such-command-here")
    assert result.returncode == 127
    assert result.stderr.strip() == "llmitm run: no-such-command-here: command not found"
    assert ours() <= tables


@pytest.mark.parametrize(("sent", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 143)])
def test_llmitm_stopped_by_a_signal_stops_the_command_and_leaves_nothing(
    tmp_path: Path, namespaces: None, sent: signal.Signals, status: int
) -> None:
    """SIGTERM goes on to the command at once; a SIGINT sent to llmitm alone (not from a
    terminal, which would reach the command too) becomes SIGTERM after a moment."""
    process = subprocess.Popen(
        [*llmitm_argv(tmp_path, None, "--transparent"), "--",
         "sh", "-c", PRINT_TOKEN + "exec sleep 60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        token = token_of(process.stdout.readline())
        assert left_behind(token) == [f"link llm{token}o", f"table llmitm_{token}"]
        started = time.monotonic()
        process.send_signal(sent)
        assert process.wait(timeout=30) == status, process.stderr.read()
        assert time.monotonic() - started < 10
        assert left_behind(token) == []
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (["--mode", "local"], "--mode local cannot wrap a command here: "),
        (["--mode", "transparent"], "or --transparent"),
        (["--mode", "wireguard"], "--mode wireguard cannot carry the command's traffic"),
        (["--transparent", "--mode", "socks5"], "drop --mode socks5"),
        (["--transparent", "--base-url"], "--transparent and --base-url exclude each other"),
    ],
)
def test_a_mode_that_cannot_wrap_a_command_is_one_line_before_anything_runs(
    tmp_path: Path, options: list[str], expected: str
) -> None:
    result = subprocess.run(
        [*llmitm_argv(tmp_path, None, *options), "--", "sh", "-c", "echo ran"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "ran" not in result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llmitm run: ") and expected in lines[0]


def test_the_local_mode_refusal_names_this_machines_obstacle(tmp_path: Path) -> None:
    """Where mitmproxy's local redirector cannot start (no cgroup v2 root, or no sudo), the
    line says which; where it could, this test is skipped, saying so."""
    unified = any(
        line.split()[1:3] == ["/sys/fs/cgroup", "cgroup2"]
        for line in Path("/proc/self/mounts").read_text().splitlines()
    )
    if unified and shutil.which("sudo"):
        pytest.skip("this machine could run mitmproxy's local redirector")
    result = subprocess.run(
        [*llmitm_argv(tmp_path, None, "--mode", "local"), "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    obstacle = "cgroup v2" if not unified else "sudo"
    assert result.returncode == 2 and obstacle in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_an_unrouted_request_goes_where_its_host_header_says(
    tmp_path: Path, upstream: Upstream
) -> None:
    """Not an LLM call, so not routed: llmitm passes it on to the host its Host header names,
    as a regular proxy would. ``localhost`` inside the namespace is the namespace's own, so the
    client connects to api.openai.com (llmitm) while naming localhost — which llmitm resolves
    on the host, reaching the fake upstream's control route."""
    port = upstream.port
    fetch = (
        f"curl --noproxy '*' -sS --fail --max-time 20 --connect-to localhost:{port}:"
        f"api.openai.com:{port} http://localhost:{port}/_stats"
    )
    result = run_transparent(tmp_path, upstream, "sh", "-c", fetch)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "requests" in orjson.loads(result.stdout)


def test_a_request_naming_only_the_namespace_address_is_refused_at_once(
    tmp_path: Path, namespaces: None
) -> None:
    """No name, so no destination: a 502 from llmitm, not a wait for a connect timeout and
    never whatever listens on the host at that address."""
    fetch = (
        'G=$(awk "/nameserver/{print \\$2}" /etc/resolv.conf); '
        'curl -sS --max-time 20 -o /dev/null -w "%{http_code} %{time_total}" "http://$G:8000/"'
    )
    result = run_transparent(tmp_path, None, "sh", "-c", fetch)
    assert result.returncode == 0, result.stderr
    status, seconds = result.stdout.split()
    assert status == "502" and float(seconds) < 5, result.stdout


NODE_APP = """
const response = await fetch("https://api.openai.com/v1/chat/completions", {
  method: "POST",
  headers: {"authorization": "Bearer sk-transparent", "content-type": "application/json"},
  body: JSON.stringify({model: "gpt-5", messages: [{role: "user", content: "from node"}]}),
});
const body = await response.json();
console.log("NODE:", response.status, body.choices[0].message.content);
"""


def test_node_whose_fetch_ignores_proxy_variables_is_intercepted(
    tmp_path: Path, upstream: Upstream
) -> None:
    """Node before 22.21 has no proxy support in its global fetch at all: --transparent is the
    only way llmitm reaches it (its CA still comes from NODE_EXTRA_CA_CERTS)."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("no node on PATH (Debian's nodejs)")
    app = tmp_path / "app.mjs"
    app.write_text(NODE_APP)
    before = len(upstream_requests(upstream))
    result = run_transparent(tmp_path, upstream, node, str(app))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "NODE: 200 Hello from the fake upstream." in result.stdout
    seen = upstream_requests(upstream)[before:]
    assert [r["body"]["messages"][0]["content"] for r in seen] == ["from node"]


JAVA_CLIENT = """
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;

public class Client {
    public static void main(String[] args) throws Exception {
        String body = "{\\"model\\": \\"gpt-5\\", "
            + "\\"messages\\": [{\\"role\\": \\"user\\", \\"content\\": \\"from java\\"}]}";
        HttpRequest request = HttpRequest
            .newBuilder(URI.create("https://api.openai.com/v1/chat/completions"))
            .header("authorization", "Bearer sk-transparent")
            .header("content-type", "application/json")
            .POST(HttpRequest.BodyPublishers.ofString(body))
            .build();
        HttpResponse<String> response =
            HttpClient.newHttpClient().send(request, HttpResponse.BodyHandlers.ofString());
        System.out.println("JAVA: " + response.statusCode() + " " + response.body());
    }
}
"""


def test_java_which_reads_only_its_own_trust_store_is_intercepted(
    tmp_path: Path, upstream: Upstream
) -> None:
    """Java ignores proxy variables and CA variables alike; inside the namespace its key store
    is a copy with llmitm's CA added."""
    java = shutil.which("java")
    if java is None or not Path("/etc/ssl/certs/java/cacerts").is_file():
        pytest.skip("no Java with Debian's trust store (default-jdk-headless)")
    source = tmp_path / "Client.java"
    source.write_text(JAVA_CLIENT)
    before = len(upstream_requests(upstream))
    result = run_transparent(tmp_path, upstream, java, str(source))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("JAVA: 200 "), result.stdout + result.stderr
    answer = orjson.loads(result.stdout.removeprefix("JAVA: 200 "))
    assert answer["choices"][0]["message"]["content"] == "Hello from the fake upstream."
    seen = upstream_requests(upstream)[before:]
    assert [r["body"]["messages"][0]["content"] for r in seen] == ["from java"]


def test_llmitm_killed_outright_still_leaves_no_link_and_no_table(
    tmp_path: Path, namespaces: None
) -> None:
    """No finally runs under SIGKILL: the kernel drops the table with the nft process that owns
    it (its stdin closes), and the namespace, with its link, with the command, which gets
    SIGTERM as its parent dies."""
    process = subprocess.Popen(
        [*llmitm_argv(tmp_path, None, "--transparent"), "--",
         "sh", "-c", PRINT_TOKEN + "exec sleep 60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )  # fmt: skip
    children: list[int] = []
    try:
        assert process.stdout is not None
        token = token_of(process.stdout.readline())
        assert left_behind(token) == [f"link llm{token}o", f"table llmitm_{token}"]
        children = [
            int(pid)
            for task in Path(f"/proc/{process.pid}/task").iterdir()
            for pid in (task / "children").read_text().split()
        ]
        process.kill()
        process.wait()
        deadline = time.monotonic() + 10
        while left_behind(token) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert left_behind(token) == []
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for pid in children:  # the proxy outlives a killed llmitm run: not this test's subject
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_run_recorded_through_the_namespace_replays_offline(
    tmp_path: Path, upstream: Upstream
) -> None:
    """The CI case for a program that ignores proxy variables: record once, then replay with
    no upstream configured; the replay report counts the hit."""
    recordings = tmp_path / "recordings"
    first = subprocess.run(
        [*llmitm_argv(tmp_path, upstream, "--transparent", "--record", str(recordings),
                      "--set", "llmitm_allow_record_in_ci=true"),  # records on purpose
         "--", "sh", "-c", CURL],
        capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip
    assert first.returncode == 0, first.stdout + first.stderr
    before = len(upstream_requests(upstream))
    again = subprocess.run(
        [*llmitm_argv(tmp_path, None, "--transparent", "--replay", str(recordings)),
         "--", "sh", "-c", CURL],
        capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr
    assert orjson.loads(again.stdout) == orjson.loads(first.stdout)
    assert "replay: 1 hit(s), 0 miss(es)" in again.stderr
    assert len(upstream_requests(upstream)) == before
