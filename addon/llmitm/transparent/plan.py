"""What ``llmitm run --transparent`` builds, decided without touching the machine.

One run owns one veth pair, one nftables table and one pair of addresses, all named after a
random token so parallel runs never collide. The pair links a fresh network namespace (the
command's) to the host; on the host side, the table sends every TCP connection and every DNS
query arriving from the pair to llmitm's loopback listeners and drops everything else, so
nothing the command sends is ever routed off the machine. The addresses come from 198.18.0.0/15
(RFC 2544's benchmarking block, which real networks do not use), away from any network the host
already has.

The host-side address plays three parts: the namespace's gateway, its DNS server, and the answer
to every name it looks up. llmitm then sees each connection addressed to it and picks the real
destination from the request's Host header, as a regular proxy does — so the namespace needs no
working resolver, and a name that only resolves on the host still works.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network

from llmitm.errors import UserError

LINK_BLOCK = IPv4Network("198.18.0.0/15")
LINK_PREFIX = 30  # one /30 per run: .1 on the host side, .2 in the namespace
DRAWS = 64  # random tries for a free /30 before giving up
TOKEN = re.compile(r"[0-9a-f]{8}")

# The variable the command sees, naming its run's token (and so its links and table).
NAMESPACE_VARIABLE = "LLMITM_NAMESPACE"

# Where programs that ignore SSL_CERT_FILE look for the system's CA bundle (Debian/Ubuntu,
# Fedora/RHEL, openSUSE, Alpine and others: the files Go and OpenSSL builds read). Those that
# exist are covered, inside the command's mount namespace only, by the bundle plus llmitm's CA.
CA_BUNDLE_PATHS = (
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/cert.pem",
)
RESOLV_CONF = "/etc/resolv.conf"
# Java's trust store on Debian/Ubuntu (the JDK's lib/security/cacerts links to it; Fedora's
# lives in /etc/pki/ca-trust/extracted/java/cacerts), and the password those stores ship with.
JAVA_CACERTS = "/etc/ssl/certs/java/cacerts"
JAVA_STORE_PASSWORD = "changeit"

# Proxy variables point at loopback addresses the namespace cannot reach (its loopback is its
# own); inside, every connection reaches llmitm without them.
PROXY_VARIABLES = frozenset(
    name
    for base in ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "ws_proxy", "wss_proxy")
    for name in (base, base.upper())
) | {"NODE_USE_ENV_PROXY"}  # set by llmitm run for the proxy variables; nothing to use inside


class PlanError(UserError, ValueError):
    """No plan fits this machine or this command line."""


@dataclass(frozen=True, slots=True)
class NamespacePlan:
    token: str
    outer: str  # the host-side end of the veth pair
    inner: str  # the end moved into the namespace
    table: str  # the nftables table (family ip)
    gateway: IPv4Address  # host side: gateway, DNS server, and every name's answer
    address: IPv4Address  # the namespace's own address


def new_plan(token: str, taken: Iterable[IPv4Network], draw: Callable[[int], int]) -> NamespacePlan:
    """Names for ``token`` and a /30 of ``LINK_BLOCK`` overlapping none of ``taken`` (the
    host's addresses and routes); ``draw(n)`` picks a number below ``n``."""
    if not TOKEN.fullmatch(token):
        raise PlanError(f"a namespace token is 8 lowercase hex digits, not {token!r}")
    taken = [network for network in taken if network.prefixlen]  # a default route takes nothing
    blocks = LINK_BLOCK.num_addresses >> (32 - LINK_PREFIX)
    for _ in range(DRAWS):
        base = int(LINK_BLOCK.network_address) + (draw(blocks) << (32 - LINK_PREFIX))
        link = IPv4Network((base, LINK_PREFIX))
        if not any(link.overlaps(network) for network in taken):
            return NamespacePlan(
                token=token,
                outer=f"llm{token}o",
                inner=f"llm{token}i",
                table=f"llmitm_{token}",
                gateway=IPv4Address(base + 1),
                address=IPv4Address(base + 2),
            )
    raise PlanError(f"no free /{LINK_PREFIX} in {LINK_BLOCK} after {DRAWS} tries")


def taken_networks(addresses: object, routes: object) -> list[IPv4Network]:
    """The IPv4 networks the host already uses, from ``ip -j -4 addr`` and ``ip -j -4 route
    show table all`` (anything unreadable is skipped: the draw then merely has less to avoid,
    and ``ip`` itself refuses a duplicate link name)."""
    found: list[IPv4Network] = []
    for link in addresses if isinstance(addresses, list) else []:
        for info in link.get("addr_info", []) if isinstance(link, dict) else []:
            found += _network(f"{info.get('local')}/{info.get('prefixlen')}")
    for route in routes if isinstance(routes, list) else []:
        destination = route.get("dst") if isinstance(route, dict) else None
        if isinstance(destination, str) and destination != "default":
            found += _network(destination)
    return found


def _network(text: str) -> list[IPv4Network]:
    try:
        return [IPv4Network(text, strict=False)]
    except ValueError:
        return []


def nft_commands(plan: NamespacePlan, tcp_target: str, dns_target: str) -> list[str]:
    """The table, one ``nft -i`` command a line; the targets are ``address:port`` of llmitm's
    transparent and DNS listeners. ``flags owner`` ties the table to the nft process that
    made it: the kernel removes it when that process ends, however llmitm ends."""
    table, outer = f"ip {plan.table}", f'"{plan.outer}"'
    return [
        f"add table {table} {{ flags owner; }}",
        f"add chain {table} prerouting "
        "{ type nat hook prerouting priority dstnat; policy accept; }",
        f"add rule {table} prerouting iifname {outer} meta l4proto tcp dnat to {tcp_target}",
        f"add rule {table} prerouting iifname {outer} udp dport 53 dnat to {dns_target}",
        # Only the two redirected kinds reach the host; nothing is forwarded either way, even
        # where the host forwards for others (containers, VMs).
        f"add chain {table} input {{ type filter hook input priority filter; policy accept; }}",
        f"add rule {table} input iifname {outer} ct status dnat accept",
        f"add rule {table} input iifname {outer} drop",
        f"add chain {table} forward {{ type filter hook forward priority filter; policy accept; }}",
        f"add rule {table} forward iifname {outer} drop",
        f"add rule {table} forward oifname {outer} drop",
        # llmitm refuses to connect to the gateway address (raw TCP to a looked-up name has no
        # other destination); should anything on the host try, it must not reach whatever
        # listens there.
        f"add chain {table} output {{ type filter hook output priority filter; policy accept; }}",
        f"add rule {table} output ip daddr {plan.gateway} drop",
    ]


def rule_count() -> int:
    """How many rules :func:`nft_commands` adds (to check that all of them were taken)."""
    commands = nft_commands(_EXAMPLE, "127.0.0.1:1", "127.0.0.1:2")
    return sum(line.startswith("add rule ") for line in commands)


def redirect_target(listening: Mapping[str, object], kind: str) -> str:
    """``address:port`` to redirect to, for the first ``kind`` listener of a listen file
    (a wildcard address is reached on 127.0.0.1)."""
    servers = listening.get("servers")
    for server in servers if isinstance(servers, list) else []:
        if server.get("type") == kind and server.get("addresses"):
            host, port = server["addresses"][0][:2]
            host = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
            try:
                IPv4Address(host)
            except ValueError:
                raise PlanError(f"the {kind} listener is on {host}, not IPv4") from None
            return f"{host}:{port}"
    raise PlanError(f"the proxy has no {kind} listener")


def resolv_conf(plan: NamespacePlan) -> str:
    return f"nameserver {plan.gateway}\noptions timeout:2 attempts:2\n"


def ca_bundle(system: bytes, ca: bytes) -> bytes:
    """The system bundle with llmitm's CA appended (PEM blocks simply concatenate)."""
    if system and not system.endswith(b"\n"):
        system += b"\n"
    return system + ca


def namespace_environment(env: Mapping[str, str], plan: NamespacePlan) -> dict[str, str]:
    """The command's environment inside the namespace: no proxy variables, the run's token."""
    inside = {name: value for name, value in env.items() if name not in PROXY_VARIABLES}
    inside[NAMESPACE_VARIABLE] = plan.token
    return inside


def user_modes(argv: Sequence[str]) -> list[str]:
    """The ``--mode`` specs in mitmdump arguments, in all of mitmdump's spellings."""
    modes: list[str] = []
    for index, item in enumerate(argv):
        following = argv[index + 1] if index + 1 < len(argv) else None
        if item in ("--mode", "-m") and following is not None:
            modes.append(following)
        elif item.startswith("--mode="):
            modes.append(item.removeprefix("--mode="))
        elif item.startswith("-m") and not item.startswith("--") and len(item) > 2:
            modes.append(item[2:])
        elif item == "--set" and following is not None and following.startswith("mode="):
            modes.append(following.removeprefix("mode="))
        elif item.startswith("--set=mode="):
            modes.append(item.removeprefix("--set=mode="))
    return modes


def command_mode_problem(modes: Sequence[str], *, transparent: bool, base_url: bool) -> str | None:
    """Why ``--transparent`` cannot go with these options, in one line, or None. (Without
    ``--transparent``, the listeners that can carry a command are judged with the proxy
    variables they need: ``command_env.mode_problem``; ``local`` by the machine.)"""
    if not transparent:
        return None
    if base_url:
        return "--transparent and --base-url exclude each other: the namespace has its own loopback"
    if modes:
        return f"--transparent chooses llmitm's listeners itself; drop --mode {modes[0]}"
    return None


def exit_status(returncode: int) -> int:
    """A shell's exit status for a child's return code (a signal N is 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


_EXAMPLE = NamespacePlan("00000000", "o", "i", "t", IPv4Address(1), IPv4Address(2))


def mode_kind(spec: str) -> str:
    """mitmproxy's mode name of a ``--mode`` spec (``mode[:data][@[host:]port]``)."""
    head, _, listen_at = spec.rpartition("@")
    return (head or listen_at).partition(":")[0].lower()
