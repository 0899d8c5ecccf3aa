"""The relay addon forgets a flow's registration when the flow ends, whichever way it ends,
so a job that was never used does not stay registered (with the request it holds)."""

from __future__ import annotations

import pytest
from mitmproxy.test import tflow

from llmitm.addons.relay import LlmRelay
from llmitm.relay.client import UpstreamRequest
from llmitm.relay.server import RelayServer


def _relay() -> tuple[LlmRelay, RelayServer]:
    relay = LlmRelay()
    relay.server = RelayServer()  # registrations need no listening socket
    relay.server.port = 8
    return relay, relay.server


def _job() -> UpstreamRequest:
    return UpstreamRequest("POST", "http://127.0.0.1:9/v1/chat/completions", [], b"{}")


@pytest.mark.parametrize("end", ["error", "response"])
def test_a_registration_is_forgotten_when_its_flow_ends_unused(end: str) -> None:
    relay, server = _relay()
    flow = tflow.tflow()
    relay.point(flow, server.register(_job()))
    assert server.stats()["registered"] == 1
    getattr(relay, end)(flow)  # aborted, killed or answered locally: never sent to the relay
    assert server.stats() == {
        "registered": 0,
        "connections": 0,
        "kept": 0,
        "accepted": 0,
        "pooled": 0,
    }


def test_re_pointing_a_flow_forgets_its_first_registration() -> None:
    relay, server = _relay()
    flow = tflow.tflow()
    relay.point(flow, server.register(_job()))
    second = server.register(_job())
    relay.point(flow, second)
    assert server.stats()["registered"] == 1
    assert flow.request.url == second
    relay.error(flow)
    assert server.stats()["registered"] == 0


def test_flows_never_pointed_and_a_stopped_relay_are_left_alone() -> None:
    relay, server = _relay()
    kept = server.register(_job())
    relay.response(tflow.tflow())
    assert server.stats()["registered"] == 1
    flow = tflow.tflow()
    relay.point(flow, kept)
    relay.done()
    relay.error(flow)  # after done(): nothing to forget in, and no error
