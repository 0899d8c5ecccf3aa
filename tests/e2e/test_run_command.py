"""``llmitm run … -- COMMAND``: the "unmodified app" case in regular mode.

The client is a separate Python process using the openai SDK at its default base URL
(``https://api.openai.com/v1``); only the variables ``llmitm run`` sets (``HTTPS_PROXY`` and
the CA files) bring it to llmitm, which intercepts TLS with its own CA and routes the model
to the local fake upstream. No network is used.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import certifi
import pytest

from llmitm.cli.command_env import CA_VARIABLES

from .processes import LLMITM, Upstream, fake_upstream

pytestmark = pytest.mark.slow

CLIENT = """
import os, sys, openai
assert "OPENAI_BASE_URL" not in os.environ, "the app must use its default base URL"
client = openai.OpenAI(api_key="sk-unmodified-app", max_retries=0)
assert str(client.base_url).startswith("https://api.openai.com"), client.base_url
with client.responses.stream(model="gpt-5", input="Say hello") as stream:
    for _ in stream:
        pass
    final = stream.get_final_response()
print("OUTPUT:", final.output_text)
messages = [{"role": "user", "content": "hi"}]
completion = client.chat.completions.create(model="gpt-5", messages=messages)
print("CHAT:", completion.choices[0].message.content)
"""

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


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    with fake_upstream(tmp_path_factory.mktemp("run-upstream"), "chat") as fake:
        yield fake


def run_llmitm(
    tmp: Path, upstream: Upstream, *command: str, env_extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    config = tmp / "llmitm.toml"
    config.write_text(CONFIG.format(url=upstream.url))
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_BASE_URL", "HTTPS_PROXY")}
    env.update(env_extra or {})
    return subprocess.run(
        [str(LLMITM), "run", "--config", str(config), "--set", f"confdir={tmp / 'confdir'}",
         "--set", "llmitm_store=",
         "-q", "--", *command],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )  # fmt: skip


def test_unmodified_app_is_intercepted_and_routed(tmp_path: Path, upstream: Upstream) -> None:
    client = tmp_path / "client.py"
    client.write_text(CLIENT)
    result = run_llmitm(tmp_path, upstream, sys.executable, str(client))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OUTPUT: Hello from the fake upstream." in result.stdout
    assert "CHAT: Hello from the fake upstream." in result.stdout


def test_the_commands_exit_status_is_llmitms(tmp_path: Path, upstream: Upstream) -> None:
    result = run_llmitm(tmp_path, upstream, sys.executable, "-c", "import sys; sys.exit(3)")
    assert result.returncode == 3


SHOW_ENVIRONMENT = """
import json, os, sys
names = sys.argv[1].split(",")
ca = open(sys.argv[2], "rb").read()
seen = {}
for name in names:
    value = os.environ.get(name)
    data = open(value, "rb").read() if value and os.path.isfile(value) else b""
    seen[name] = {"value": value, "trusts_mitmproxy": ca in data, "size": len(data)}
