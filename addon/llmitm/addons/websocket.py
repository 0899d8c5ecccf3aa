"""``llmitm_websocket``: the Responses API's WebSocket front door (Codex's default transport,
openai-python's ``responses.connect()``).

- ``serve`` (default): llmitm answers the upgrade itself. The flow goes to the relay, whose
  socket job speaks the protocol and sends each ``response.create`` back through this proxy's
  own listener as an ordinary streamed ``POST``; this addon, first in line, checks that call's
  token and restores the HTTPS target the socket was opened to, so every other addon sees a
  plain Responses call. The socket itself is tunnelled as raw TCP between the client and the
  relay, and the tunnel's flow keeps only the last chunk it relayed: a client resends its
  whole history on every turn, so the chunks of a long session would add up to every history
  it ever sent, held for as long as the socket stays open, when each call's flow has its own.
- ``refuse``: the upgrade is answered ``426``, which makes Codex use HTTPS at once.
- ``pass``: the socket goes to its host untouched (not routed, not recorded).

Where no listener can carry the calls back (a mode without a regular or reverse listener),
``serve`` refuses too.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass

import orjson
from mitmproxy import ctx, exceptions, http, tcp
from mitmproxy.addonmanager import Loader

from llmitm.addons.relay import LlmRelay
from llmitm.addons.state import SOCKET_KEY
from llmitm.relay.client import Proxy
from llmitm.relay.socket_job import ResponsesSocketJob, SocketOrigin
from llmitm.websocket.handshake import call_headers, is_upgrade, refusal
from llmitm.wire.errors import ApiError, openai_error_body
from llmitm.wire.paths import classify_path

logger = logging.getLogger(__name__)

CALL_HEADER = "x-llmitm-socket"
"""Marks a call a socket job sends back through the proxy; its value is the socket's token."""
TUNNEL_KEY = "llmitm_socket_tunnel"
"""Marks the raw TCP flow that carries a served socket between its client and the relay."""
POLICIES = ("serve", "refuse", "pass")
_LOOPBACK = ("127.0.0.1", "::1", "::ffff:127.0.0.1")


@dataclass(frozen=True, slots=True)
class _Target:
    scheme: str
    host: str
    port: int


class LlmWebSocket:
    name = "llmitm_websocket"

    def __init__(self, relay: LlmRelay) -> None:
        self.relay = relay
        self.policy = "serve"
        self._targets: dict[str, _Target] = {}
        """Per open socket's token, the target its calls go to."""

    def load(self, loader: Loader) -> None:
        loader.add_option(
            "llmitm_websocket",
            str,
            "serve",
            "Responses WebSockets (Codex's default transport): serve them through llmitm "
            "(routed, translated, recorded), refuse them (426: clients use HTTPS), or pass "
            "them to their host untouched.",
            choices=POLICIES,
        )

    def configure(self, updated: set[str]) -> None:
        if "llmitm_websocket" in updated:
            policy = ctx.options.llmitm_websocket
            if policy not in POLICIES:
                raise exceptions.OptionsError(f"llmitm_websocket must be one of {POLICIES}")
            self.policy = policy

    async def request(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error or not flow.live:
            return
        token = flow.request.headers.get(CALL_HEADER)
        if token is not None:
            self._restore_call(flow, token)
        elif flow.request.method == "GET" and is_upgrade(flow.request.headers.items()):
            classified = classify_path(flow.request.path)
            if classified is not None and classified.api == "responses":
                await self._upgrade(flow)

    async def _upgrade(self, flow: http.HTTPFlow) -> None:
        if self.policy == "pass":
            return
        via = _loopback(flow) if self.policy == "serve" else None
        if via is None:
            why = "llmitm_websocket=refuse" if self.policy == "refuse" else _no_listener(flow)
            _refuse(flow, why)
            return
        try:
            server = await self.relay.ready()
        except RuntimeError:
            _refuse(flow, "llmitm's relay is not running")
            return
        token = secrets.token_urlsafe(18)
        request = flow.request
        origin = SocketOrigin(
            url=request.url,
            headers=[*call_headers(request.headers.items()), (CALL_HEADER, token)],
            proxy=via,
        )
        self._targets[token] = _Target(request.scheme, request.host, request.port)
        job = ResponsesSocketJob(
            origin, closed=lambda: self._targets.pop(token, None), client=server.client
        )
        flow.metadata[SOCKET_KEY] = token
        self.relay.point(flow, server.register(job))

    def response(self, flow: http.HTTPFlow) -> None:
        token = flow.metadata.get(SOCKET_KEY)
        if token is None:
            return
        if flow.websocket is None:
            self._targets.pop(token, None)  # the relay did not open the socket
        elif ctx.options.rawtcp:
            # mitmproxy parses every WebSocket message of both sides and runs a hook through
            # all addons for each: 4x the wall time and ~17x the proxy CPU of the same stream
            # as SSE. The socket's calls are ordinary flows (each event visible as SSE
            # there), so its frames go through as a raw tunnel; without raw TCP, mitmproxy
            # would close the connection instead.
            flow.websocket = None

    def tcp_start(self, flow: tcp.TCPFlow) -> None:
        server = self.relay.listening()
        if server is not None and flow.server_conn.address == server.address:
            flow.metadata[TUNNEL_KEY] = True

    def tcp_message(self, flow: tcp.TCPFlow) -> None:
        # mitmproxy relays the chunk after this hook, from its own reference to it.
        if flow.metadata.get(TUNNEL_KEY):
            del flow.messages[:-1]

    def error(self, flow: http.HTTPFlow) -> None:
        token = flow.metadata.get(SOCKET_KEY)
        if token is not None and flow.websocket is None:
            self._targets.pop(token, None)  # the socket never opened

    def _restore_call(self, flow: http.HTTPFlow, token: str) -> None:
        target = self._targets.get(token)
        peer = flow.client_conn.peername
        if target is None or peer is None or peer[0] not in _LOOPBACK:
            error = ApiError(
                message="Unknown llmitm WebSocket call token.",
                type="invalid_request_error",
                code="invalid_socket_token",
                status=403,
            )
            flow.response = http.Response.make(
                403, orjson.dumps(openai_error_body(error)), {"content-type": "application/json"}
            )
            return
        request = flow.request
        del request.headers[CALL_HEADER]
        request.scheme, request.host, request.port = target.scheme, target.host, target.port


def _loopback(flow: http.HTTPFlow) -> Proxy | None:
    """The listener through which a socket job can send its calls: the one the client came
    in by when it is a regular, upstream or reverse listener, else any regular one."""
    mode = flow.client_conn.proxy_mode
    sockname = flow.client_conn.sockname
    if mode.type_name in ("regular", "upstream", "reverse") and sockname:
        host = _reachable(sockname[0])
        return Proxy(host, sockname[1], absolute=mode.type_name != "reverse")
    proxyserver = ctx.master.addons.get("proxyserver")
    for server in proxyserver.servers:
        if server.mode.type_name == "regular" and server.listen_addrs:
            host, port = server.listen_addrs[0][:2]
            return Proxy(_reachable(host), port, absolute=True)
    return None


def _refuse(flow: http.HTTPFlow, why: str) -> None:
    status, headers, body = refusal(why)
    flow.response = http.Response.make(status, body, headers)


def _reachable(host: str) -> str:
    return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host


def _no_listener(flow: http.HTTPFlow) -> str:
    mode = flow.client_conn.proxy_mode.type_name
    return f"no regular or reverse listener carries its calls in {mode} mode"
