"""The traces addon's switch: off by default, on with ``llmitm_otel`` or the standard OTLP
endpoint variable, and without the otel extra one clear warning instead of a failure."""

from __future__ import annotations

import logging
import sys

import pytest
from mitmproxy.test import taddons

from llmitm.addons import make_addons
from llmitm.addons.traces import LlmTraces

EXPORTER = "opentelemetry.exporter.otlp.proto.http.trace_exporter"


def traces_of(addons: list[object]) -> LlmTraces:
    return next(a for a in addons if isinstance(a, LlmTraces))


def test_off_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    addons = make_addons()
    with taddons.context(*addons):
        traces = traces_of(addons)
        traces.running()
        assert traces.tracer is None


def test_asked_for_without_the_extra_warns_once_and_runs_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, EXPORTER, None)  # as if the package were not installed
    addons = make_addons()
    with caplog.at_level(logging.WARNING), taddons.context(*addons) as tctx:
        traces = traces_of(addons)
        traces.running()
        tctx.options.update(llmitm_otel=True)
        tctx.options.update(llmitm_otel=False)
        tctx.options.update(llmitm_otel=True)
        assert traces.tracer is None
    warnings = [r.getMessage() for r in caplog.records if "OpenTelemetry" in r.getMessage()]
    assert len(warnings) == 1 and "pip install 'llmitm[otel]'" in warnings[0]


def test_the_otlp_endpoint_variable_turns_it_on(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip(EXPORTER)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    addons = make_addons()
    with taddons.context(*addons):
        traces = traces_of(addons)
        traces.running()
        assert traces.tracer is not None
        traces.done()  # nothing batched: shutting down is immediate
