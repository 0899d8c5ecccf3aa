"""Each patch of mitmproxy's internals with its precondition broken: the start-up check says so
in one warning, and the public path serves (tests/e2e/test_patch_fallbacks.py does the same
for the cut-stream patch in a real mitmdump)."""

from __future__ import annotations

import asyncio
import collections
import gc
import importlib.util
import logging
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mitmproxy import http, master
from mitmproxy.addonmanager import AddonManager
from mitmproxy.addons import default_addons
from mitmproxy.addons.script import ScriptLoader
from mitmproxy.proxy import commands, events, layer
from mitmproxy.proxy.layer import Layer
from mitmproxy.proxy.layers.http import HttpStream
from mitmproxy.test import taddons, tflow

from llmitm.addons import patches
from llmitm.addons.patches import (
    connections,
    console_ui,
    cut_streams,
    fallback,
    headers,
    hooks,
    layer_queues,
    options,
    relay_pipe,
    type_checks,
)
from llmitm.addons.patches import master as master_patch
from llmitm.addons.patches.coalesce import coalesce_client_writes
from llmitm.addons.stall import close_server_side

WARNING = "llmitm.addons.patches.fallback"


@pytest.fixture(autouse=True)
def fresh_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts in a process where no patch has reported its fallback yet."""
    monkeypatch.setattr(fallback, "reported", set())


def _warnings(caplog: pytest.LogCaptureFixture, patch: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == WARNING and patch in r.getMessage()]


def _fresh_copy(module: types.ModuleType, name: str) -> Any:
    """Import ``module``'s file again as ``name``: its guarded imports run anew."""
    spec = importlib.util.spec_from_file_location(name, Path(str(module.__file__)))
    assert spec is not None and spec.loader is not None
    copy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copy)
    return copy


# --- cut streams -----------------------------------------------------------------------------


def test_cut_streams_installs_on_this_mitmproxy() -> None:
    assert cut_streams.MISSING is None
    assert cut_streams.install() and cut_streams.install()  # idempotent
    assert HttpStream.handle_protocol_error is cut_streams._handle_protocol_error


def test_cut_streams_without_the_private_events_module_leaves_mitmproxy_as_it_is(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "mitmproxy.proxy.layers.http._events", None)
    before = HttpStream.handle_protocol_error
    copy = _fresh_copy(cut_streams, "llmitm_cut_streams_without_events")  # imports fine
    assert "_events" in copy.MISSING
    with caplog.at_level(logging.WARNING):
        assert not copy.install()
        assert not copy.install()
    assert HttpStream.handle_protocol_error is before  # mitmproxy's own (or the real patch)
    (warning,) = _warnings(caplog, cut_streams.PATCH)
    assert "_events" in warning and "502 page" in warning