print(json.dumps(seen))
"""


def test_the_command_sees_the_proxy_and_ca_variables(tmp_path: Path, upstream: Upstream) -> None:
    """The CA variables name bundles that still hold what they named before (here a system
    bundle the machine points SSL_CERT_FILE at) plus mitmproxy's CA."""
    system = Path(ssl.get_default_verify_paths().openssl_cafile)
    if not system.is_file():
        system = Path(certifi.where())
    names = ("HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY", "NODE_USE_ENV_PROXY", *CA_VARIABLES)
    script = tmp_path / "show.py"
    script.write_text(SHOW_ENVIRONMENT)
    ca = tmp_path / "confdir" / "mitmproxy-ca-cert.pem"
    result = run_llmitm(
        tmp_path, upstream, sys.executable, str(script), ",".join(names), str(ca),
        env_extra={"SSL_CERT_FILE": str(system), "NO_PROXY": "internal.example",
                   "NODE_EXTRA_CA_CERTS": ""},  # empty: unset
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["HTTPS_PROXY"]["value"].startswith("http://127.0.0.1:")
    assert seen["HTTP_PROXY"]["value"] == seen["HTTPS_PROXY"]["value"]
    assert seen["NO_PROXY"]["value"] == "internal.example,localhost,127.0.0.1,::1"
    assert seen["NODE_USE_ENV_PROXY"]["value"] == "1"
    for name in CA_VARIABLES:
        assert seen[name]["trusts_mitmproxy"], (name, seen[name])
        assert seen[name]["value"] != str(ca)  # a bundle in llmitm's scratch directory
        assert not Path(seen[name]["value"]).exists()  # gone with the run
    assert seen["SSL_CERT_FILE"]["size"] > system.stat().st_size  # the system's CAs, and more
    assert seen["NODE_EXTRA_CA_CERTS"]["size"] == len(ca.read_bytes())  # Node adds its own


def test_a_bad_config_fails_at_start_up_naming_file_and_key(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('[endpoints.x]\nkind = "azure"\nbase_url = "ftp://nope"\n')
    result = subprocess.run(
        [str(LLMITM), "run", "--config", str(config), "--set", f"confdir={tmp_path / 'c'}",
         "--set", "llmitm_store=",
         "--", sys.executable, "-c", "print('never')"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "never" not in output
    assert str(config) in output and "endpoints.x.base_url" in output
    assert "Traceback" not in output


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        (["llmitm_record=bogus"], "llmitm_record must be one of 'off', 'record'"),
        (["llmitm_console=loud"], "llmitm_console must be one of 'auto', 'live'"),
        (["llmitm_record=off", "llmitm_record=replay"], "multiple values for llmitm_record"),
    ],
)
def test_a_bad_llmitm_option_is_refused_before_listening(
    tmp_path: Path, sets: list[str], expected: str
) -> None:
    """mitmproxy checks neither the choices of an option nor, for a script's options, a value
    given twice: llmitm's addons sit in the master from the start and check them."""
    argv = [str(LLMITM), "run", "--set", f"confdir={tmp_path / 'c'}", "--set", "llmitm_store="]
    for item in sets:
        argv += ["--set", item]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert expected in output and "listening" not in output
    assert "Traceback" not in output


def test_plain_mitmdump_with_a_bad_config_exits_1_with_one_line(tmp_path: Path) -> None:
    """The mitmproxy way (``mitmdump -s addon/llmitm_addon.py``) fails just as clearly."""
    config = tmp_path / "bad.toml"
    config.write_text("[[routes]]\nendpoints = ['missing']\n")
    shim = Path(__file__).resolve().parents[2] / "addon" / "llmitm_addon.py"
    result = subprocess.run(
        [str(Path(sys.executable).with_name("mitmdump")), "-s", str(shim),
         "--set", f"llmitm_config={config}", "--set", f"confdir={tmp_path / 'c'}",
         "--set", "llmitm_store=",
         "--listen-host", "127.0.0.1", "--listen-port", "0"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "routes[0].endpoints" in output and str(config) in output
    assert "Traceback" not in output


CUT_CLIENT = """
import openai
client = openai.OpenAI(api_key="sk-unmodified-app", max_retries=0)
cut = {"x-fake-scenario": "text;events=40;disconnect_after=4"}
try:
    with client.responses.stream(model="gpt-5", input="hi", extra_headers=cut) as stream:
        for _ in stream:
            pass
    print("CLEAN END")
except openai.APIConnectionError as exc:
    print("TRANSPORT ERROR:", type(exc).__name__)
except openai.APIError as exc:
    print("API ERROR:", exc.message)
again = client.responses.create(model="gpt-5", input="hi")
print("AFTER:", again.output_text)
"""


def test_a_cut_stream_ends_in_the_clients_protocol_over_tls(
    tmp_path: Path, upstream: Upstream
) -> None:
    """Regular mode, TLS to llmitm: an upstream cut mid-stream reaches the SDK as an API error
    in the Responses protocol (not a transport error), and the next request works."""
    client = tmp_path / "client.py"
    client.write_text(CUT_CLIENT)
    result = run_llmitm(tmp_path, upstream, sys.executable, str(client))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "API ERROR: The upstream chat stream ended without a finish_reason." in result.stdout
    assert "AFTER: Hello from the fake upstream." in result.stdout


BASE_URL_CLIENT = """
import os, openai
base = os.environ["OPENAI_BASE_URL"]
assert base.startswith("http://127.0.0.1:") and base.endswith("/v1"), base
client = openai.OpenAI(api_key="sk-app", max_retries=0)  # reads OPENAI_BASE_URL
print("VIA", client.base_url, client.responses.create(model="gpt-5", input="hi").output_text)
"""


def test_base_url_flag_points_the_command_at_a_reverse_listener(
    tmp_path: Path, upstream: Upstream
) -> None:
    client = tmp_path / "client.py"
    client.write_text(BASE_URL_CLIENT)
    config = tmp_path / "llmitm.toml"
    config.write_text(CONFIG.format(url=upstream.url).replace('hosts = ["api.openai.com"]\n', ""))
    result = subprocess.run(
        [str(LLMITM), "run", "--config", str(config), "--base-url",
         "--set", f"confdir={tmp_path / 'confdir'}",
         "--set", "llmitm_store=", "-q", "--", sys.executable, str(client)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Hello from the fake upstream." in result.stdout
