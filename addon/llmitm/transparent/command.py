"""``llmitm run``'s two hooks into interception without proxy variables: which command lines
cannot wrap a command (one line each), and :class:`TransparentRun`, which adds the proxy's
listeners for a namespace and runs the command in one.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from llmitm.transparent import plan as planning
from llmitm.transparent.namespace import (
    NamespaceError,
    host_networks,
    prerequisites_problem,
    run_command,
)
from llmitm.transparent.plan import NamespacePlan, PlanError, mode_kind

CGROUP_ROOT = "/sys/fs/cgroup"
NAMESPACE_OPTION = "llmitm_namespace_address"
KEYTOOL_TIMEOUT_S = 30.0


def command_problem(mitmdump: Sequence[str], *, transparent: bool, base_url: bool) -> str | None:
    """Why ``llmitm run`` with these options cannot run a command, in one line, or None."""
    modes = planning.user_modes(mitmdump)
    problem = planning.command_mode_problem(modes, transparent=transparent, base_url=base_url)
    if problem:
        return problem
    if any(mode_kind(spec) == "local" for spec in modes):
        return local_mode_problem(_mounts(), sudo=shutil.which("sudo") is not None)
    return prerequisites_problem() if transparent else None


def local_mode_problem(mounts: str, *, sudo: bool) -> str:
    """mitmproxy's local mode on Linux attaches an eBPF program to the cgroup v2 root at
    /sys/fs/cgroup and starts its redirector through sudo. Where either is missing it logs the
    failure and keeps running, and the command would go unintercepted: refuse, saying why.
    Where both are present it still intercepts by process name or pid, machine-wide, not a
    command and its children; --transparent does that."""
    unified = any(
        fields[1:3] == [CGROUP_ROOT, "cgroup2"]
        for fields in (line.split() for line in mounts.splitlines())
        if len(fields) >= 3
    )
    if not unified:
        reason = f"{CGROUP_ROOT} is not the cgroup v2 hierarchy its eBPF redirector attaches to"
    elif not sudo:
        reason = "it starts its redirector through sudo, which is not installed"
    else:
        reason = "it intercepts processes by name machine-wide, not one command and its children"
    return f"--mode local cannot wrap a command here: {reason}; use --transparent"


def _mounts() -> str:
    try:
        return Path("/proc/self/mounts").read_text()
    except OSError:
        return ""


def _free_loopback_port() -> int:
    """A loopback port free for both TCP and UDP: mitmproxy's DNS listener takes both (a port
    free for UDP alone is often some connection's TCP port: both come from the ephemeral
    range); a TCP listener is content with it too."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
            tcp.bind(("127.0.0.1", 0))
            port = tcp.getsockname()[1]
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
                try:
                    udp.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port


@dataclass(slots=True)
class TransparentRun:
    """One ``--transparent`` run: its plan, the DNS listener's port, a scratch folder for the
    files bound into the namespace."""

    plan: NamespacePlan
    dns_port: int
    scratch: Path
    calls_port: int = 0
    """A regular listener on the host's loopback, out of the namespace's reach: the
    Responses WebSockets llmitm serves send their calls back through it."""

    @classmethod
    def prepare(cls, scratch: Path) -> TransparentRun:
        """Raises NamespaceError (one line) when no plan fits this machine."""
        try:
            plan = planning.new_plan(secrets.token_hex(4), host_networks(), secrets.randbelow)
        except PlanError as exc:
            raise NamespaceError(str(exc)) from None
        return cls(plan, _free_loopback_port(), scratch, _free_loopback_port())

    def proxy_args(self) -> list[str]:
        """The listeners the namespace is redirected to (on the loopback), the one its
        sockets' calls take, and the address its DNS answers for every name."""
        return [
            "--mode", "transparent",
            "--mode", f"dns@127.0.0.1:{self.dns_port}",
            "--mode", f"regular@127.0.0.1:{self.calls_port}",
            "--set", f"{NAMESPACE_OPTION}={self.plan.gateway}",
        ]  # fmt: skip

    def run(self, command: Sequence[str], env: Mapping[str, str], listening: Mapping) -> int:
        try:
            targets = (
                planning.redirect_target(listening, "transparent"),
                planning.redirect_target(listening, "dns"),
            )
        except PlanError as exc:
            raise NamespaceError(str(exc)) from None
        mounts = self._mounts(Path(str(listening["ca_file"])))
        inside = planning.namespace_environment(env, self.plan)
        return run_command(self.plan, command, inside, mounts, targets)

    def _mounts(self, ca_file: Path) -> list[tuple[str, str]]:
        """resolv.conf naming the gateway, and each system CA bundle plus llmitm's CA."""
        mounts: list[tuple[str, str]] = []
        if Path(planning.RESOLV_CONF).exists():
            resolv = self.scratch / "resolv.conf"
            resolv.write_text(planning.resolv_conf(self.plan))
            mounts.append((str(resolv), planning.RESOLV_CONF))
        ca = ca_file.read_bytes()
        seen: set[str] = set()
        for index, path in enumerate(planning.CA_BUNDLE_PATHS):
            real = os.path.realpath(path)
            if real in seen or not Path(real).is_file():
                continue
            seen.add(real)
            bundle = self.scratch / f"ca-bundle-{index}.pem"
            bundle.write_bytes(planning.ca_bundle(Path(real).read_bytes(), ca))
            mounts.append((str(bundle), real))
        return mounts + self._java_trust_store(ca_file)

    def _java_trust_store(self, ca_file: Path) -> list[tuple[str, str]]:
        """Java reads neither the PEM bundles nor any variable but its own key store: a copy
        of it with llmitm's CA added (by keytool, when both exist), or nothing."""
        store = Path(os.path.realpath(planning.JAVA_CACERTS))
        keytool = shutil.which("keytool")
        if keytool is None or not store.is_file():
            return []
        copy = self.scratch / "java-cacerts"
        shutil.copyfile(store, copy)
        try:
            subprocess.run(
                [keytool, "-importcert", "-noprompt", "-alias", f"llmitm-{self.plan.token}",
                 "-file", str(ca_file), "-keystore", str(copy),
                 "-storepass", planning.JAVA_STORE_PASSWORD],
                check=True, capture_output=True, text=True, timeout=KEYTOOL_TIMEOUT_S,
            )  # fmt: skip
        except (OSError, subprocess.SubprocessError) as exc:
            said = getattr(exc, "stdout", None) or str(exc)
            print(
                f"llmitm run: warning: Java's trust store left as it is: {said.strip()}",
                file=sys.stderr,
            )
            return []
        return [(str(copy), str(store))]
