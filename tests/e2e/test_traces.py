"""OpenTelemetry traces from a real ``llmitm run``: with only ``OTEL_EXPORTER_OTLP_ENDPOINT``
set, a call that fails over sends one ``chat {model}`` span with the GenAI attributes and a
child span per attempt (the throttled one an error) to an OTLP/HTTP receiver run by the test,
and the scrape counts the failover. Skipped without the otel extra."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx2 as httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .processes import fake_upstream, llmitm_proxy

pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)

pytestmark = pytest.mark.slow

CONFIG = """
[routing]
backoff = 0.01
backoff_max = 0.02

[endpoints.a]
kind = "compatible"
base_url = "{a}/v1"

[endpoints.b]
kind = "compatible"
base_url = "{b}/v1"

[[routes]]
name = "fleet"
models = ["fleet-*"]
endpoints = ["a", "b"]
"""


@contextmanager
def otlp_receiver() -> Iterator[tuple[str, list[ExportTraceServiceRequest]]]:
    """A minimal OTLP/HTTP traces endpoint that keeps every export it is sent."""
    received: list[ExportTraceServiceRequest] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            if self.path == "/v1/traces":
                received.append(ExportTraceServiceRequest.FromString(body))
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()


def attributes(span: Any) -> dict[str, Any]:
    values = {}
    for kv in span.attributes:
        kind = kv.value.WhichOneof("value")
        values[kv.key] = getattr(kv.value, kind)
    return values


def test_a_failover_call_is_one_span_with_a_child_per_attempt(tmp_path: Path) -> None:
    with (
        otlp_receiver() as (endpoint, received),
        fake_upstream(tmp_path, name="a", fault="status=429;retry_after=0;times=1") as a,
        fake_upstream(tmp_path, name="b") as b,
    ):
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}
        config = CONFIG.format(a=a.url, b=b.url)
        with llmitm_proxy(tmp_path, config=config, env=env) as proxy:
            client = openai.OpenAI(base_url=proxy.base_url(), api_key="sk-client", max_retries=0)
            answer = client.chat.completions.create(
                model="fleet-1", messages=[{"role": "user", "content": "Say hello."}]
            )
            # The relayed call is measured too: the failover shows in the scrape.
            scrape = httpx.get(f"http://127.0.0.1:{proxy.port()}/_llmitm/metrics", timeout=10)
            failovers = [
                sample
                for family in text_string_to_metric_families(scrape.text)
                for sample in family.samples
                if sample.name == "llmitm_failovers_total"
            ]
            assert [(s.labels["llmitm_endpoint"], s.value) for s in failovers] == [("b", 1.0)]
        # Stopping the proxy flushes the batch.
    spans = [
        span
        for export in received
        for resource in export.resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
    ]
    service = {
        kv.key: kv.value.string_value
        for export in received
        for resource in export.resource_spans
        for kv in resource.resource.attributes
    }
    assert service["service.name"] == "llmitm"
    calls = [s for s in spans if s.name == "chat fleet-1"]
    assert len(calls) == 1, [s.name for s in spans]
    call = calls[0]
    facts = attributes(call)
    assert facts["gen_ai.operation.name"] == "chat"
    assert facts["gen_ai.request.model"] == "fleet-1"
    assert facts["openai.api.type"] == "chat_completions"
    assert facts["llmitm.endpoint"] == "b" and facts["llmitm.attempts"] == 2
    assert answer.usage is not None
    assert facts["gen_ai.usage.input_tokens"] == answer.usage.prompt_tokens
    assert facts["gen_ai.usage.output_tokens"] == answer.usage.completion_tokens
    children = sorted(
        (s for s in spans if s.parent_span_id == call.span_id), key=lambda s: s.start_time_unix_nano
    )
    assert [s.name for s in children] == ["attempt a", "attempt b"]
    assert all(s.trace_id == call.trace_id for s in children)
    throttled, served = (attributes(s) for s in children)
    assert throttled["http.response.status_code"] == 429 and throttled["error.type"] == "429"
    assert served["llmitm.attempt.outcome"] == "success"
    assert children[0].status.code == 2  # STATUS_CODE_ERROR
    assert call.start_time_unix_nano <= children[0].start_time_unix_nano
    assert children[1].end_time_unix_nano <= call.end_time_unix_nano
