"""``llmitm run --transparent``'s pure parts: names and addresses of a run, its nftables
commands, the namespace's files and environment, and which command lines can wrap a command."""

from __future__ import annotations

import random
import shutil
import subprocess
from ipaddress import IPv4Network

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmitm.cli.run_args import RunUsageError, parse_run_args
from llmitm.transparent import plan as planning
from llmitm.transparent.command import local_mode_problem
from llmitm.transparent.plan import LINK_BLOCK, PlanError, new_plan

IFNAMSIZ = 15  # the kernel's limit on a link name


def plan_for(token: str = "0123abcd", taken: list[IPv4Network] | None = None, seed: int = 0):
    return new_plan(token, taken or [], random.Random(seed).randrange)


def network_in_block(offset: int, prefix: int) -> IPv4Network:
    return IPv4Network((int(LINK_BLOCK.network_address) + offset, prefix), strict=False)


# --- new_plan -------------------------------------------------------------------------------


def test_a_plan_names_everything_after_its_token_within_the_kernels_limits() -> None:
    plan = plan_for("deadbeef")
    assert plan.token == "deadbeef"
    assert {plan.outer, plan.inner} == {"llmdeadbeefo", "llmdeadbeefi"}
    assert max(len(plan.outer), len(plan.inner)) <= IFNAMSIZ
    assert plan.table == "llmitm_deadbeef"


def test_the_two_addresses_are_the_ends_of_one_slash_30_in_the_benchmark_block() -> None:
    plan = plan_for()
    link = IPv4Network(f"{plan.gateway}/30", strict=False)
    assert link.subnet_of(LINK_BLOCK)
    assert plan.gateway == link.network_address + 1
    assert plan.address == link.network_address + 2


@pytest.mark.parametrize("token", ["", "0123abc", "0123abcde", "0123ABCD", "0123abc;", "../x"])
def test_a_token_that_could_break_a_name_or_a_rule_is_refused(token: str) -> None:
    with pytest.raises(PlanError, match="8 lowercase hex"):
        plan_for(token)


@given(
    taken=st.lists(
        st.builds(
            network_in_block,
            st.integers(0, LINK_BLOCK.num_addresses - 1),
            st.integers(16, 32),
        ),
        max_size=20,
    ),
    seed=st.integers(0, 2**32),
)
def test_a_plan_never_overlaps_a_network_the_host_has(taken: list[IPv4Network], seed: int) -> None:
    try:
        plan = plan_for(taken=taken, seed=seed)
    except PlanError:
        return  # every draw hit a taken network: refused, never overlapping
    link = IPv4Network(f"{plan.gateway}/30", strict=False)
    assert not any(link.overlaps(network) for network in taken)


def test_a_full_block_is_refused_and_a_default_route_takes_nothing() -> None:
    with pytest.raises(PlanError, match="no free /30"):
        plan_for(taken=[LINK_BLOCK])
    assert plan_for(taken=[IPv4Network("0.0.0.0/0")]).gateway in LINK_BLOCK


def test_the_hosts_networks_are_read_from_ip_json_and_garbage_is_skipped() -> None:
    addresses = [
        {"ifname": "lo", "addr_info": [{"local": "127.0.0.1", "prefixlen": 8}]},
        {"ifname": "eth0", "addr_info": [{"local": "198.18.4.9", "prefixlen": 24}]},
        {"ifname": "odd", "addr_info": [{"local": "nonsense"}]},
        "not a link",
    ]
    routes = [
        {"dst": "default", "gateway": "192.0.2.1"},
        {"dst": "198.19.0.0/16"},
        {"dst": "203.0.113.7"},
        {"no": "dst"},
    ]
    assert planning.taken_networks(addresses, routes) == [
        IPv4Network("127.0.0.0/8"),
        IPv4Network("198.18.4.0/24"),
        IPv4Network("198.19.0.0/16"),
        IPv4Network("203.0.113.7/32"),
    ]
    assert planning.taken_networks({"unexpected": 1}, None) == []


# --- nft_commands ---------------------------------------------------------------------------


def test_the_rules_redirect_tcp_and_dns_from_the_link_and_drop_the_rest() -> None:
    plan = plan_for()
    commands = planning.nft_commands(plan, "127.0.0.1:8081", "127.0.0.1:5353")
    assert commands[0] == f"add table ip {plan.table} {{ flags owner; }}"
    rules = [line for line in commands if line.startswith("add rule ")]
    assert len(rules) == planning.rule_count()
    assert all(f"ip {plan.table} " in line for line in commands)
    joined = "\n".join(rules)
    assert f'iifname "{plan.outer}" meta l4proto tcp dnat to 127.0.0.1:8081' in joined
    assert f'iifname "{plan.outer}" udp dport 53 dnat to 127.0.0.1:5353' in joined
    assert f'forward iifname "{plan.outer}" drop' in joined
    assert f'forward oifname "{plan.outer}" drop' in joined
    assert f'input iifname "{plan.outer}" drop' in joined
    assert f"output ip daddr {plan.gateway} drop" in joined


