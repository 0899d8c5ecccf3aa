"""``llmitm run``'s pure parts: splitting its command line, the mitmdump arguments it builds
(checked against mitmproxy's own option validation) and the environment a command gets."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from mitmproxy import exceptions
from mitmproxy.addons.proxyserver import Proxyserver
from mitmproxy.test import taddons

import llmitm
from llmitm.cli.command_env import CA_VARIABLES, command_environment
from llmitm.cli.run_args import RunArgs, RunUsageError, mitmdump_argv, parse_run_args
from llmitm.cli.run_report import replay_verdict

CA = "/home/u/.mitmproxy/mitmproxy-ca-cert.pem"
MISS = {
    "request": "POST chat.completions",
    "model": "m",
    "key": "k",
    "scope": "global",
    "reason": "no_recording",
    "closest": None,
}
UNUSED = {"id": "r2", "route": "chat.completions", "scope": "global"}

# --- parse_run_args -------------------------------------------------------------------------


def test_llmitm_options_mitmdump_options_and_the_command_are_split() -> None:
    args = parse_run_args(
        ["--config", "a.toml", "-p", "9000", "--base-url", "--set", "flow_detail=0", "--", "pytest"]
    )
    assert args == RunArgs(
        config="a.toml",
        base_url=True,
        mitmdump=["-p", "9000", "--set", "flow_detail=0"],
        command=["pytest"],
    )


def test_config_with_equals() -> None:
    assert parse_run_args(["--config=conf/llmitm.toml"]).config == "conf/llmitm.toml"
    assert parse_run_args(["--config=a=b.toml"]).config == "a=b.toml"


def test_everything_after_the_first_double_dash_is_the_command() -> None:
    args = parse_run_args(["-q", "--", "sh", "-c", "x", "--", "--config", "c.toml", "--base-url"])
    assert args.command == ["sh", "-c", "x", "--", "--config", "c.toml", "--base-url"]
    assert args.config is None
    assert args.base_url is False
    assert args.mitmdump == ["-q"]


def test_no_arguments() -> None:
    assert parse_run_args([]) == RunArgs()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--config"], "--config needs a file"),
        (["-q", "--config"], "--config needs a file"),
        (["--config="], "--config needs a file"),
        (["--config", "a.toml", "--"], "nothing to run after --"),
    ],
)
def test_usage_errors(argv: list[str], message: str) -> None:
    with pytest.raises(RunUsageError, match=message):
        parse_run_args(argv)


@pytest.mark.parametrize(
    "mode",
    [
        ["--mode=transparent"],
        ["-m", "wireguard"],
        ["--set", "mode=dns"],
        ["--set=mode=tun"],
    ],
)
def test_a_mode_that_cannot_carry_the_command_is_refused(mode: list[str]) -> None:
    # (--mode local is refused too, with what stops it on this machine: run's wrap check,
    # tests/e2e/test_transparent.py.)
    with pytest.raises(RunUsageError, match=r"^--mode \S+ cannot carry the command's traffic"):
        parse_run_args([*mode, "--", "curl", "https://api.openai.com"])
    assert parse_run_args(mode).mitmdump == mode  # the proxy alone may listen in any mode


@pytest.mark.parametrize(
    "user",
    [
        [],
        ["--mode", "socks5"],
        ["-m", "local", "-m", "regular"],
        ["--mode", "reverse:https://api.openai.com", "-p", "9000"],
        ["--mode", "reverse:https://api.openai.com", "--base-url"],
    ],
)
def test_a_mode_that_carries_the_command_is_taken(user: list[str]) -> None:
    assert parse_run_args([*user, "--", "true"]).command == ["true"]


def test_a_config_value_after_the_double_dash_is_not_taken() -> None:
    with pytest.raises(RunUsageError, match="--config needs a file"):
        parse_run_args(["--config", "--", "cmd"])


# --- mitmdump_argv --------------------------------------------------------------------------


def option_value(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, item in enumerate(argv[:-1]) if item == flag]


def test_defaults_without_a_command() -> None:
    argv = mitmdump_argv(RunArgs())
    assert "-s" not in argv  # the master holds llmitm's addons (addons.hosts.entry)
    assert "connection_strategy=lazy" in option_value(argv, "--set")
    assert option_value(argv, "--listen-host") == ["127.0.0.1"]  # never exposed by default
    assert "--listen-port" not in argv  # mitmdump's own 8080
    assert "--mode" not in argv


def test_the_script_loads_llmitms_addons() -> None:
    text = (Path(llmitm.__file__).parent / "addons" / "hosts" / "mitmproxy_script.py").read_text()
    assert "from llmitm.addons import make_addons" in text
    assert "addons = make_addons()" in text


def test_a_command_gets_a_free_port() -> None:
    argv = mitmdump_argv(RunArgs(command=["pytest"]))
    assert option_value(argv, "--listen-port") == ["0"]
    assert option_value(argv, "--listen-host") == ["127.0.0.1"]


def test_a_command_owns_the_terminal_so_the_console_is_off_unless_asked() -> None:
    assert "llmitm_console=off" in option_value(mitmdump_argv(RunArgs(command=["pytest"])), "--set")
    assert "llmitm_console=off" not in option_value(mitmdump_argv(RunArgs()), "--set")
    user = ["--set", "llmitm_console=lines"]
    argv = mitmdump_argv(RunArgs(mitmdump=user, command=["pytest"]))
    assert [s for s in option_value(argv, "--set") if "console" in s] == ["llmitm_console=lines"]


@pytest.mark.parametrize(
    "user",
    [
        ["-p", "9000"],
        ["-p9000"],
        ["--listen-port", "9000"],
        ["--listen-port=9000"],
        ["--set", "listen_port=9000"],
    ],
)
def test_a_users_port_is_not_overridden(user: list[str]) -> None:
    argv = mitmdump_argv(RunArgs(mitmdump=user, command=["pytest"]))
    assert option_value(argv, "--listen-port") == (["9000"] if "--listen-port" in user else [])
    assert argv[-len(user) :] == user


@pytest.mark.parametrize(
    "user", [["--listen-host", "0.0.0.0"], ["--listen-host=::"], ["--set", "listen_host=0.0.0.0"]]
)
def test_exposing_the_proxy_is_the_users_choice(user: list[str]) -> None:
    argv = mitmdump_argv(RunArgs(mitmdump=user))
    assert "127.0.0.1" not in argv
    assert argv[-len(user) :] == user


def test_user_options_come_last_so_they_win() -> None:
    user = ["--set", "connection_strategy=eager", "-q"]
    argv = mitmdump_argv(RunArgs(mitmdump=user, config="c.toml"), listenfile="/tmp/l.json")
    assert argv[-3:] == user
    sets = option_value(argv, "--set")
    assert sets.index("connection_strategy=lazy") < sets.index("connection_strategy=eager")


def test_config_and_listenfile_become_llmitm_options() -> None:
    argv = mitmdump_argv(RunArgs(config="conf/llmitm.toml"), listenfile="/tmp/x/listen.json")
    sets = option_value(argv, "--set")
    assert "llmitm_config=conf/llmitm.toml" in sets
    assert "llmitm_listenfile=/tmp/x/listen.json" in sets
    assert not any(
        s.startswith(("llmitm_config=", "llmitm_listenfile="))
        for s in option_value(mitmdump_argv(RunArgs()), "--set")
    )


def test_base_url_adds_a_reverse_listener_next_to_the_regular_one() -> None:
    argv = mitmdump_argv(RunArgs(base_url=True, command=["pytest"]))
    modes = option_value(argv, "--mode")
    assert modes[0] == "regular"
    # Its own port: mitmproxy refuses two servers on one address, port 0 included.
    assert re.fullmatch(r"reverse:https://api\.openai\.com@\d+", modes[1])
    assert not modes[1].endswith("@0")


@pytest.mark.parametrize(
    "user",
    [
        ["--mode", "socks5"],
        ["--mode=socks5"],
        ["-m", "socks5"],
        ["-msocks5"],
        ["--set", "mode=socks5"],
    ],
)
def test_base_url_keeps_the_users_mode(user: list[str]) -> None:
    argv = mitmdump_argv(RunArgs(base_url=True, mitmdump=user, command=["x"]))
    assert "regular" not in option_value(argv, "--mode")
    assert argv[-len(user) :] == user
    assert any(
        mode.startswith("reverse:https://api.openai.com") for mode in option_value(argv, "--mode")
    )


def mitmproxy_accepts(argv: list[str]) -> None:
    """Run mitmproxy's own proxyserver option checks on the listen options of ``argv``."""
    options: dict[str, Any] = {"mode": option_value(argv, "--mode") or ["regular"]}
    if hosts := option_value(argv, "--listen-host"):
        options["listen_host"] = hosts[-1]
    if ports := option_value(argv, "--listen-port"):
        options["listen_port"] = int(ports[-1])
    proxyserver = Proxyserver()
    with taddons.context(proxyserver) as tctx:
        tctx.configure(proxyserver, **options)


