"""``command_env``: the variables a command under ``llmitm run`` gets, the CA bundles written
for it, and which ``--mode`` listeners can carry it (mode names checked against mitmproxy's own
parser). Real clients reading these variables are tests/e2e/test_run_clients.py."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mitmproxy.proxy.mode_specs import ProxyMode

from llmitm.cli.command_env import (
    CA_VARIABLES,
    CA_VARIABLES_IF_SET,
    bundle_sources,
    command_environment,
    mode_problem,
    system_bundle,
    write_ca_bundles,
)
from llmitm.transparent.plan import mode_kind

CA = "/home/u/.mitmproxy/mitmproxy-ca-cert.pem"
PROXY_SPELLINGS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy")


def listening(*servers: tuple[str, list[list[Any]]]) -> dict[str, Any]:
    """A listen document as the llmitm_listenfile addon writes it."""
    return {
        "servers": [
            {"mode": spec, "type": mode_kind(spec), "addresses": addresses}
            for spec, addresses in servers
        ],
        "ca_file": CA,
        "pid": 4242,
    }


REGULAR = ("regular", [["127.0.0.1", 40001]])
SOCKS = ("socks5", [["127.0.0.1", 1080]])


# --- proxy variables --------------------------------------------------------------------------


def test_a_regular_listener_sets_every_spelling_real_clients_read() -> None:
    env = command_environment(listening(REGULAR), base_url=False, environ={"PATH": "/bin"})
    for variable in PROXY_SPELLINGS:
        assert env[variable] == "http://127.0.0.1:40001"
    assert env["NODE_USE_ENV_PROXY"] == "1"  # Node's fetch ignores HTTPS_PROXY without it
    assert env["PATH"] == "/bin"
    assert "ALL_PROXY" not in env and "OPENAI_BASE_URL" not in env


def test_an_upstream_listener_is_an_http_proxy_too() -> None:
    env = command_environment(
        listening(("upstream:http://corp:3128", [["127.0.0.1", 40005]])), base_url=False
    )
    assert env["HTTPS_PROXY"] == env["http_proxy"] == "http://127.0.0.1:40005"


def test_the_users_node_setting_and_other_variables_are_kept() -> None:
    environ = {"NODE_USE_ENV_PROXY": "0", "ALL_PROXY": "socks5://corp:1080", "HOME": "/h"}
    env = command_environment(listening(REGULAR), base_url=False, environ=environ)
    assert env["NODE_USE_ENV_PROXY"] == "0"
    assert env["ALL_PROXY"] == "socks5://corp:1080"  # HTTPS_PROXY wins over it in every client
    assert env["HOME"] == "/h"
    assert environ == {"NODE_USE_ENV_PROXY": "0", "ALL_PROXY": "socks5://corp:1080", "HOME": "/h"}


def test_an_inherited_proxy_is_replaced_by_llmitms() -> None:
    environ = {"HTTPS_PROXY": "http://corp:3128", "http_proxy": "http://corp:3128"}
    env = command_environment(listening(REGULAR), base_url=False, environ=environ)
    assert {env[variable] for variable in PROXY_SPELLINGS} == {"http://127.0.0.1:40001"}


def test_loopback_is_never_proxied_and_the_users_exceptions_stay() -> None:
    env = command_environment(listening(REGULAR), base_url=False, environ={})
    assert env["NO_PROXY"] == env["no_proxy"] == "localhost,127.0.0.1,::1"
    environ = {"NO_PROXY": "internal.example, .corp", "no_proxy": ".corp,localhost,10.0.0.0/8"}
    env = command_environment(listening(REGULAR), base_url=False, environ=environ)
    expected = "internal.example,.corp,localhost,10.0.0.0/8,127.0.0.1,::1"
    assert env["NO_PROXY"] == env["no_proxy"] == expected


@given(
    st.dictionaries(
        st.sampled_from(["NO_PROXY", "no_proxy"]),
        st.lists(
            st.sampled_from(["a.example", ".corp", "localhost", "::1", " ", ""]), max_size=5
        ).map(",".join),
    )
)
def test_no_proxy_is_a_union_without_duplicates(environ: dict[str, str]) -> None:
    merged = command_environment(listening(REGULAR), base_url=False, environ=environ)["NO_PROXY"]
    entries = merged.split(",")
    given_entries = {e.strip() for v in environ.values() for e in v.split(",") if e.strip()}
    assert set(entries) == given_entries | {"localhost", "127.0.0.1", "::1"}
    assert len(entries) == len(set(entries)) and "" not in entries


def test_socks5_gives_all_proxy_and_drops_inherited_http_proxies() -> None:
    """Every client prefers HTTPS_PROXY over ALL_PROXY: an inherited one would go around
    llmitm."""
    environ = {"HTTPS_PROXY": "http://corp:3128", "http_proxy": "http://corp:3128"}
    env = command_environment(listening(SOCKS), base_url=False, environ=environ)
    assert env["ALL_PROXY"] == env["all_proxy"] == "socks5h://127.0.0.1:1080"
    assert not any(variable in env for variable in PROXY_SPELLINGS)
    assert "NODE_USE_ENV_PROXY" not in env  # Node's env proxy speaks HTTP only
    assert env["NO_PROXY"] == "localhost,127.0.0.1,::1"


def test_regular_and_socks5_listeners_each_give_their_variables() -> None:
    env = command_environment(listening(SOCKS, REGULAR), base_url=False)
    assert env["HTTPS_PROXY"] == "http://127.0.0.1:40001"
    assert env["ALL_PROXY"] == "socks5h://127.0.0.1:1080"


def test_a_listener_without_an_address_is_skipped() -> None:
    """``local`` mode listens nowhere: its empty address list used to raise IndexError."""
    env = command_environment(listening(("local", []), REGULAR), base_url=False)
    assert env["HTTPS_PROXY"] == "http://127.0.0.1:40001"
    env = command_environment(listening(("local", [])), base_url=False, environ={"A": "b"})
    assert not any(variable in env for variable in (*PROXY_SPELLINGS, "ALL_PROXY"))


def test_loopback_is_never_proxied_even_without_a_proxy_listener() -> None:
    """A reverse listener at a port the user named: an inherited proxy must not carry the
    app's calls to it."""
    environ = {"HTTPS_PROXY": "http://corp:3128", "NO_PROXY": ".corp"}
    reverse = ("reverse:https://api.openai.com@9000", [["127.0.0.1", 9000]])
    env = command_environment(listening(reverse), base_url=False, environ=environ)
    assert env["NO_PROXY"] == env["no_proxy"] == ".corp,localhost,127.0.0.1,::1"
    assert env["HTTPS_PROXY"] == "http://corp:3128" and "OPENAI_BASE_URL" not in env


