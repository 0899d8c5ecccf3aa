"""llmitm in this process: a mitmproxy master with llmitm's addons on its own event loop, in
a daemon thread named ``llmitm`` — what the pytest plugin runs instead of a mitmdump child.

:class:`InProcessProxy` starts the master, waits until its servers listen (or tells why they
never will: the errors logged during start-up), and stops it from any thread; the master's
``done`` hooks run in its thread before :meth:`InProcessProxy.stop` returns, so a recording
mode has written its folder by then. :class:`ReplayLedger` notes each flow's scope and
outcome (hit, miss with the proxy's message, or forwarded upstream) for the test that made it.

mitmproxy keeps the running master and its options in the process-global ``mitmproxy.ctx``,
which every addon reads: two masters running at once in one process clash. :func:`active_master`
finds one that runs, and :meth:`InProcessProxy.start` refuses to start beside it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from mitmproxy import ctx, http, master, options
from mitmproxy.addons import default_addons
from mitmproxy.addons.errorcheck import ErrorCheck

from llmitm.addons import make_addons
from llmitm.addons.patches.master import uninstall_log_handlers, with_llmitm
from llmitm.addons.record import LlmFlowRecorder
from llmitm.errors import HostError
from llmitm.replay.model import Interaction
from llmitm.replay.pool import SCOPE_HEADERS, split_scope_path

THREAD_NAME = "llmitm"
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 60.0
_SCOPE = "llmitm-inprocess-scope"
_NOTED = "llmitm-inprocess-noted"


class InProcessError(HostError, RuntimeError):
    """The in-process proxy cannot start (another master runs, bad options, start-up errors)."""


@dataclass(frozen=True, slots=True)
class Exchange:
    """One API call a scope made through the proxy: ``outcome`` is ``hit``, ``miss``,
    ``upstream`` (forwarded, recorded in a recording mode) or ``error`` (no answer: the
    upstream failed or the client went away); ``message`` is the miss's or the error's."""

    outcome: str
    method: str
    path: str
    status: int
    message: str = ""


class ReplayLedger:
    """First addon of the chain: reads a flow's scope before the recorder strips it from the
    path, and the outcome from the answer (``x-llmitm-replay``) once it is known."""

    name = "llmitm_inprocess_ledger"

    def __init__(self, on_exchange: Callable[[str, Exchange], None]) -> None:
        self.on_exchange = on_exchange

    def request(self, flow: http.HTTPFlow) -> None:
        scope, path = split_scope_path(flow.request.path)
        for name in SCOPE_HEADERS:
            scope = flow.request.headers.get(name) or scope
        flow.metadata[_SCOPE] = (scope, flow.request.method, path)

    def response(self, flow: http.HTTPFlow) -> None:
        noted = flow.metadata.get(_SCOPE)
        response = flow.response
        if noted is None or noted[0] is None or response is None:
            return
        scope, method, path = noted
        outcome = response.headers.get("x-llmitm-replay") or "upstream"
        message = _error_message(response.content or b"") if outcome == "miss" else ""
        flow.metadata[_NOTED] = True
        self.on_exchange(scope, Exchange(outcome, method, path, response.status_code, message))

    def error(self, flow: http.HTTPFlow) -> None:
        noted = flow.metadata.get(_SCOPE)
        if noted is None or noted[0] is None or flow.metadata.get(_NOTED):
            return
        scope, method, path = noted
        status = flow.response.status_code if flow.response else 0  # a stream cut midway
        message = flow.error.msg if flow.error else ""
        self.on_exchange(scope, Exchange("error", method, path, status, message))


def _error_message(body: bytes) -> str:
    try:
        return str(orjson.loads(body)["error"]["message"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return body.decode("utf-8", "replace")


class _Ready:
    """Last addon of the chain: its ``running`` comes after the recordings loaded."""

    name = "llmitm_inprocess_ready"

    def __init__(self, proxy: InProcessProxy) -> None:
        self.proxy = proxy

    async def running(self) -> None:
        await asyncio.sleep(0)  # let records of the hooks before reach the error check
        errorcheck = ctx.master.addons.get("errorcheck")
        if errorcheck is not None and errorcheck.logger.has_errored:
            return  # the master exits right after: start() reports the errors
        proxyserver = ctx.master.addons.get("proxyserver")
        self.proxy.addresses = [
            (server.mode.type_name, host, port)
            for server in proxyserver.servers
            for host, port, *_ in server.listen_addrs
        ]
        self.proxy._ready.set()


def reclaim_ctx(ours: master.Master) -> None:
    """Point ``mitmproxy.ctx`` back at ``ours`` when a finished master (``taddons``) left
    itself there; refuse when another master is still running."""
    if getattr(ctx, "master", None) is ours:
        return
    other = active_master()
    if other is not None:
        raise InProcessError(
            f"another mitmproxy master ({type(other).__name__}) runs in this process beside "
            "llmitm's; mitmproxy's ctx holds one master per process"
        )
    ctx.master, ctx.options, ctx.log = ours, ours.options, ours.log


def active_master() -> master.Master | None:
    """The mitmproxy master that runs in this process now, if any (its loop runs and it was
    not told to exit)."""
    current = getattr(ctx, "master", None)
    if current is None:
        return None
    loop = getattr(current, "event_loop", None)
    if loop is None or loop.is_closed() or not loop.is_running():
        return None
    return None if current.should_exit.is_set() else current


class InProcessProxy:
    """One mitmproxy master with llmitm's addons, run in a daemon thread of this process."""

    def __init__(
        self,
        settings: dict[str, Any],
        on_exchange: Callable[[str, Exchange], None],
        before_record: Callable[[Interaction], Interaction | None] | None = None,
    ) -> None:
        self.settings = settings
        self.on_exchange = on_exchange
        self.before_record = before_record
        self.addresses: list[tuple[str, str, int]] = []
        self.master: master.Master | None = None
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        self._errors: list[str] = []

    def start(self) -> None:
        other = active_master()
        if other is not None:
            raise InProcessError(
                f"another mitmproxy master ({type(other).__name__}) runs in this process; "
                "mitmproxy keeps one master in the process-global mitmproxy.ctx, so llmitm "
                "cannot run beside it — stop it first or run that code in a child process"
            )
        self._thread = threading.Thread(target=self._main, name=THREAD_NAME, daemon=True)
        started = time.monotonic()
        self._thread.start()
        while not self._ready.wait(0.05):
            if not self._thread.is_alive():
                break
            if time.monotonic() - started > READY_TIMEOUT_S:
                self.stop()
                raise InProcessError(f"llmitm did not listen within {READY_TIMEOUT_S:.0f} s")
        if not self._ready.is_set():
            self._thread.join()
            reasons = self._errors or [repr(self._failure or "the master stopped")]
            raise InProcessError("llmitm did not start:\n" + "\n".join(reasons))

    def port(self, type_name: str = "reverse") -> int:
        return next(port for kind, _, port in self.addresses if kind == type_name)

    def stop(self) -> None:
        """Shut the master down (thread-safe) and wait for its ``done`` hooks."""
        if self.master is not None and self._thread is not None and self._thread.is_alive():
            self.master.shutdown()  # call_soon_threadsafe inside
            self._thread.join(STOP_TIMEOUT_S)
            if self._thread.is_alive():
                raise InProcessError(f"llmitm did not stop within {STOP_TIMEOUT_S:.0f} s")
        if self._failure is not None and self._ready.is_set():
            raise InProcessError(f"llmitm failed while running: {self._failure!r}")

    # --- the thread ----------------------------------------------------------------------

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as exc:  # SystemExit from mitmproxy's start-up error check too
            self._failure = exc
        finally:
            self._ready_or_not()

    def _ready_or_not(self) -> None:
        # A master that died in start-up skips its done(): its root-logger handlers would then
        # post every later record of this process to a closed loop.
        current = self.master
        if current is not None:
            uninstall_log_handlers(current)
            errorcheck = current.addons.get("errorcheck")
            if errorcheck is not None:
                self._errors += [errorcheck.logger.format(r) for r in errorcheck.logger.has_errored]
                errorcheck.finish()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        opts = options.Options()
        current = master.Master(opts, event_loop=loop)
        self.master = current
        # llmitm's addons where mitmdump's script loader would put them (as llmitm run's
        # master has them, see entry.py), the ledger just before them (it reads the scope
        # before the recorder strips it from the path); _Ready last.
        llmitm = make_addons()
        for addon in llmitm:
            if isinstance(addon, LlmFlowRecorder):
                addon.before_record = self.before_record
        chain = with_llmitm(default_addons(), [ReplayLedger(self.on_exchange), *llmitm])
        current.addons.add(*chain, ErrorCheck(), _Ready(self))
        try:
            # The test process is not the proxy's own: its objects are not frozen (a cycle
            # among them would never be collected) unless a test asks for it.
            opts.update(**{"llmitm_gc_freeze": False, **self.settings})
        except Exception as exc:  # unknown option (KeyError) or a value configure refused
            self._errors.append(f"bad option: {exc}")
            return
        await current.run()
        # asyncio.run now cancels the handlers of connections the clients kept alive; on
        # Python 3.12.1 each cancelled one logs a CancelledError traceback. Nothing is lost.
        loop.set_exception_handler(_quiet_cancelled)


def _quiet_cancelled(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    if not isinstance(context.get("exception"), asyncio.CancelledError):
        loop.default_exception_handler(context)
