"""The stop drain: ``done`` waits for the flows in flight at the stop, within the grace."""

from __future__ import annotations

import asyncio

import pytest
from mitmproxy.test import taddons, tflow

from llmitm.addons.drain import LlmDrain


async def test_nothing_in_flight_stops_at_once() -> None:
    addon = LlmDrain()
    with taddons.context(addon):
        finished = tflow.tflow(resp=True)
        addon.requestheaders(finished)
        addon.response(finished)
        assert addon.done() is None


async def test_the_stop_waits_for_each_flow_in_flight_to_end() -> None:
    addon = LlmDrain()
    with taddons.context(addon):
        answered, failed = tflow.tflow(resp=True), tflow.tflow(err=True)
        for flow in (answered, failed):
            addon.requestheaders(flow)
        drain = addon.done()
        assert drain is not None
        later = tflow.tflow()  # started after the stop: not waited for
        addon.requestheaders(later)
        addon.response(answered)
        await asyncio.sleep(0.01)
        assert not drain.done()
        addon.error(failed)
        await asyncio.wait_for(drain, 1)


async def test_the_grace_bounds_the_wait(caplog: pytest.LogCaptureFixture) -> None:
    addon = LlmDrain()
    with taddons.context(addon) as tctx:
        tctx.configure(addon, llmitm_stop_grace=0.05)
        addon.requestheaders(tflow.tflow())
        drain = addon.done()
        assert drain is not None
        await asyncio.wait_for(drain, 1)
    assert "1 flow(s) still in flight after 0.05 s" in caplog.text


async def test_a_zero_grace_stops_at_once() -> None:
    addon = LlmDrain()
    with taddons.context(addon) as tctx:
        tctx.configure(addon, llmitm_stop_grace=0)
        addon.requestheaders(tflow.tflow())
        assert addon.done() is None
