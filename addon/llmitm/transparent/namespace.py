"""The host side of ``llmitm run --transparent``: the nftables table and the veth pair of one
run, the launcher in its new namespaces, and the teardown of all of it.

Teardown does not depend on reaching a ``finally``: the table is owned by the ``nft`` process
that made it (which ends when its stdin closes, i.e. when llmitm ends, however it ends), the
namespace ends with the last process in it, and a veth pair with it; the launcher gets SIGTERM
when llmitm dies. The ``finally`` below still removes everything at once, so nothing outlives a
run even when the command leaves a process behind in the namespace.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType

import orjson

from llmitm.errors import HostError
from llmitm.transparent import plan as planning
from llmitm.transparent.plan import NamespacePlan

STEP_TIMEOUT_S = 10.0  # each set-up step (an ip or nft call, one handshake line)
GRACE_S = 10.0  # after llmitm is told to stop, how long the command may take to follow
INTERRUPT_GRACE_S = 2.0  # after SIGINT, how long before the command is sent SIGTERM
FORWARDED = (signal.SIGTERM, signal.SIGHUP)


class NamespaceError(HostError, RuntimeError):
    """The namespace could not be set up; the message is one line for the user."""


def prerequisites_problem() -> str | None:
    """Why --transparent cannot work on this machine, or None."""
    if sys.platform != "linux":
        return "--transparent needs Linux network namespaces"
    if os.geteuid() != 0:
        return "--transparent needs root: it creates a network namespace, a veth pair and rules"
    for tool, package in (("ip", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool) is None:
            return f"--transparent needs the {tool} command (Debian package {package})"
    return None


def _run(argv: Sequence[str]) -> str:
    try:
        done = subprocess.run(
            list(argv), check=True, capture_output=True, text=True, timeout=STEP_TIMEOUT_S
        )
    except subprocess.CalledProcessError as exc:
        raise NamespaceError(f"{' '.join(argv)}: {exc.stderr.strip()}") from None
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NamespaceError(f"{' '.join(argv)}: {exc}") from None
    return done.stdout


def host_networks() -> list:
    addresses = orjson.loads(_run(["ip", "-j", "-4", "addr"]) or "[]")
    routes = orjson.loads(_run(["ip", "-j", "-4", "route", "show", "table", "all"]) or "[]")
    return planning.taken_networks(addresses, routes)


class RuleTable:
    """The run's nftables table, held by an ``nft -i`` process for as long as it lives."""

    def __init__(self, plan: NamespacePlan, tcp_target: str, dns_target: str) -> None:
        self.plan = plan
        # nft's answers, read only if it refuses; lives as long as the table does.
        self._log = tempfile.TemporaryFile()  # noqa: SIM115
        self._nft = subprocess.Popen(
            ["nft", "-i"], stdin=subprocess.PIPE, stdout=self._log, stderr=subprocess.STDOUT
        )
        assert self._nft.stdin is not None
        commands = planning.nft_commands(plan, tcp_target, dns_target)
        self._nft.stdin.write("".join(line + "\n" for line in commands).encode())
        self._nft.stdin.flush()
        self._wait_until_complete()

    def _rules(self) -> int | None:
        listed = subprocess.run(
            ["nft", "-j", "list", "table", "ip", self.plan.table],
            capture_output=True,
            timeout=STEP_TIMEOUT_S,
            check=False,
        )
        try:
            items = orjson.loads(listed.stdout).get("nftables", [])
        except orjson.JSONDecodeError:
            return None  # listed while nft -i was still adding: ask again
        return None if listed.returncode else sum("rule" in item for item in items)

    def _wait_until_complete(self) -> None:
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._rules() == planning.rule_count():
                return
            if self._nft.poll() is not None:
                break
            time.sleep(0.02)
        self.close()
        self._log.seek(0)
        said = self._log.read().decode(errors="replace").strip().splitlines()
        raise NamespaceError(f"nftables refused the rules: {said[0] if said else 'no answer'}")

    def close(self) -> None:
        if self._nft.poll() is None and self._nft.stdin is not None:
            with contextlib.suppress(OSError):
                self._nft.stdin.write(f"delete table ip {self.plan.table}\n".encode())
                self._nft.stdin.close()  # the owner ends: the kernel drops the table anyway
            try:
                self._nft.wait(timeout=STEP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._nft.kill()
                self._nft.wait()
        self._log.close()


def _sysctl(path: str, value: str) -> None:
    target = Path("/proc/sys", path)
    if target.exists():  # the IPv6 knobs exist only where IPv6 does
        target.write_text(value)


@contextlib.contextmanager
def host_side(plan: NamespacePlan, tcp_target: str, dns_target: str) -> Iterator[None]:
    """The table first (nothing passes unfiltered), then the host's end of the link: routes
    loopback-bound redirects, forwards nothing, speaks no IPv6."""
    table = RuleTable(plan, tcp_target, dns_target)
    try:
        _run(["ip", "link", "add", plan.outer, "type", "veth", "peer", "name", plan.inner])
        try:
            for knob, value in (("route_localnet", "1"), ("forwarding", "0")):
                _sysctl(f"net/ipv4/conf/{plan.outer}/{knob}", value)
            _sysctl(f"net/ipv6/conf/{plan.outer}/disable_ipv6", "1")
            _run(["ip", "addr", "add", str(plan.gateway), "peer", str(plan.address),
                  "dev", plan.outer])  # fmt: skip
            _run(["ip", "link", "set", plan.outer, "up"])
            yield
        finally:
            # Deleting one end deletes both, wherever the other is (also with a process
            # still alive in the namespace); it is gone already if the namespace ended.
            subprocess.run(
                ["ip", "link", "del", plan.outer],
                capture_output=True,
                timeout=STEP_TIMEOUT_S,
                check=False,
            )
    finally:
        table.close()


def _read_line(stream: int, deadline: float) -> bytes:
    line = b""
    while not line.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([stream], [], [], remaining)[0]:
            raise NamespaceError("the namespace launcher did not answer in time")
        piece = os.read(stream, 512)
        if not piece:
            break
        line += piece
    return line


class Stopping:
    """While the command runs: SIGTERM and SIGHUP are passed on to it. SIGINT is not at once:
    from a terminal the command has it already (a second one can mean "force quit"), so it gets
    SIGTERM only if it is still running a moment later. Any of them starts a grace period after
    which the command is killed."""

    def __init__(self) -> None:
        self.child: subprocess.Popen[bytes] | None = None
        self.deadline: float | None = None
        self._terminate_at: float | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> Stopping:
        for number in (signal.SIGINT, *FORWARDED):
            self._previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *_: object) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)  # type: ignore[arg-type]

    def _handle(self, number: int, _frame: FrameType | None) -> None:
        now = time.monotonic()
        if self.deadline is None:
            self.deadline = now + GRACE_S
        if number not in FORWARDED:
            self._terminate_at = self._terminate_at or now + INTERRUPT_GRACE_S
        elif self.child is not None and self.child.poll() is None:
            self.child.send_signal(number)

    @property
    def requested(self) -> bool:
        return self.deadline is not None

    def wait(self, child: subprocess.Popen[bytes]) -> int:
        while True:
            try:
                return child.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                now = time.monotonic()
                if self._terminate_at is not None and now > self._terminate_at:
                    self._terminate_at = None
                    child.terminate()
                if self.deadline is not None and now > self.deadline:
                    child.kill()


