"""``llmitm_namespace_address``: the proxy's half of ``llmitm run --transparent``.

The command's namespace asks llmitm's DNS listener for every name; each A query is answered with
this one address (every other query type with no records, so clients stay on IPv4), and every
TCP connection to it is redirected to llmitm. A request that arrives addressed to it goes to the
host its Host header names, as it would through a regular proxy; routed requests are re-pointed
by the router as usual. A connection still addressed to it (a raw TCP stream, a request naming
no host) has nowhere to go and is refused at once. Empty (the default): the addon does nothing.
"""

from __future__ import annotations

import logging
from ipaddress import IPv4Address

from mitmproxy import ctx, dns, exceptions, http
from mitmproxy.addonmanager import Loader
from mitmproxy.proxy import mode_specs, server_hooks

logger = logging.getLogger(__name__)
TTL_S = 60


class LlmNamespace:
    name = "llmitm_namespace"

    def __init__(self) -> None:
        self.address: IPv4Address | None = None

    def load(self, loader: Loader) -> None:
        loader.add_option(
            "llmitm_namespace_address",
            str,
            "",
            "The address DNS answers for every name and connections to which go to their Host "
            "header's host (set by llmitm run --transparent).",
        )

    def configure(self, updated: set[str]) -> None:
        if "llmitm_namespace_address" not in updated:
            return
        value = ctx.options.llmitm_namespace_address
        try:
            self.address = IPv4Address(value) if value else None
        except ValueError:
            raise exceptions.OptionsError(
                f"llmitm_namespace_address must be an IPv4 address, not {value!r}"
            ) from None

    def dns_request(self, flow: dns.DNSFlow) -> None:
        if self.address is None or flow.response or flow.error:
            return
        if not isinstance(flow.client_conn.proxy_mode, mode_specs.DnsMode):
            return
        question = flow.request.question
        if flow.request.op_code != dns.op_codes.QUERY or question is None:
            flow.response = flow.request.fail(dns.response_codes.NOTIMP)
        elif question.type == dns.types.A and question.class_ == dns.classes.IN:
            record = dns.ResourceRecord.A(question.name, self.address, ttl=TTL_S)
            flow.response = flow.request.succeed([record])
        else:
            flow.response = flow.request.succeed([])

    def request(self, flow: http.HTTPFlow) -> None:
        if self.address is None or flow.request.host != str(self.address):
            return
        name = flow.request.pretty_host
        if name != flow.request.host:
            flow.request.host = name

    def server_connect(self, data: server_hooks.ServerConnectionHookData) -> None:
        if self.address is None or not data.server.address:
            return
        if data.server.address[0] == str(self.address):
            data.server.error = (
                "no destination: the connection names only the namespace address "
                f"{self.address} (llmitm run --transparent)"
            )
