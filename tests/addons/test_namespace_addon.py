"""``LlmNamespace``: the DNS answers and the re-addressing ``llmitm run --transparent`` relies
on, checked through mitmproxy's own test harness and DNS wire format."""

from __future__ import annotations

from ipaddress import IPv4Address

import pytest
from mitmproxy import dns, exceptions
from mitmproxy.proxy import server_hooks
from mitmproxy.proxy.mode_specs import ProxyMode
from mitmproxy.test import taddons, tflow, tutils

from llmitm.addons.namespace import LlmNamespace

ADDRESS = "198.18.7.1"


def question(name: str, kind: int) -> dns.DNSMessage:
    return tutils.tdnsreq(questions=[dns.Question(name, kind, dns.classes.IN)])


def answered(addon: LlmNamespace, request: dns.DNSMessage, mode: str = "dns") -> dns.DNSFlow:
    flow = tflow.tdnsflow(req=request)
    flow.client_conn.proxy_mode = ProxyMode.parse(mode)
    addon.dns_request(flow)
    return flow


@pytest.fixture
def addon():
    namespace = LlmNamespace()
    with taddons.context(namespace) as context:
        context.configure(namespace, llmitm_namespace_address=ADDRESS)
        yield namespace


def test_every_name_resolves_to_the_namespace_address(addon: LlmNamespace) -> None:
    for name in ("api.openai.com", "my-resource.openai.azure.com", "nowhere.invalid"):
        flow = answered(addon, question(name, dns.types.A))
        assert flow.response is not None
        # Through the wire format and back, as the client will read it.
        response = dns.DNSMessage.unpack(flow.response.packed)
        assert response.response_code == dns.response_codes.NOERROR
        assert response.id == flow.request.id
        assert [(a.name, a.type, a.ipv4_address) for a in response.answers] == [
            (name, dns.types.A, IPv4Address(ADDRESS))
        ]


@pytest.mark.parametrize("kind", [dns.types.AAAA, dns.types.HTTPS, dns.types.MX, dns.types.TXT])
def test_other_query_types_get_no_records_so_clients_stay_on_ipv4(
    addon: LlmNamespace, kind: int
) -> None:
    flow = answered(addon, question("api.openai.com", kind))
    assert flow.response is not None
    assert flow.response.response_code == dns.response_codes.NOERROR
    assert flow.response.answers == []


def test_a_non_query_is_not_implemented(addon: LlmNamespace) -> None:
    flow = answered(addon, tutils.tdnsreq(op_code=dns.op_codes.STATUS))
    assert flow.response is not None
    assert flow.response.response_code == dns.response_codes.NOTIMP


def test_dns_outside_a_dns_listener_or_without_the_option_is_left_alone() -> None:
    namespace = LlmNamespace()
    with taddons.context(namespace) as context:
        assert answered(namespace, question("api.openai.com", dns.types.A)).response is None
        context.configure(namespace, llmitm_namespace_address=ADDRESS)
        flow = answered(namespace, question("api.openai.com", dns.types.A), mode="wireguard")
        assert flow.response is None


def test_a_bad_address_is_refused_by_option_validation() -> None:
    namespace = LlmNamespace()
    with (
        taddons.context(namespace) as context,
        pytest.raises(exceptions.OptionsError, match="must be an IPv4 address"),
    ):
        context.configure(namespace, llmitm_namespace_address="api.openai.com")


def test_a_request_to_the_namespace_address_goes_to_its_host_header(addon: LlmNamespace) -> None:
    flow = tflow.tflow()
    flow.request.host, flow.request.port, flow.request.scheme = ADDRESS, 443, "https"
    flow.request.headers["Host"] = "example.org"
    addon.request(flow)
    assert (flow.request.host, flow.request.port) == ("example.org", 443)
    assert flow.request.headers["Host"] == "example.org"


def test_other_requests_are_not_touched(addon: LlmNamespace) -> None:
    flow = tflow.tflow()
    flow.request.host = "127.0.0.1"
    flow.request.headers["Host"] = "example.org"
    addon.request(flow)
    assert flow.request.host == "127.0.0.1"
    by_address = tflow.tflow()
    by_address.request.host = ADDRESS
    by_address.request.headers["Host"] = ADDRESS  # nothing better to go to
    addon.request(by_address)
    assert by_address.request.host == ADDRESS


def test_a_connection_left_addressed_to_the_namespace_is_refused(addon: LlmNamespace) -> None:
    stuck = server_hooks.ServerConnectionHookData(
        server=tflow.tserver_conn(), client=tflow.tclient_conn()
    )
    stuck.server.address = (ADDRESS, 5432)
    addon.server_connect(stuck)
    assert stuck.server.error and "no destination" in stuck.server.error
    elsewhere = server_hooks.ServerConnectionHookData(
        server=tflow.tserver_conn(), client=tflow.tclient_conn()
    )
    elsewhere.server.address = ("example.org", 443)
    addon.server_connect(elsewhere)
    assert elsewhere.server.error is None
