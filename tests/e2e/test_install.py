"""Installing llmitm as a newcomer does: a fresh clone and ``make run`` (the runtime level
only), then the first screen alone to point the openai SDK at it; and ``pip install`` of a
built wheel with no extras, which gives a working ``llmitm`` and the pytest plugin.

Both download llmitm's dependencies through pip (from its cache when warm), so they take a
minute or two where nothing is cached; each step has a bound.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llmitm import __version__

from .first_screen import read_first_screen, screen_field, sdk_environment
from .processes import ROOT, fake_upstream
from .test_first_hour import ask_with, clean_env

pytestmark = pytest.mark.slow

INSTALL_TIMEOUT_S = 420.0

CONFIG = """
[endpoints.local]
kind = "compatible"
base_url = "{url}/v1"
apis = ["chat"]

[[routes]]
endpoints = ["local"]
"""


def outside_env() -> dict[str, str]:
    """The environment of a shell outside this test run: no venv, no PYTHONPATH pointing
    the new install at this checkout's code."""
    env = clean_env()
    for variable in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"):
        env.pop(variable, None)
    env["PATH"] = os.pathsep.join(
        part
        for part in env.get("PATH", "").split(os.pathsep)
        if Path(sys.executable).parent != Path(part)
    )
    return env


def test_a_fresh_clone_make_run_and_the_first_screen_get_an_answer(tmp_path: Path) -> None:
    clone = tmp_path / "llmitm"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True, timeout=120)
    with fake_upstream(tmp_path / "upstream", "chat") as upstream:
        config = tmp_path / "llmitm.toml"
        config.write_text(CONFIG.format(url=upstream.url))
        started = time.monotonic()
        run = subprocess.Popen(
            ["make", "--no-print-directory", "run", f"CONFIG={config}",
             f"ARGS=--listen-port 0 --set confdir={tmp_path / 'confdir'}"],
            cwd=clone,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env=outside_env(),
            start_new_session=True,  # make and the proxy it starts stop together
        )  # fmt: skip
        try:
            lines = read_first_screen(run, timeout=INSTALL_TIMEOUT_S)
            seconds = time.monotonic() - started
            answer = ask_with(sdk_environment(lines))
        finally:
            os.killpg(run.pid, signal.SIGTERM)
            try:
                run.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(run.pid, signal.SIGKILL)
                run.wait()
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout == "Hello from the fake upstream.\n"
    assert screen_field(lines, "config").startswith(f"{config}: 1 endpoint (local)")
    # The runtime level only: none of the test tools came along.
    site = next((clone / ".venv" / "lib").glob("python3*/site-packages"))
    assert (site / "mitmproxy").is_dir()
    for extra in ("pytest", "hypothesis", "xllamacpp", "agents", "openai"):
        assert not (site / extra).exists(), f"make run installed {extra}"
    print(f"make run on a fresh clone: first screen after {seconds:.1f} s")


def _check(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        argv, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False, **kwargs
    )  # type: ignore[call-overload]
    assert result.returncode == 0, f"{argv}:\n{result.stdout}\n{result.stderr}"
    return result


def test_a_built_wheel_installs_a_working_llmitm_and_pytest_plugin(tmp_path: Path) -> None:
    env = outside_env()
    _check([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w",
            str(tmp_path / "dist"), str(ROOT)], env=env)  # fmt: skip
    (wheel,) = (tmp_path / "dist").glob("llmitm-*.whl")
    venv = tmp_path / "venv"
    _check([sys.executable, "-m", "venv", str(venv)], env=env)
    python = str(venv / "bin" / "python")
    # pytest is the user's own test runner, not an extra of llmitm's.
    _check([python, "-m", "pip", "install", "--quiet", "--no-compile", str(wheel), "pytest"],
           env=env)  # fmt: skip
    version = _check([str(venv / "bin" / "llmitm"), "--version"], env=env)
    assert version.stdout.strip() == f"llmitm {__version__}"
    _check([python, "-c", "import llmitm.testing.pytest_plugin"], env=env)
    # The plugin is registered through its entry point: pytest lists its options.
    plugin = _check([python, "-m", "pytest", "--help"], env=env, cwd=tmp_path)
    assert "--llmitm-record-mode" in plugin.stdout