def test_cut_streams_without_a_state_it_calls_is_not_applied(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delattr(HttpStream, "check_killed")
    copy = _fresh_copy(cut_streams, "llmitm_cut_streams_without_check_killed")
    with caplog.at_level(logging.WARNING):
        assert not copy.install()
    assert "check_killed" in copy.MISSING
    assert len(_warnings(caplog, cut_streams.PATCH)) == 1


# --- the connection registry (write batching, closing a stalled upstream) -------------------


class _Master:
    def __init__(self, **addons: object) -> None:
        self.addons = types.SimpleNamespace(get=addons.get)


def test_the_registry_check_passes_with_mitmproxys_registry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(connections, "usable", True)
    assert connections.MISSING is None
    assert connections.check(_Master(proxyserver=types.SimpleNamespace(connections={})))
    assert connections._missing_from(type("Handler", (), {})) == (
        "ConnectionHandler.close_connection"
    )


def test_without_the_registry_streams_go_unbatched_and_a_stall_kills_the_flow(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(connections, "usable", True)
    with caplog.at_level(logging.WARNING):
        assert not connections.check(_Master(proxyserver=types.SimpleNamespace()))
        assert not connections.check(_Master())
    (warning,) = _warnings(caplog, connections.PATCH)
    assert "connections registry" in warning and "one by one" in warning

    with taddons.context():
        flow = tflow.tflow()
        assert not coalesce_client_writes(flow)  # written as mitmproxy writes it
        close_server_side(flow)
        assert not flow.live and flow.error is not None  # killed: its resources are freed


def test_a_moved_connection_handler_is_reported(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "mitmproxy.proxy.server", None)
    copy = _fresh_copy(connections, "llmitm_connections_without_server")
    assert copy.MISSING and not copy.usable
    with caplog.at_level(logging.WARNING):
        assert not copy.check(_Master(proxyserver=types.SimpleNamespace(connections={})))
    assert len(_warnings(caplog, copy.PATCH)) == 1
    assert copy.client_writer(tflow.tflow()) is None


# --- indexed headers ----------------------------------------------------------------------------


def test_headers_are_indexed_on_this_mitmproxy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(headers, "usable", True)
    assert headers.check()
    plain = http.Headers(content_type="text/event-stream")
    indexed = headers.indexed_headers(plain)
    assert isinstance(indexed, headers.IndexedHeaders)
    assert indexed.get("Content-Type") == "text/event-stream"


def test_headers_that_change_in_place_are_not_indexed(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(headers, "usable", True)

    def set_in_place(self: http.Headers, key: str, value: str) -> None:
        pass  # a Headers whose mutation keeps its fields object (the index would go stale)

    monkeypatch.setattr(http.Headers, "__setitem__", set_in_place)
    with caplog.at_level(logging.WARNING):
        assert not headers.check()
        assert not headers.check()
    assert len(_warnings(caplog, headers.PATCH)) == 1
    plain = http.Headers(content_type="text/event-stream")
    assert headers.indexed_headers(plain) is plain  # mitmproxy's own, scanned per chunk


# --- the front end ----------------------------------------------------------------------------


def test_the_console_ui_is_told_by_its_class(monkeypatch: pytest.MonkeyPatch) -> None:
    from mitmproxy.tools.console.master import ConsoleMaster

    real = ConsoleMaster.__new__(ConsoleMaster)
    impostor = type("ConsoleMaster", (), {"addons": _Master().addons})()
    assert console_ui.is_console_ui(real)
    assert not console_ui.is_console_ui(impostor)  # isinstance, not the name
    web = _Master(view=object())
    assert console_ui.front_end(web) == "web" and console_ui.front_end(_Master()) is None


def test_without_the_console_class_the_name_tells(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, console_ui.CONSOLE_MODULE, types.ModuleType("renamed"))
    console = type("ConsoleMaster", (), {"addons": _Master().addons})()
    with caplog.at_level(logging.WARNING):
        assert console_ui.front_end(console) == "console"
        assert console_ui.front_end(_Master(view=object())) == "web"
    (warning,) = _warnings(caplog, console_ui.PATCH)
    assert "ConsoleMaster" in warning


def test_redirected_output_is_set_back() -> None:
    logger = types.SimpleNamespace(file="stderr")
    dumper = types.SimpleNamespace(outfp="stdout")
    restore = console_ui.redirect_output(
        _Master(termlog=types.SimpleNamespace(logger=logger), dumper=dumper), sys.stdout
    )
    assert logger.file is sys.stdout and dumper.outfp is sys.stdout
    for owner, attribute, value in restore:
        setattr(owner, attribute, value)
    assert (logger.file, dumper.outfp) == ("stderr", "stdout")
    assert console_ui.redirect_output(_Master(), sys.stdout) == []  # mitmweb: nothing to move


# --- the master's addon order and log handler --------------------------------------------------


def test_llmitm_goes_where_the_script_loader_puts_scripts() -> None:
    ours = [object()]
    chain = master_patch.with_llmitm(default_addons(), ours)
    at = chain.index(ours[0])
    assert isinstance(chain[at - 1], ScriptLoader)


def test_without_a_script_loader_llmitm_goes_last(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "mitmproxy.addons.script", None)
    copy = _fresh_copy(master_patch, "llmitm_master_without_script")
    assert copy.ScriptLoader is None
    ours = [object()]
    defaults = default_addons()
    with caplog.at_level(logging.WARNING):
        assert copy.with_llmitm(defaults, ours) == [*defaults, *ours]
        copy.with_llmitm(defaults, ours)
    assert len(_warnings(caplog, copy.PATCH)) == 1


async def test_a_masters_log_handler_is_found_without_its_private_attribute() -> None:
    current = master.Master(None, event_loop=asyncio.get_running_loop())
    root = logging.getLogger()
    assert any(getattr(h, "master", None) is current for h in root.handlers)
    assert master_patch.uninstall_log_handlers(current) == 1
    assert not any(getattr(h, "master", None) is current for h in root.handlers)
    assert master_patch.uninstall_log_handlers(current) == 0


# --- the start-up checks run once, from one addon -------------------------------------------


def test_llmitm_patches_runs_the_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[str] = []
    monkeypatch.setattr(cut_streams, "install", lambda: ran.append("cut_streams") or True)
    monkeypatch.setattr(headers, "check", lambda: ran.append("headers") or True)
    monkeypatch.setattr(layer_queues, "install", lambda: ran.append("layer_queues") or True)
    monkeypatch.setattr(connections, "check", lambda m: ran.append("connections") or True)
    addon = patches.LlmPatches()
    with taddons.context(addon):
        assert ran == ["cut_streams", "layer_queues", "headers"]  # at load
        addon.running()
    assert ran == ["cut_streams", "layer_queues", "headers", "connections"]


# --- hook dispatch ---------------------------------------------------------------------------


class _Seen:
    """An addon that notes the requests it sees (``halt``: it stops the chain there)."""

    def __init__(self, seen: list[str], name: str, *, halt: bool = False) -> None:
        self.seen, self.label, self.halt = seen, name, halt
        self.name = f"seen {name}"  # mitmproxy's addon names are unique

    def request(self, flow: http.HTTPFlow) -> None:
        self.seen.append(self.label)
        if self.halt:
            from mitmproxy.exceptions import AddonHalt

            raise AddonHalt


class _Broken:
    def request(self, flow: http.HTTPFlow) -> None:
        raise RuntimeError("a broken addon")


class _Silent:
    """No ``request`` hook: the patched dispatch never enters it."""

    def __init__(self, name: str) -> None:
        self.name = name


class _Parent:
    def __init__(self, children: list[Any]) -> None:
        self.addons = children


async def test_hooks_reach_exactly_the_addons_mitmproxy_would_call() -> None:
    from mitmproxy import hooks as mitm_hooks
    from mitmproxy.proxy.layers.http import HttpRequestHook

    assert hooks.MISSING is None
    assert hooks.install() and hooks.install()  # idempotent
    seen: list[str] = []
    with taddons.context() as tctx:
        chain = [
            _Seen(seen, "first"),
            _Silent("silent"),
            _Broken(),  # logged by mitmproxy's safecall; the chain goes on
            _Parent([_Silent("silent child"), _Seen(seen, "child")]),
            _Seen(seen, "halting", halt=True),
            _Seen(seen, "after the halt"),
        ]
        manager = tctx.master.addons
        for addon in chain:
            manager.add(addon)
        entered: list[str] = []
        invoke = manager.invoke_addon

        async def noting(addon: Any, event: Any) -> None:
            entered.append(getattr(addon, "name", type(addon).__name__))
            await invoke(addon, event)

        manager.invoke_addon = noting
        await manager.trigger_event(mitm_hooks.UpdateHook([]))  # only the parent may have it
        await manager.trigger_event(HttpRequestHook(tflow.tflow()))
    assert seen == ["first", "child", "halting"]
    assert AddonManager.trigger_event is hooks._trigger_event
    assert "silent" not in entered  # what made every event cost a visit to every addon


def test_hooks_without_the_addon_manager_method_leave_mitmproxy_as_it_is(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(hooks, "MISSING", "AddonManager.trigger_event")
    with caplog.at_level(logging.WARNING):
        assert not hooks.install()
        assert not hooks.install()
    assert len(_warnings(caplog, hooks.PATCH)) == 1


# --- option reads ----------------------------------------------------------------------------


def test_option_reads_copy_only_what_can_change() -> None:
    from collections.abc import Sequence

    from mitmproxy.optmanager import OptManager

    assert options.MISSING is None
    assert options.install() and options.install()  # idempotent
    opts = OptManager()
    opts.add_option("flag", bool, False, "a flag")
    opts.add_option("port", int, 1, "a number")
    opts.add_option("hosts", Sequence[str], [], "a list")
    assert (opts.flag, opts.port, opts.hosts) == (False, 1, [])  # at their defaults
    opts.update(flag=True, port=8123, hosts=["a"])
    assert (opts.flag, opts.port) == (True, 8123)
    hosts = opts.hosts
    hosts.append("b")  # a copy, as mitmproxy hands out: the option is unchanged
    assert opts.hosts == ["a"]
    assert opts.hosts is not opts.hosts


def test_option_reads_without_the_option_class_leave_mitmproxy_as_it_is(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(options, "MISSING", "_Option")
    with caplog.at_level(logging.WARNING):
        assert not options.install()
        assert not options.install()
    assert len(_warnings(caplog, options.PATCH)) == 1


# --- type checks -----------------------------------------------------------------------------


def _cyclic_garbage_of_a_streamed_response() -> int:
    """How many objects a response with no body, trailers or end leaves to the collector."""
    gc.collect()
    gc.disable()
    try:
        response = http.Response.make(200)
        response.data.content = None
        response.data = http.ResponseData(**vars(response.data))  # its check runs again
        del response
        return gc.collect()
    finally:
        gc.enable()


def test_type_checks_leave_no_cycle_and_agree_with_mitmproxys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mitmproxy.utils import typecheck

    monkeypatch.setattr(typecheck, "check_option_type", type_checks._original)
    assert _cyclic_garbage_of_a_streamed_response() > 0  # mitmproxy's own: frames in a cycle
    assert type_checks.install() and type_checks.install()  # idempotent
    assert typecheck.check_option_type is type_checks.check_option_type
    assert _cyclic_garbage_of_a_streamed_response() == 0
    for probe in type_checks._probes():
        assert type_checks._outcome(type_checks.check_option_type, probe) == (
            type_checks._outcome(type_checks._original, probe)
        ), probe
    with pytest.raises(TypeError, match=re.escape("Expected bytes | None for content")):
        http.ResponseData(**{**vars(http.Response.make(200).data), "content": "text"})


def test_type_checks_that_disagree_leave_mitmproxys_in_place(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from mitmproxy.utils import typecheck

    monkeypatch.setattr(typecheck, "check_option_type", type_checks._original)
    monkeypatch.setattr(type_checks, "_mismatch", lambda name, value, typeinfo: None)
    with caplog.at_level(logging.WARNING):
        assert not type_checks.install()
    assert typecheck.check_option_type is type_checks._original
    monkeypatch.setattr(type_checks, "MISSING", "mitmproxy.utils.typecheck")
    with caplog.at_level(logging.WARNING):
        assert not type_checks.install()
    assert len(_warnings(caplog, type_checks.PATCH)) == 1
    assert typecheck.check_option_type is type_checks._original


# --- layer event queues made when needed ----------------------------------------------------


class _Blocking(commands.Command):
    blocking = True


@dataclass
class _BlockingCompleted(events.CommandCompleted):
    command: _Blocking
    reply: None


class _Note(events.Event):
    pass


class _Waits(Layer):
    """A layer that waits on a blocking command when it starts and notes what it handles."""

    def __init__(self) -> None:
        super().__init__(types.SimpleNamespace(layers=[], options=types.SimpleNamespace()))
        self.handled: list[events.Event] = []

    def _handle_event(self, event: events.Event) -> layer.CommandGenerator[None]:
        self.handled.append(event)
        if isinstance(event, events.Start):
            yield _Blocking()


def test_a_layer_makes_its_event_queue_only_when_an_event_waits() -> None:
    assert layer_queues.MISSING is None
    assert layer_queues.install() and layer_queues.install()  # idempotent
    waits = _Waits()
    assert not waits._paused_event_queue
    assert layer_queues._KEY not in vars(waits)  # no deque held by a layer nothing paused

    (blocking,) = waits.handle_event(events.Start())
    first, second = _Note(), _Note()
    assert not list(waits.handle_event(first)) and not list(waits.handle_event(second))
    assert list(waits._paused_event_queue) == [first, second]  # queued while paused

    assert not list(waits.handle_event(_BlockingCompleted(blocking, None)))
    assert waits.handled[1:] == [first, second]  # replayed in order once it resumed
    assert not waits._paused_event_queue


def test_a_layer_made_before_the_patch_keeps_what_it_queued(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(Layer, "_paused_event_queue", raising=False)
    waits = _Waits()  # a layer of a connection open when llmitm's script (re)loads
    (blocking,) = waits.handle_event(events.Start())
    note = _Note()
    assert not list(waits.handle_event(note))
    assert layer_queues.install()
    assert not list(waits.handle_event(_BlockingCompleted(blocking, None)))
    assert waits.handled[1:] == [note]


def test_layers_that_start_otherwise_keep_their_deques(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delattr(Layer, "_paused_event_queue", raising=False)
    monkeypatch.setattr(layer_queues, "_probe_queue", lambda: ([], _Waits()))
    with caplog.at_level(logging.WARNING):
        assert not layer_queues.install()
        assert not layer_queues.install()
    assert len(_warnings(caplog, layer_queues.PATCH)) == 1
    assert "_paused_event_queue" not in vars(Layer)
    assert type(_Waits()._paused_event_queue) is collections.deque


# --- mitmproxy's connections to the relay, in memory -----------------------------------------


async def test_the_relays_address_is_reached_in_memory_and_any_other_by_tcp() -> None:
    from mitmproxy.proxy import server as proxy_server

    from llmitm.relay.pipe import PipeTransport
    from llmitm.relay.server import RelayServer

    assert relay_pipe.MISSING is None
    relay = RelayServer()
    await relay.start()
    try:
        assert relay_pipe.serve(relay.address, relay.connect)
        assert relay_pipe.install()  # idempotent
        opened = proxy_server.asyncio.open_connection  # what mitmproxy's server module calls
        _, writer = await opened(*relay.address, local_addr=None)
        assert isinstance(writer.transport, PipeTransport)
        assert writer.get_extra_info("peername") == relay.address
        writer.close()
        relay_pipe.stop(relay.address)
        _, writer = await opened(*relay.address)  # no longer served: the relay's listener
        assert not isinstance(writer.transport, PipeTransport)
        writer.close()
    finally:
        relay_pipe.stop(relay.address)
        relay.close()


def test_without_mitmproxys_server_module_the_relay_is_reached_by_tcp(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "mitmproxy.proxy.server", None)
    copy = _fresh_copy(relay_pipe, "llmitm_relay_pipe_without_server")
    assert copy.MISSING
    with caplog.at_level(logging.WARNING):
        assert not copy.serve(("127.0.0.1", 1), lambda: None)
        assert not copy.install()
    (warning,) = _warnings(caplog, copy.PATCH)
    assert "loopback TCP" in warning
