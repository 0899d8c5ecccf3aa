"""Optional OpenTelemetry traces: one span per call, one child span per attempt.

On with option ``llmitm_otel`` or when the standard ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
``…_TRACES_ENDPOINT``) is set; spans go to the OTLP/HTTP exporter, which reads the other
``OTEL_*`` variables itself. The packages are the ``otel`` extra: without them llmitm runs
as always and says once, in one log line, how to install them. The spans are made when a
call ends, from the facts :class:`~llmitm.addons.metrics.LlmMetrics` took
(:mod:`llmitm.observe.traces`) and, for a failover route, the relay job's attempt log, kept
from ``responseheaders`` (the router forgets the job when the response ends).
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from collections.abc import Set
from typing import Any

from mitmproxy import ctx, http
from mitmproxy.addonmanager import Loader

from llmitm.addons.metrics import LlmMetrics
from llmitm.addons.state import flow_state
from llmitm.observe.metrics import CallFacts
from llmitm.observe.traces import AttemptFacts, SpanFacts, call_span
from llmitm.routing.attempts import AttemptLog

logger = logging.getLogger(__name__)

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
EXPORT_TIMEOUT_S = 5.0
"""The exporter's bound per export (also what shutting down may wait for a flush)."""

_LOGS: weakref.WeakKeyDictionary[http.HTTPFlow, AttemptLog] = weakref.WeakKeyDictionary()


def otlp_provider() -> Any:
    """A tracer provider exporting to OTLP/HTTP in batches; raises ImportError without the
    ``otel`` extra."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "llmitm"}
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(timeout=EXPORT_TIMEOUT_S)))
    return provider


def emit(tracer: Any, facts: SpanFacts) -> None:
    """``facts`` as a finished span (and its children), at the times they happened."""
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind, Status, StatusCode

    span = tracer.start_span(
        facts.name,
        kind=SpanKind.CLIENT,
        attributes=facts.attributes,
        start_time=_ns(facts.started),
    )
    if facts.error:
        span.set_status(Status(StatusCode.ERROR, facts.error))
    context = trace.set_span_in_context(span)
    for child in facts.children:
        attempt = tracer.start_span(
            child.name,
            context=context,
            kind=SpanKind.CLIENT,
            attributes=child.attributes,
            start_time=_ns(child.started),
        )
        if child.error:
            attempt.set_status(Status(StatusCode.ERROR, child.error))
        attempt.end(end_time=_ns(child.ended))
    span.end(end_time=_ns(facts.ended))


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


class LlmTraces:
    """Option ``llmitm_otel``."""

    name = "llmitm_traces"

    def __init__(self, metrics: LlmMetrics, provider: Any = None) -> None:
        self.metrics = metrics
        self.provider = provider
        """Given: a test's (never shut down here); else made when tracing is turned on."""
        self._own_provider = False
        self._running = False
        self._said_missing = False
        self.tracer: Any = None
        metrics.sinks.append(self._call)
        if provider is not None:
            self.tracer = provider.get_tracer("llmitm")

    def load(self, loader: Loader) -> None:
        loader.add_option(
            "llmitm_otel",
            bool,
            False,
            "Send an OpenTelemetry trace of every call (a span per call and per attempt) to "
            "the OTLP/HTTP endpoint of OTEL_EXPORTER_OTLP_ENDPOINT (default localhost:4318); "
            "on by itself when that variable is set. Needs the otel extra.",
        )

    def configure(self, updated: Set[str]) -> None:
        if self._running and "llmitm_otel" in updated:
            self._switch_on()

    def running(self) -> None:
        # Decided here: the first configure need not name llmitm_otel, and the environment
        # variable alone turns tracing on.
        self._running = True
        self._switch_on()

    def _switch_on(self) -> None:
        if self.tracer is not None:
            return
        if not (ctx.options.llmitm_otel or any(os.environ.get(v) for v in ENDPOINT_VARIABLES)):
            return
        try:
            self.provider = otlp_provider()
        except ImportError as exc:
            if self._said_missing:
                return
            self._said_missing = True
            logger.warning(
                "llmitm: OpenTelemetry traces are on but their packages are missing (%s); "
                "install them with: pip install 'llmitm[otel]'",
                exc.name,
            )
            return
        self._own_provider = True
        self.tracer = self.provider.get_tracer("llmitm")

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        if self.tracer is None:
            return
        state = flow_state(flow)
        job = state.routed.job if state is not None and state.routed is not None else None
        if job is not None and job.result.log is not None:
            _LOGS[flow] = job.result.log

    def _call(self, flow: http.HTTPFlow, call: CallFacts) -> None:
        if self.tracer is None:
            return
        started = flow.request.timestamp_start or time.time()
        emit(self.tracer, call_span(call, started, attempts_of(flow, call, started)))

    def done(self) -> None:
        if self._own_provider:
            self.provider.shutdown()  # flushes what is batched, within the export timeout


def attempts_of(flow: http.HTTPFlow, call: CallFacts, started: float) -> list[AttemptFacts]:
    """The call's attempts in epoch seconds: the relay job's log, or the one direct try."""
    ended = started + (call.duration or 0.0)
    log = _LOGS.pop(flow, None)
    if log is None:
        if call.endpoint in {"llmitm", "replay", ""}:
            return []  # nothing went upstream
        status = flow.response.status_code if flow.response is not None else None
        outcome = "success" if not call.error_type else call.error_type
        return [AttemptFacts(call.endpoint, flow.request.timestamp_end or started, ended,
                             outcome, status)]  # fmt: skip
    to_epoch = time.time() - time.monotonic()  # the log's clock is monotonic
    attempts = [
        AttemptFacts(
            a.endpoint,
            a.started + to_epoch,
            a.started + a.duration + to_epoch,
            a.outcome.kind,
            a.outcome.status,
        )
        for a in log.attempts
    ]
    if attempts and attempts[-1].outcome == "success":
        last = attempts[-1]  # the winner's try lasts until its answer has been relayed
        attempts[-1] = AttemptFacts(last.endpoint, last.started, max(ended, last.ended),
                                    last.outcome, last.status)  # fmt: skip
    return attempts
