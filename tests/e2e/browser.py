"""Headless Chromium (Debian's ``chromium``, installed by ``make e2e-deps``) driven over the
DevTools protocol: open a page, wait for text to appear, take a screenshot.

The protocol's websocket is spoken with tornado's client (a mitmproxy dependency), so the
browser test needs nothing beyond the venv and the Debian package.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from tornado.websocket import WebSocketClientConnection, websocket_connect

CHROMIUM_FLAGS = (
    # As root in a container: no sandbox. No network beyond loopback here: nothing in the
    # background that would dial out (and fail loudly) at every start.
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,1000",
)


def chromium_binary() -> str:
    binary = shutil.which("chromium")
    if binary is None:
        pytest.fail("Debian's chromium is not installed: run `make e2e-deps`", pytrace=False)
    return binary


class Page:
    """One tab, driven over its DevTools websocket."""

    def __init__(self, connection: WebSocketClientConnection) -> None:
        self.connection = connection
        self._ids = itertools.count(1)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        request_id = next(self._ids)
        await self.connection.write_message(
            json.dumps({"id": request_id, "method": method, "params": params})
        )
        while True:  # events arrive in between; the answer carries our id
            message = await self.connection.read_message()
            if message is None:
                raise ConnectionError("the browser closed the DevTools connection")
            answer = json.loads(message)
            if answer.get("id") == request_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result", {})

    async def text(self) -> str:
        result = await self.call(
            "Runtime.evaluate", expression="document.body ? document.body.innerText : ''"
        )
        return str(result.get("result", {}).get("value", ""))

    async def wait_for_text(self, *needles: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        text = ""
        while time.monotonic() < deadline:
            text = await self.text()
            if all(needle in text for needle in needles):
                return text
            await asyncio.sleep(0.25)
        raise AssertionError(f"{needles} not on the page after {timeout:.0f} s; it shows:\n{text}")

    async def screenshot(self, path: Path) -> None:
        result = await self.call("Page.captureScreenshot", format="png")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(result["data"]))


@contextmanager
def chromium(tmp: Path) -> Iterator[str]:
    """A headless Chromium with one blank tab; yields that tab's DevTools websocket URL."""
    profile = tmp / "chromium-profile"
    profile.mkdir(parents=True, exist_ok=True)
    log = tmp / "chromium.log"
    argv = [
        chromium_binary(),
        *CHROMIUM_FLAGS,
        f"--user-data-dir={profile}",
        "--remote-debugging-address=127.0.0.1",
        "--remote-debugging-port=0",
        "about:blank",
    ]
    with log.open("wb") as output:
        process = subprocess.Popen(
            argv, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"chromium did not start:\n{log.read_text(errors='replace')}")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as answer:
            targets = json.loads(answer.read())
        page = next(target for target in targets if target.get("type") == "page")
        yield page["webSocketDebuggerUrl"]
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def open_page(websocket_url: str) -> Page:
    connection = await websocket_connect(websocket_url, max_message_size=64 * 1024 * 1024)
    page = Page(connection)
    await page.call("Page.enable")
    return page
