"""Flows llmitm routed can be saved with mitmproxy's own ``-w`` (and so by
``save_stream_file`` and mitmweb's export): mitmproxy deep-copies ``flow.metadata`` into its
plain-data file format, so llmitm's live per-flow objects must copy as plain facts."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
from mitmproxy import io

from .processes import TWO_ENDPOINTS as CONFIG
from .processes import fake_upstream, llmitm_proxy

pytestmark = pytest.mark.slow


def test_routed_translated_and_stored_flows_are_saved_with_their_facts(tmp_path: Path) -> None:
    saved = tmp_path / "flows.mitm"
    with (
        fake_upstream(tmp_path, "chat") as chat,
        fake_upstream(tmp_path, "responses") as responses,
        llmitm_proxy(
            tmp_path,
            config=CONFIG.format(chat=chat.url, responses=responses.url),
            extra=["-w", str(saved)],
        ) as proxy,
    ):
        client = openai.OpenAI(base_url=proxy.base_url(), api_key="sk-client", max_retries=0)
        with client.responses.stream(model="over-chat", input="Say hello") as stream:
            streamed = stream.get_final_response()
        stored = client.responses.create(model="over-chat", input="Again")
        chat_answer = client.chat.completions.create(
            model="over-responses", messages=[{"role": "user", "content": "hi"}]
        )
        assert streamed.output_text and stored.output_text and chat_answer.choices
        log = proxy.log.read_text()
    assert "unserializable" not in log and "Traceback" not in log, log
    with saved.open("rb") as file:
        flows = list(io.FlowReader(file).stream())
    facts = [flow.metadata.get("llmitm") for flow in flows]
    assert len(flows) == 3
    assert [fact["endpoint"] for fact in facts] == ["chat-only", "chat-only", "responses-only"]
    assert [fact["plan"] for fact in facts] == ["responses→chat"] * 2 + ["chat→responses"]
    assert facts[0]["streamed"] is True and facts[1]["streamed"] is False
    assert all(flow.metadata["llmitm_facts"]["attempts"] == 1 for flow in flows)