@pytest.mark.parametrize(
    "args",
    [
        RunArgs(),
        RunArgs(command=["pytest"]),
        RunArgs(base_url=True),
        RunArgs(base_url=True, command=["pytest"]),
        RunArgs(base_url=True, mitmdump=["--listen-port", "18080"], command=["pytest"]),
    ],
    ids=["plain", "command", "base-url", "base-url-command", "base-url-port"],
)
def test_mitmproxy_accepts_the_listeners(args: RunArgs) -> None:
    argv = mitmdump_argv(args)
    try:
        mitmproxy_accepts(argv)
    except exceptions.OptionsError as exc:  # pragma: no cover - the failure message
        pytest.fail(f"mitmdump would refuse {argv}: {exc}")


# --- command_environment --------------------------------------------------------------------


def listening(*servers: tuple[str, list[list[Any]]], ca: str = CA) -> dict[str, Any]:
    """A listen document as the llmitm_listenfile addon writes it."""
    return {
        "servers": [
            {"mode": kind, "type": kind.partition(":")[0], "addresses": addresses}
            for kind, addresses in servers
        ],
        "ca_file": ca,
        "pid": 4242,
    }


def test_regular_listener_gives_proxy_and_ca_variables() -> None:
    env = command_environment(
        listening(("regular", [["127.0.0.1", 40001], ["::1", 40001, 0, 0]])), base_url=False
    )
    assert env["HTTPS_PROXY"] == env["https_proxy"] == "http://127.0.0.1:40001"
    for variable in CA_VARIABLES:
        assert env[variable] == CA
    assert set(CA_VARIABLES) == {
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "GIT_SSL_CAINFO",
        "CODEX_CA_CERTIFICATE",
        "NODE_EXTRA_CA_CERTS",
    }
    assert "OPENAI_BASE_URL" not in env