def run_command(
    plan: NamespacePlan,
    command: Sequence[str],
    env: Mapping[str, str],
    mounts: Sequence[tuple[str, str]],
    targets: tuple[str, str],
) -> int:
    """Run ``command`` in a new namespace built after ``plan``, its TCP and DNS redirected to
    ``targets`` (``host:port`` of llmitm's transparent and DNS listeners); its exit status."""
    with Stopping() as stopping, host_side(plan, *targets):
        report_read, report_write = os.pipe()
        wait_read, wait_write = os.pipe()
        spec = {
            "report": report_write,
            "wait": wait_read,
            "inner": plan.inner,
            "address": str(plan.address),
            "gateway": str(plan.gateway),
            "mounts": list(mounts),
            "command": list(command),
        }
        try:
            child = subprocess.Popen(
                [sys.executable, "-m", "llmitm.transparent.inside", orjson.dumps(spec).decode()],
                env=dict(env),
                pass_fds=(report_write, wait_read),
            )
        finally:
            os.close(report_write)
            os.close(wait_read)
        stopping.child = child
        try:
            _handshake(plan, child, report_read, wait_write, stopping)
        except NamespaceError:
            child.kill()
            child.wait()
            raise
        finally:
            os.close(report_read)
            os.close(wait_write)
        return planning.exit_status(stopping.wait(child))


def _handshake(
    plan: NamespacePlan,
    child: subprocess.Popen[bytes],
    report: int,
    wait: int,
    stopping: Stopping,
) -> None:
    deadline = time.monotonic() + STEP_TIMEOUT_S
    said = _read_line(report, deadline)
    if said != b"ns\n":
        raise NamespaceError(_launcher_problem(said))
    if stopping.requested:
        raise NamespaceError("stopped before the command started")
    _run(["ip", "link", "set", plan.inner, "netns", str(child.pid)])
    os.write(wait, b"go\n")
    said = _read_line(report, time.monotonic() + STEP_TIMEOUT_S)
    if said != b"ok\n":
        raise NamespaceError(_launcher_problem(said))


def _launcher_problem(said: bytes) -> str:
    text = said.decode(errors="replace").strip()
    return text.removeprefix("error ") if text.startswith("error ") else "the launcher failed"
