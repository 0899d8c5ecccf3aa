"""The launcher ``llmitm run --transparent`` starts: it leaves the host's network and mount
namespaces, sets up its side of the link, and becomes the command (exec, same pid).

    python -m llmitm.transparent.inside SPEC_JSON

SPEC_JSON holds the two pipe ends of the handshake with ``namespace.py``, the inner link's name
and addresses, the files to bind-mount and the command. The handshake, one line each way:

    launcher -> llmitm   "ns"     the namespaces exist: move the link in
    llmitm -> launcher   "go"     it is there
    launcher -> llmitm   "ok"     configured; exec follows   (or "error MESSAGE")

Mounts are private to the new mount namespace, so the host's ``/etc/resolv.conf`` and CA bundle
are never touched; the kernel drops them, and the network namespace, when the last process in
them ends. The parent-death signal ends the command if llmitm itself is killed.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import orjson

from llmitm.errors import HostError

MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
PR_SET_PDEATHSIG = 1
IP_TIMEOUT_S = 10.0
EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126

_libc = ctypes.CDLL(None, use_errno=True)


class SetupError(HostError):
    """One step of the namespace's set-up failed; the message says which."""


def _mount(source: str | None, target: str, flags: int) -> None:
    encoded = None if source is None else os.fsencode(source)
    if _libc.mount(encoded, os.fsencode(target), None, ctypes.c_ulong(flags), None) != 0:
        errno = ctypes.get_errno()
        raise SetupError(f"mount {source or ''} on {target}: {os.strerror(errno)}")


def _ip(*arguments: str) -> None:
    try:
        subprocess.run(
            ["ip", *arguments], check=True, capture_output=True, text=True, timeout=IP_TIMEOUT_S
        )
    except subprocess.CalledProcessError as exc:
        raise SetupError(f"ip {' '.join(arguments)}: {exc.stderr.strip()}") from None
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SetupError(f"ip {' '.join(arguments)}: {exc}") from None


def _sysctl(path: str, value: str) -> None:
    try:
        Path("/proc/sys", path).write_text(value)
    except OSError as exc:
        raise SetupError(f"sysctl {path}: {exc.strerror}") from None


def enter(mounts: Sequence[tuple[str, str]]) -> None:
    """New network and mount namespaces, mount events kept private, the files bound."""
    if _libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        raise SetupError(f"prctl: {os.strerror(ctypes.get_errno())}")
    try:
        os.unshare(os.CLONE_NEWNET | os.CLONE_NEWNS)
    except OSError as exc:
        raise SetupError(f"unshare: {exc.strerror}") from None
    _mount(None, "/", MS_REC | MS_PRIVATE)
    for source, target in mounts:
        _mount(source, target, MS_BIND)


def configure(inner: str, address: str, gateway: str) -> None:
    """IPv4 only (a name's AAAA answer is empty), one point-to-point link, its far end as the
    default route."""
    for scope in ("all", "default"):
        _sysctl(f"net/ipv6/conf/{scope}/disable_ipv6", "1")
    _ip("link", "set", "lo", "up")
    _ip("addr", "add", address, "peer", gateway, "dev", inner)
    _ip("link", "set", inner, "up")
    _ip("route", "add", "default", "via", gateway, "dev", inner)


def main(argv: Sequence[str]) -> int:
    spec = orjson.loads(argv[0])
    report = os.fdopen(spec["report"], "wb", buffering=0)
    wait = os.fdopen(spec["wait"], "rb", buffering=0)
    try:
        enter([(source, target) for source, target in spec["mounts"]])
        report.write(b"ns\n")
        if wait.readline() != b"go\n":
            return 1  # llmitm gave up (and says why)
        configure(spec["inner"], spec["address"], spec["gateway"])
    except SetupError as exc:
        report.write(f"error {exc}\n".encode())
        return 1
    report.write(b"ok\n")
    report.close()
    wait.close()
    command = spec["command"]
    try:
        os.execvp(command[0], command)
    except FileNotFoundError:
        print(f"llmitm run: {command[0]}: command not found", file=sys.stderr)
        return EXIT_NOT_FOUND
    except PermissionError:
        print(f"llmitm run: {command[0]}: permission denied", file=sys.stderr)
        return EXIT_NOT_EXECUTABLE
    return 1  # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
