"""The WebSocket front door in mitmproxy (taddons, tflow): which upgrades llmitm serves,
refuses or passes, and how a socket's calls get their target back."""

from __future__ import annotations

import orjson
import pytest
from mitmproxy import exceptions, http, tcp
from mitmproxy.addons.proxyserver import Proxyserver
from mitmproxy.proxy.mode_specs import ProxyMode
from mitmproxy.test import taddons, tflow

from llmitm.addons.relay import LlmRelay
from llmitm.addons.state import SOCKET_KEY
from llmitm.addons.websocket import CALL_HEADER, LlmWebSocket
from llmitm.relay.socket_job import ResponsesSocketJob


def upgrade(path: str = "/v1/responses", mode: str = "regular") -> http.HTTPFlow:
    flow = tflow.tflow()
    flow.request = http.Request.make(
        "GET",
        f"https://api.openai.com{path}",
        headers={
            "upgrade": "websocket",
            "connection": "Upgrade",
            "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==",
            "sec-websocket-version": "13",
            "authorization": "Bearer sk-client",
        },
    )
    flow.client_conn.proxy_mode = ProxyMode.parse(mode)
    flow.client_conn.sockname = ("127.0.0.1", 8080)
    return flow


async def served(policy: str, flow: http.HTTPFlow) -> LlmWebSocket:
    relay = LlmRelay()
    socket = LlmWebSocket(relay)
    with taddons.context(Proxyserver(), relay, socket) as tctx:
        tctx.configure(socket, llmitm_websocket=policy)
        await relay.running()
        try:
            await socket.request(flow)
        finally:
            relay.done()
    return socket


async def test_serve_points_the_upgrade_at_the_relay_with_a_token() -> None:
    flow = upgrade()
    socket = await served("serve", flow)
    assert flow.response is None
    assert flow.request.host == "127.0.0.1" and flow.request.path.startswith("/llmitm-relay/")
    assert flow.request.headers["upgrade"] == "websocket"  # the relay answers the handshake
    token = flow.metadata[SOCKET_KEY]
    assert token in socket._targets


@pytest.mark.parametrize(
    ("mode", "absolute"), [("regular", True), ("reverse:https://api.openai.com", False)]
)
async def test_the_calls_go_back_through_the_listener_the_client_came_in_by(
    mode: str, absolute: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs: list[ResponsesSocketJob] = []
    original = LlmRelay.point

    def capture(self: LlmRelay, flow: http.HTTPFlow, url: str) -> None:
        jobs.append(self.server._jobs[url.rpartition("/")[2]])  # type: ignore[union-attr]
        original(self, flow, url)

    monkeypatch.setattr(LlmRelay, "point", capture)
    await served("serve", upgrade(mode=mode))
    (job,) = jobs
    origin = job.origin
    assert (origin.proxy.host, origin.proxy.port, origin.proxy.absolute) == (
        "127.0.0.1",
        8080,
        absolute,
    )
    assert origin.url == "https://api.openai.com/v1/responses"
    names = [name.lower() for name, _ in origin.headers]
    assert "authorization" in names and CALL_HEADER in names
    assert "upgrade" not in names and "sec-websocket-key" not in names


async def test_refuse_answers_426_in_the_openai_shape() -> None:
    flow = upgrade()
    await served("refuse", flow)
    assert flow.response is not None and flow.response.status_code == 426
    assert orjson.loads(flow.response.content)["error"]["code"] == "websocket_not_served"


async def test_a_mode_without_a_listener_for_the_calls_refuses() -> None:
    flow = upgrade(mode="socks5")
    await served("serve", flow)  # the context's proxyserver has no regular listener
    assert flow.response is not None and flow.response.status_code == 426
    assert "socks5" in orjson.loads(flow.response.content)["error"]["message"]


async def test_pass_and_other_sockets_are_left_alone() -> None:
    for policy, flow in (
        ("pass", upgrade()),
        ("serve", upgrade("/v1/realtime")),
        ("serve", upgrade("/v1/chat/completions")),
    ):
        await served(policy, flow)
        assert flow.response is None and flow.request.host == "api.openai.com", policy


async def test_a_call_gets_its_target_back_and_a_forged_token_is_refused() -> None:
    flow = upgrade()
    socket = await served("serve", flow)
    token = flow.metadata[SOCKET_KEY]

    call = tflow.tflow()
    call.request = http.Request.make(
        "POST", "http://api.openai.com/v1/responses", b"{}", {CALL_HEADER: token}
    )
    call.client_conn.peername = ("127.0.0.1", 50000)
    with taddons.context(socket):
        await socket.request(call)
    assert call.response is None
    assert (call.request.scheme, call.request.host, call.request.port) == (
        "https",
        "api.openai.com",
        443,
    )
    assert CALL_HEADER not in call.request.headers

    for peer, value in ((("127.0.0.1", 1), "forged"), (("192.0.2.7", 1), token)):
        other = tflow.tflow()
        other.request = http.Request.make(
            "POST", "http://api.openai.com/v1/responses", b"{}", {CALL_HEADER: value}
        )
        other.client_conn.peername = peer
        with taddons.context(socket):
            await socket.request(other)
        assert other.response is not None and other.response.status_code == 403


async def test_the_opened_socket_is_tunnelled_and_a_failed_one_forgotten() -> None:
    flow = upgrade()
    socket = await served("serve", flow)
    token = flow.metadata[SOCKET_KEY]
    flow.response = http.Response.make(101, b"", {"upgrade": "websocket"})
    flow.websocket = object()  # type: ignore[assignment]  # as mitmproxy sets it on a 101
    with taddons.context(socket):
        socket.response(flow)
    assert flow.websocket is None  # raw TCP from here on
    assert token in socket._targets  # the socket is open: its calls still need it

    failed = upgrade()
    socket = await served("serve", failed)
    token = failed.metadata[SOCKET_KEY]
    failed.response = http.Response.make(404, b"{}")
    with taddons.context(socket):
        socket.response(failed)
    assert token not in socket._targets


def test_a_bad_policy_is_refused_at_configure() -> None:
    socket = LlmWebSocket(LlmRelay())
    with taddons.context(socket) as tctx, pytest.raises(exceptions.OptionsError):
        tctx.configure(socket, llmitm_websocket="sometimes")


async def test_the_tunnel_keeps_only_the_last_chunk_it_relayed() -> None:
    """A session resends its whole history every turn: the tunnel's flow must not hold all of
    it while the socket stays open (each call's flow has its own)."""
    relay = LlmRelay()
    socket = LlmWebSocket(relay)
    with taddons.context(Proxyserver(), relay, socket):
        await relay.running()
        try:
            server = relay.listening()
            assert server is not None
            tunnel, other = tflow.ttcpflow(), tflow.ttcpflow()
            tunnel.server_conn.address = server.address
            other.server_conn.address = ("example.com", 443)
            for flow in (tunnel, other):
                flow.messages = []
                socket.tcp_start(flow)
                for turn in range(3):
                    flow.messages.append(tcp.TCPMessage(turn % 2 == 0, b"history %d" % turn))
                    socket.tcp_message(flow)
        finally:
            relay.done()
    assert [m.content for m in tunnel.messages] == [b"history 2"]  # what is being relayed
    assert len(other.messages) == 3  # any other TCP flow is mitmproxy's as it was
