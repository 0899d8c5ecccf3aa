"""Recording costs the request path nothing but references: in record mode the client's
request is redacted and keyed after the flow, on the recorder's worker thread, and the record
reaches the recorder (and the store) on the event loop — redacted, as before. A replaying
mode still keys the request at once: its lookup needs the key before answering."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import orjson
import pytest
from mitmproxy import http
from mitmproxy.test import taddons, tflow

from llmitm.addons.record import LlmFlowRecorder, LlmRecordTap, recording_id
from llmitm.addons.record import tap as tap_module
from llmitm.addons.record.flows import capture_of
from llmitm.addons.relay import LlmRelay
from llmitm.addons.settings import LlmitmSettings
from llmitm.addons.store import LlmStore
from llmitm.replay.keys import match_key
from llmitm.replay.model import Interaction
from llmitm.wire.redact import redact_body

SECRET = "sk-proj-" + "Zq9Xw8Vu" * 5
BODY = orjson.dumps(
    {"model": "m", "messages": [{"role": "user", "content": f"my key is {SECRET}"}]}
)


def chat_flow() -> http.HTTPFlow:
    flow = tflow.tflow()
    flow.request.method = "POST"
    flow.request.path = "/v1/chat/completions"
    flow.request.headers["authorization"] = f"Bearer {SECRET}"
    flow.request.content = BODY
    return flow


def run_flow(recorder: LlmFlowRecorder, tap: LlmRecordTap, flow: http.HTTPFlow) -> None:
    """The recording hooks a forwarded, non-streamed flow meets, in order."""
    recorder.request(flow)
    tap.request(flow)
    flow.response = http.Response.make(200, b'{"id": "chatcmpl-1", "object": "chat.completion"}')
    recorder.responseheaders(flow)
    tap.responseheaders(flow)
    recorder.response(flow)
    tap.response(flow)


class Kept:
    """The records the recorder is handed, and the threads it is handed them on."""

    def __init__(self) -> None:
        self.records: list[Interaction] = []
        self.threads: list[threading.Thread] = []

    def __call__(self, interaction: Interaction) -> Interaction:
        self.records.append(interaction)
        self.threads.append(threading.current_thread())
        return interaction


def recording() -> tuple[LlmFlowRecorder, LlmRecordTap, Kept]:
    recorder = LlmFlowRecorder(LlmStore(LlmitmSettings()), LlmRelay())
    kept = Kept()
    recorder.before_record = kept
    return recorder, LlmRecordTap(recorder), kept


def assert_redacted_and_keyed(interaction: Interaction) -> None:
    for message in interaction.legs.values():
        assert SECRET.encode() not in (message.content or b"")
        assert all(SECRET not in value for _, value in message.headers)
    assert SECRET not in interaction.canonical
    expected = match_key("POST", "/v1/chat/completions", [], redact_body(BODY))
    assert interaction.key == expected.key


async def test_record_mode_keys_and_redacts_after_the_flow_off_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built_on: list[threading.Thread] = []
    build = tap_module.build_interaction

    def noting(*args: Any, **kwargs: Any) -> Interaction:
        built_on.append(threading.current_thread())
        return build(*args, **kwargs)

    monkeypatch.setattr(tap_module, "build_interaction", noting)
    recorder, tap, kept = recording()
    with taddons.context(recorder, tap) as tctx:
        tctx.configure(recorder, llmitm_record="record")
        flow = chat_flow()
        recorder.request(flow)
        capture = capture_of(flow)
        assert capture is not None and capture.key is None and capture.client_req is None
        assert capture.unseen is not None and capture.unseen.content is flow.request.raw_content
        tap.request(flow)
        flow.response = http.Response.make(200, b'{"id": "chatcmpl-1"}')
        for hook in (recorder.responseheaders, tap.responseheaders, recorder.response):
            hook(flow)
        tap.response(flow)
        promised = recording_id(flow)
        assert promised is not None  # named at once (the console's line shows it)
        async with asyncio.timeout(10):
            while not kept.records:
                await asyncio.sleep(0.01)
        (interaction,) = kept.records
        assert interaction.id == promised
        assert kept.threads == [threading.main_thread()]  # delivered on the loop
        assert built_on and built_on[0] is not threading.main_thread()  # built off it
        assert_redacted_and_keyed(interaction)
        assert recorder.report.recorded == 1
        recorder.done()


async def test_shutdown_delivers_what_the_worker_built() -> None:
    recorder, tap, kept = recording()
    with taddons.context(recorder, tap) as tctx:
        tctx.configure(recorder, llmitm_record="record")
        flows = [chat_flow() for _ in range(5)]
        for flow in flows:
            run_flow(recorder, tap, flow)
        recorder.done()  # without the loop running again in between
        assert sorted(i.id for i in kept.records) == sorted(recording_id(f) or "" for f in flows)
        for interaction in kept.records:
            assert_redacted_and_keyed(interaction)


def test_a_replaying_mode_keys_the_request_at_once() -> None:
    recorder, tap, _ = recording()
    with taddons.context(recorder, tap) as tctx:
        tctx.configure(recorder, llmitm_record="replay-or-record")
        flow = chat_flow()
        recorder.request(flow)
        capture = capture_of(flow)
        assert capture is not None and capture.key is not None and capture.unseen is None
        assert capture.client_req is not None
        assert SECRET.encode() not in (capture.client_req.content or b"")


def test_without_a_loop_the_record_is_built_in_the_hook() -> None:
    recorder, tap, kept = recording()
    with taddons.context(recorder, tap) as tctx:
        tctx.configure(recorder, llmitm_record="record")
        run_flow(recorder, tap, chat_flow())
        (interaction,) = kept.records
        assert_redacted_and_keyed(interaction)