@pytest.mark.skipif(shutil.which("nft") is None, reason="nftables' nft command is not installed")
def test_nftables_itself_accepts_the_rules() -> None:
    """``nft -c`` parses and checks the commands against the kernel without applying them."""
    commands = planning.nft_commands(plan_for(), "127.0.0.1:8081", "127.0.0.1:5353")
    checked = subprocess.run(
        ["nft", "-c", "-f", "-"],
        input="\n".join(commands) + "\n",
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    if checked.returncode and "Operation not permitted" in checked.stderr:
        pytest.skip("nft -c needs CAP_NET_ADMIN here")
    assert checked.returncode == 0, checked.stderr


# --- files, environment, listeners ----------------------------------------------------------


def test_the_namespace_resolves_through_its_gateway() -> None:
    plan = plan_for()
    assert planning.resolv_conf(plan).splitlines()[0] == f"nameserver {plan.gateway}"


def test_the_ca_is_appended_to_the_system_bundle_on_a_line_of_its_own() -> None:
    ca = b"-----BEGIN CERTIFICATE-----\nMITM\n-----END CERTIFICATE-----\n"
    system = b"-----BEGIN CERTIFICATE-----\nSYS\n-----END CERTIFICATE-----"
    assert planning.ca_bundle(system, ca) == system + b"\n" + ca
    assert planning.ca_bundle(system + b"\n", ca) == system + b"\n" + ca
    assert planning.ca_bundle(b"", ca) == ca


def test_the_namespace_loses_every_proxy_variable_and_learns_its_token() -> None:
    env = {name: "http://127.0.0.1:3128" for name in planning.PROXY_VARIABLES}
    env |= {"SSL_CERT_FILE": "/ca.pem", "PATH": "/bin", "MY_PROXY_NOTE": "kept"}
    plan = plan_for("0badcafe")
    inside = planning.namespace_environment(env, plan)
    assert inside == {
        "SSL_CERT_FILE": "/ca.pem",
        "PATH": "/bin",
        "MY_PROXY_NOTE": "kept",
        planning.NAMESPACE_VARIABLE: "0badcafe",
    }
    assert {"HTTPS_PROXY", "https_proxy", "NO_PROXY", "ALL_PROXY"} <= planning.PROXY_VARIABLES


def test_redirect_targets_come_from_the_listen_file() -> None:
    listening = {
        "servers": [
            {"type": "transparent", "addresses": [["127.0.0.1", 41000]]},
            {"type": "dns", "addresses": [["0.0.0.0", 41001]]},
            {"type": "regular", "addresses": [["::1", 41002]]},
        ]
    }
    assert planning.redirect_target(listening, "transparent") == "127.0.0.1:41000"
    assert planning.redirect_target(listening, "dns") == "127.0.0.1:41001"
    with pytest.raises(PlanError, match="not IPv4"):
        planning.redirect_target(listening, "regular")
    with pytest.raises(PlanError, match="no socks5 listener"):
        planning.redirect_target(listening, "socks5")


@pytest.mark.parametrize(("code", "status"), [(0, 0), (7, 7), (-9, 137), (-15, 143), (-2, 130)])
def test_a_signal_is_reported_as_a_shell_would(code: int, status: int) -> None:
    assert planning.exit_status(code) == status


# --- which command lines can wrap a command -------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "modes"),
    [
        (["--mode", "socks5"], ["socks5"]),
        (["-m", "transparent", "-q"], ["transparent"]),
        (["-mlocal:curl"], ["local:curl"]),
        (["--mode=reverse:https://x@8080"], ["reverse:https://x@8080"]),
        (["--set", "mode=wireguard"], ["wireguard"]),
        (["--set=mode=dns"], ["dns"]),
        (["--set", "flow_detail=0", "-q", "--mode"], []),
    ],
)
def test_modes_are_found_in_every_spelling(argv: list[str], modes: list[str]) -> None:
    assert planning.user_modes(argv) == modes


@pytest.mark.parametrize(
    ("modes", "transparent", "base_url", "expected"),
    [
        ([], True, False, None),
        ([], True, True, "--transparent and --base-url exclude each other"),
        (["regular"], True, False, "drop --mode regular"),
        (["socks5@1080"], True, False, "drop --mode socks5@1080"),
        # Without --transparent, command_env.mode_problem judges (local: the machine).
        (["wireguard"], False, False, None),
        (["local"], False, False, None),
    ],
)
def test_modes_that_cannot_wrap_a_command_get_one_line(
    modes: list[str], transparent: bool, base_url: bool, expected: str | None
) -> None:
    problem = planning.command_mode_problem(modes, transparent=transparent, base_url=base_url)
    if expected is None:
        assert problem is None
    else:
        assert problem is not None and expected in problem and "\n" not in problem


V1_MOUNTS = "tmpfs /sys/fs/cgroup tmpfs rw 0 0\ncgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n"
V2_MOUNTS = "proc /proc proc rw 0 0\ncgroup2 /sys/fs/cgroup cgroup2 rw,nosuid 0 0\n"


@pytest.mark.parametrize(
    ("mounts", "sudo", "reason"),
    [
        (V1_MOUNTS, True, "is not the cgroup v2 hierarchy"),
        ("", True, "is not the cgroup v2 hierarchy"),
        (V2_MOUNTS, False, "sudo, which is not installed"),
        (V2_MOUNTS, True, "machine-wide"),
    ],
)
def test_local_mode_is_refused_with_the_machines_reason(
    mounts: str, sudo: bool, reason: str
) -> None:
    problem = local_mode_problem(mounts, sudo=sudo)
    assert problem.startswith("--mode local cannot wrap a command here: ")
    assert reason in problem and problem.endswith("use --transparent")


# --- the flag -------------------------------------------------------------------------------


def test_transparent_is_llmitms_flag_and_needs_a_command() -> None:
    args = parse_run_args(["--transparent", "-q", "--", "curl", "https://x"])
    assert args.transparent and args.mitmdump == ["-q"] and args.command == ["curl", "https://x"]
    with pytest.raises(RunUsageError, match="--transparent goes with a command"):
        parse_run_args(["--transparent"])