def test_base_url_points_openai_clients_at_the_reverse_listener() -> None:
    document = listening(
        ("regular", [["127.0.0.1", 40001]]),
        ("reverse:https://api.openai.com", [["127.0.0.1", 40002]]),
    )
    env = command_environment(document, base_url=True)
    assert env["OPENAI_BASE_URL"] == "http://127.0.0.1:40002/v1"
    assert env["HTTPS_PROXY"] == "http://127.0.0.1:40001"
    assert "OPENAI_BASE_URL" not in command_environment(document, base_url=False)


def test_base_url_without_a_reverse_listener_sets_no_base_url() -> None:
    env = command_environment(listening(("regular", [["127.0.0.1", 40001]])), base_url=True)
    assert "OPENAI_BASE_URL" not in env
    assert env["HTTPS_PROXY"] == "http://127.0.0.1:40001"


@pytest.mark.parametrize("host", ["", "0.0.0.0", "::"])
def test_wildcard_listeners_are_reached_on_loopback(host: str) -> None:
    env = command_environment(
        listening(("regular", [[host, 8080]]), ("reverse:https://x", [[host, 8081]])),
        base_url=True,
    )
    assert env["HTTPS_PROXY"] == "http://127.0.0.1:8080"
    assert env["OPENAI_BASE_URL"] == "http://127.0.0.1:8081/v1"