def test_without_bundles_the_ca_variables_name_mitmproxys_ca() -> None:
    env = command_environment(listening(REGULAR), base_url=False)
    assert {env[variable] for variable in CA_VARIABLES} == {CA}
    assert set(CA_VARIABLES) >= {"SSL_CERT_FILE", "CURL_CA_BUNDLE", "CODEX_CA_CERTIFICATE"}


def test_bundles_name_the_ca_variables() -> None:
    bundles = {"SSL_CERT_FILE": "/s/ca-SSL_CERT_FILE.pem", "PIP_CERT": "/s/ca-PIP_CERT.pem"}
    env = command_environment(listening(REGULAR), base_url=False, bundles=bundles)
    assert env["SSL_CERT_FILE"] == "/s/ca-SSL_CERT_FILE.pem"
    assert env["PIP_CERT"] == "/s/ca-PIP_CERT.pem"


# --- which modes carry a command ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("modes", "base_url", "fixed_port"),
    [
        (["regular"], False, False),
        (["regular@8081"], False, False),
        (["upstream:http://corp:3128"], False, False),
        (["socks5"], False, False),
        (["transparent", "regular"], False, False),
        (["reverse:https://api.openai.com@9000"], False, False),
        (["reverse:https://api.openai.com"], False, True),
        (["local"], True, False),  # --base-url adds the reverse listener the command uses
    ],
)
def test_modes_that_carry_a_command(modes: list[str], base_url: bool, fixed_port: bool) -> None:
    assert mode_problem(modes, base_url=base_url, fixed_port=fixed_port) is None


@pytest.mark.parametrize(
    ("modes", "expected"),
    [
        (["local"], "--mode local cannot carry the command's traffic (it captures processes"),
        (["local:curl"], "--mode local:curl cannot carry"),
        (["transparent"], "--mode transparent cannot carry"),
        (["wireguard"], "(it serves WireGuard peers"),
        (["dns@5353"], "(it answers DNS only)"),
        (["reverse:https://api.openai.com"], "add --base-url (OPENAI_BASE_URL) or name a port"),
        (["reverse:https://api.openai.com@0"], "add --base-url"),
        (["tun", "dns"], "--mode tun cannot carry"),
    ],
)
def test_modes_that_cannot_carry_a_command_say_why_in_one_line(
    modes: list[str], expected: str
) -> None:
    problem = mode_problem(modes, base_url=False, fixed_port=False)
    assert problem is not None and expected in problem
    assert "\n" not in problem and "use --mode regular (the default), socks5" in problem


KINDS = ["regular", "transparent", "socks5", "reverse", "upstream", "dns", "wireguard", "local"]
DATA = {
    "reverse": ["https://api.openai.com", "http://127.0.0.1:9", "tls://x:443"],
    "upstream": ["http://corp:3128"],
    "local": ["", "curl", "!python"],
    "wireguard": ["", "/tmp/wg.conf"],
}


@given(
    st.sampled_from(KINDS).flatmap(
        lambda kind: st.tuples(
            st.just(kind),
            st.sampled_from(DATA.get(kind, [""])),
            st.sampled_from(["", "@8080", "@0", "@127.0.0.1:8081", "@[::1]:8082"]),
            st.booleans(),
        )
    )
)
def test_mode_kind_reads_specs_as_mitmproxy_does(parts: tuple[str, str, str, bool]) -> None:
    kind, data, listen, upper = parts
    spec = (kind.upper() if upper else kind) + (f":{data}" if data else "") + listen
    try:
        parsed = ProxyMode.parse(spec)
    except ValueError:
        return  # mitmproxy refuses it at start-up itself
    assert mode_kind(spec) == parsed.type_name


