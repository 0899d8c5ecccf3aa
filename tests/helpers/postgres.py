"""A real PostgreSQL server for the tests: Debian's ``postgresql`` package, one throwaway
cluster per pytest worker, a fresh database per test.

``initdb`` refuses to run as root (CI runs as root), so when the tests run as root the
cluster is made and run as the ``postgres`` user the package creates, in a temporary folder
that user owns. The server listens on 127.0.0.1 on a free port, with password
authentication over TCP (``scram-sha-256``) for the role ``llmitm``: the DSNs the tests hand
to llmitm carry no password, which reaches the client from ``PGPASSWORD`` as llmitm
requires, so a test of "the password comes only from the environment" is a real one.

``psql`` (from the same package) creates and drops the per-test databases, so this helper
does not depend on the Python driver llmitm uses.

    with postgres_server() as server:
        dsn = server.create_database()      # postgresql://llmitm@127.0.0.1:PORT/t_…
        env = server.env()                  # {"PGPASSWORD": …}
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROLE = "llmitm"
START_TIMEOUT = 30.0


def postgres_bindir() -> Path | None:
    """The folder of ``initdb`` and ``postgres``: Debian keeps them off ``PATH``."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    if found:
        return Path(found[0]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).resolve().parent if initdb else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_owner(uid: int | None, gid: int | None) -> Callable[[], None] | None:
    if uid is None or gid is None:
        return None

    def drop() -> None:
        os.setgid(gid)
        os.setuid(uid)

    return drop


@dataclass
class PostgresServer:
    """A running cluster: ``dsn(database)`` names a database on it, ``env()`` holds the
    password a client needs."""

    port: int
    password: str
    bindir: Path
    datadir: Path
    process: subprocess.Popen[bytes] | None = None
    _databases: list[str] = field(default_factory=list)

    @property
    def host(self) -> str:
        return "127.0.0.1"

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://{ROLE}@{self.host}:{self.port}/{database}"

    def env(self) -> dict[str, str]:
        return {"PGPASSWORD": self.password}

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run ``sql`` with ``psql`` and return its unaligned output."""
        result = subprocess.run(
            [
                str(self.bindir / "psql") if (self.bindir / "psql").exists() else "psql",
                "-X",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-d",
                self.dsn(database),
                "-c",
                sql,
            ],
            env={**os.environ, **self.env()},
            capture_output=True,
            timeout=30,
            check=False,
        )
        if result.returncode:
            raise RuntimeError(f"psql failed: {result.stderr.decode(errors='replace')}")
        return result.stdout.decode()

    def create_database(self) -> str:
        """A new, empty database; its DSN."""
        name = f"t_{secrets.token_hex(6)}"
        self.psql(f'CREATE DATABASE "{name}"')
        self._databases.append(name)
        return self.dsn(name)

    def drop_database(self, dsn: str) -> None:
        name = dsn.rsplit("/", 1)[1]
        self.psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGINT)  # "fast" shutdown: ends sessions, no wait for them
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


@contextmanager
def postgres_server(*, durable: bool = False) -> Iterator[PostgresServer]:
    """Start a throwaway cluster; stop it and remove its folder on exit.

    ``durable=False`` (tests) turns off ``fsync``: the tests kill llmitm, never the
    database, so durability against power loss buys them nothing but time. Benchmarks pass
    ``durable=True`` to measure a server as it is normally run.
    """
    bindir = postgres_bindir()
    if bindir is None:
        raise RuntimeError(
            "PostgreSQL is not installed (Debian: apt-get install postgresql; `make test` "
            "installs it)"
        )
    uid = gid = None
    if os.geteuid() == 0:
        owner = pwd.getpwnam("postgres")
        uid, gid = owner.pw_uid, owner.pw_gid
    # Not pytest's tmp_path: its folders are 0700 and owned by root, out of the postgres
    # user's reach.
    root = Path(tempfile.mkdtemp(prefix="llmitm-pg-"))
    datadir, sockets, pwfile = root / "data", root / "sockets", root / "pwfile"
    password = secrets.token_urlsafe(16)
    sockets.mkdir()
    pwfile.write_text(password + "\n")
    if uid is not None and gid is not None:
        for path in (root, sockets, pwfile):
            os.chown(path, uid, gid)
    drop = _as_owner(uid, gid)
    subprocess.run(
        [
            str(bindir / "initdb"),
            "-D",
            str(datadir),
            "-U",
            ROLE,
            f"--pwfile={pwfile}",
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        ],
        preexec_fn=drop,
        capture_output=True,
        timeout=120,
        check=True,
    )
    port = _free_port()
    settings = [
        f"port={port}",
        "listen_addresses=127.0.0.1",
        f"unix_socket_directories={sockets}",
        "max_connections=200",
    ]
    if not durable:
        settings += ["fsync=off", "synchronous_commit=off", "full_page_writes=off"]
    args = [str(bindir / "postgres"), "-D", str(datadir)]
    for setting in settings:
        args += ["-c", setting]
    log = (root / "server.log").open("wb")
    process = subprocess.Popen(
        args, preexec_fn=drop, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    server = PostgresServer(port=port, password=password, bindir=bindir, datadir=datadir)
    server.process = process
    try:
        _wait_ready(server, root / "server.log")
        yield server
    finally:
        server.stop()
        log.close()
        shutil.rmtree(root, ignore_errors=True)


def _wait_ready(server: PostgresServer, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        assert server.process is not None
        if server.process.poll() is not None:
            raise RuntimeError(f"postgres exited at start: {log.read_text(errors='replace')}")
        try:
            server.psql("SELECT 1")
            return
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