def test_an_ipv6_listener_is_bracketed() -> None:
    env = command_environment(
        listening(("regular", [["::1", 8080]]), ("reverse:https://x", [["::1", 8081]])),
        base_url=True,
    )
    assert env["HTTPS_PROXY"] == "http://[::1]:8080"
    assert env["OPENAI_BASE_URL"] == "http://[::1]:8081/v1"


def test_the_first_listener_of_each_kind_wins() -> None:
    env = command_environment(
        listening(
            ("socks5", [["127.0.0.1", 1080]]),
            ("regular", [["127.0.0.1", 1]]),
            ("regular", [["127.0.0.1", 2]]),
            ("reverse:https://a", [["127.0.0.1", 3]]),
            ("reverse:https://b", [["127.0.0.1", 4]]),
        ),
        base_url=True,
    )
    assert env["HTTPS_PROXY"] == "http://127.0.0.1:1"
    assert env["OPENAI_BASE_URL"] == "http://127.0.0.1:3/v1"


def test_ca_variables_follow_the_confdir() -> None:
    ca = str(Path("/tmp/confdir/mitmproxy-ca-cert.pem"))
    env = command_environment(listening(("regular", [["127.0.0.1", 1]]), ca=ca), base_url=False)
    assert {env[variable] for variable in CA_VARIABLES} == {ca}


def test_replay_and_record_set_the_mode_unless_the_user_does() -> None:
    args = parse_run_args(["--replay", "recs", "--fail-on-unused", "--", "pytest"])
    assert args.replay == "recs" and args.fail_on_unused and args.command == ["pytest"]
    argv = mitmdump_argv(args, report="r.json")
    assert "llmitm_record=replay" in argv and "llmitm_recordings=recs" in argv
    assert "llmitm_replay_report=r.json" in argv
    own = parse_run_args(["--record", "recs", "--set", "llmitm_record=rewrite"])
    argv = mitmdump_argv(own)
    assert "llmitm_record=record" not in argv and argv.count("llmitm_record=rewrite") == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--replay"], "--replay needs a recordings folder"),
        (["--replay", "a", "--record", "b"], "exclude each other"),
        (["--fail-on-unused"], "go with --replay"),
        (["--junit", "j.xml", "--", "x"], "go with --replay"),
        (["--replay", "a", "--junit"], "--junit needs a file"),
    ],
)
def test_replay_usage_errors(argv: list[str], message: str) -> None:
    with pytest.raises(RunUsageError, match=message):
        parse_run_args(argv)


def test_junit_is_taken_with_replay_and_not_passed_to_mitmdump() -> None:
    args = parse_run_args(["--replay", "recs", "--junit=out.xml", "--", "pytest"])
    assert args.junit == "out.xml" and args.command == ["pytest"]
    assert not any("junit" in item or "out.xml" in item for item in mitmdump_argv(args))


@pytest.mark.parametrize(
    ("report", "fail_on_unused", "expected"),
    [
        ({"hits": 2}, False, 0),
        ({"hits": 1, "misses": [MISS]}, False, 1),
        ({"hits": 2, "unused": [UNUSED]}, False, 0),
        ({"hits": 2, "unused": [UNUSED]}, True, 1),
        ({"hits": 2, "drift": [{"id": "r1", "diff": []}]}, False, 0),  # a warning
        ({"hits": 2, "drift": [{"id": "r1", "diff": []}], "strict_drift": True}, False, 1),
    ],
)
def test_the_replayed_commands_verdict(
    tmp_path: Path, report: dict[str, Any], fail_on_unused: bool, expected: int
) -> None:
    path = tmp_path / "report.json"
    path.write_bytes(orjson.dumps(report))
    assert replay_verdict(path, 0, fail_on_unused=fail_on_unused) == expected
    assert replay_verdict(path, 3, fail_on_unused=fail_on_unused) == 3  # the command's own


def test_no_report_is_a_failure(tmp_path: Path) -> None:
    assert replay_verdict(tmp_path / "missing.json", 0, fail_on_unused=False) == 1