# --- CA bundles -----------------------------------------------------------------------------------


def test_each_bundle_starts_from_what_its_client_would_have_read() -> None:
    environ = {"SSL_CERT_FILE": "/etc/corp.pem", "CURL_CA_BUNDLE": "/etc/curl.pem"}
    sources = bundle_sources(environ, "/etc/system.pem")
    assert sources["SSL_CERT_FILE"] == "/etc/corp.pem"
    assert sources["CURL_CA_BUNDLE"] == "/etc/curl.pem"
    assert sources["REQUESTS_CA_BUNDLE"] == "/etc/curl.pem"  # requests falls back to it
    assert sources["CODEX_CA_CERTIFICATE"] == "/etc/corp.pem"  # Codex falls back to SSL_CERT_FILE
    assert sources["GIT_SSL_CAINFO"] == "/etc/system.pem"
    assert sources["NODE_EXTRA_CA_CERTS"] is None  # Node adds it to its own roots
    assert not set(CA_VARIABLES_IF_SET) & set(sources)


def test_other_tools_ca_variables_are_rewritten_only_when_set() -> None:
    environ = {"PIP_CERT": "/etc/pip.pem", "AWS_CA_BUNDLE": "", "NODE_EXTRA_CA_CERTS": "/x.pem"}
    sources = bundle_sources(environ, None)
    assert sources["PIP_CERT"] == "/etc/pip.pem" and "AWS_CA_BUNDLE" not in sources
    assert sources["NODE_EXTRA_CA_CERTS"] == "/x.pem"
    assert sources["SSL_CERT_FILE"] is None  # no system bundle found: mitmproxy's CA alone


def test_the_system_bundle_is_openssls_default_not_the_variable() -> None:
    default = ssl.get_default_verify_paths().openssl_cafile
    found = system_bundle()
    assert found is not None and Path(found).is_file()
    if Path(default).is_file():
        assert found == default


def pem(name: str) -> bytes:
    return f"-----BEGIN CERTIFICATE-----\n{name}\n-----END CERTIFICATE-----\n".encode()


def test_bundles_hold_the_old_trust_and_mitmproxys_ca(tmp_path: Path) -> None:
    ca = tmp_path / "mitmproxy-ca-cert.pem"
    ca.write_bytes(pem("MITM"))
    corp = tmp_path / "corp.pem"
    corp.write_bytes(pem("CORP").rstrip(b"\n"))  # no final newline: still two PEM blocks
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    environ = {"SSL_CERT_FILE": str(corp), "PIP_CERT": str(corp)}
    bundles, warnings = write_ca_bundles(str(ca), environ, scratch)
    assert warnings == []
    assert Path(bundles["SSL_CERT_FILE"]).read_bytes() == pem("CORP") + pem("MITM")
    # One file per source: SSL_CERT_FILE, Codex (falls back to it) and pip share it.
    assert bundles["CODEX_CA_CERTIFICATE"] == bundles["PIP_CERT"] == bundles["SSL_CERT_FILE"]
    assert Path(bundles["NODE_EXTRA_CA_CERTS"]).read_bytes() == pem("MITM")
    system = Path(bundles["GIT_SSL_CAINFO"]).read_bytes()
    assert system.endswith(pem("MITM")) and len(system) > len(pem("MITM")) * 10
    assert {Path(path).parent for path in bundles.values()} == {scratch}


def test_an_unreadable_source_warns_and_falls_back_to_the_system(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_bytes(pem("MITM"))
    missing = tmp_path / "gone.pem"
    bundles, warnings = write_ca_bundles(str(ca), {"CURL_CA_BUNDLE": str(missing)}, tmp_path)
    assert len(warnings) == 1, warnings  # once per file, naming the variable the user set
    assert warnings[0].startswith(f"CURL_CA_BUNDLE={missing} cannot be read (No such file")
    assert Path(bundles["CURL_CA_BUNDLE"]).read_bytes().endswith(pem("MITM"))
    assert len(Path(bundles["CURL_CA_BUNDLE"]).read_bytes()) > len(pem("MITM")) * 10


def test_a_bundle_that_already_trusts_the_ca_is_not_doubled(tmp_path: Path) -> None:
    """``llmitm run`` inside ``llmitm run`` with the same confdir."""
    ca = tmp_path / "ca.pem"
    ca.write_bytes(pem("MITM"))
    outer = tmp_path / "outer.pem"
    outer.write_bytes(pem("SYSTEM") + pem("MITM"))
    bundles, _ = write_ca_bundles(str(ca), {"SSL_CERT_FILE": str(outer)}, tmp_path)
    assert Path(bundles["SSL_CERT_FILE"]).read_bytes() == pem("SYSTEM") + pem("MITM")
