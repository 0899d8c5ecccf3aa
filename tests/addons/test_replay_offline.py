"""The recorder's replay backstop: in ``replay`` mode no server connection is dialled but
llmitm's own relay; other modes dial as usual. And a request that is no LLM call is answered
in OpenAI's shape, not forwarded."""

from __future__ import annotations

import orjson
import pytest
from mitmproxy import connection
from mitmproxy.proxy.server_hooks import ServerConnectionHookData
from mitmproxy.test import taddons, tflow

from llmitm.addons.record import LlmFlowRecorder
from llmitm.addons.relay import LlmRelay
from llmitm.addons.settings import LlmitmSettings
from llmitm.addons.store import LlmStore


def hook(host: str, port: int) -> ServerConnectionHookData:
    server = connection.Server(address=(host, port))
    return ServerConnectionHookData(server=server, client=tflow.tclient_conn())


async def test_replay_refuses_every_dial_but_the_relay() -> None:
    relay = LlmRelay()
    addon = LlmFlowRecorder(LlmStore(LlmitmSettings()), relay)
    with taddons.context(addon) as tctx:
        relay.running()
        server = await relay.ready()
        try:
            tctx.configure(addon, llmitm_record="replay")
            upstream = hook("api.openai.com", 443)
            addon.server_connect(upstream)
            assert upstream.server.error and "replay mode" in upstream.server.error
            own = hook("127.0.0.1", server.port)
            addon.server_connect(own)
            assert own.server.error is None
            tctx.configure(addon, llmitm_record="replay-or-record")  # misses go upstream
            upstream = hook("api.openai.com", 443)
            addon.server_connect(upstream)
            assert upstream.server.error is None
        finally:
            relay.done()


@pytest.mark.parametrize("path", ["/v1/models", "/health", "/v1/embeddings"])
def test_replay_answers_a_request_that_is_no_llm_call(path: str) -> None:
    addon = LlmFlowRecorder(LlmStore(LlmitmSettings()), LlmRelay())
    with taddons.context(addon) as tctx:
        tctx.configure(addon, llmitm_record="replay")
        flow = tflow.tflow()
        flow.request.path = path
        addon.request(flow)
        assert flow.response is not None and flow.response.status_code == 502
        assert orjson.loads(flow.response.content or b"")["error"]["code"] == "replay_offline"
