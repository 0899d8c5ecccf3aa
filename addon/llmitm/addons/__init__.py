"""The only code that imports mitmproxy: small addons in dataflow order."""

from __future__ import annotations

from llmitm.addons.access import LlmAccess, LlmAccessStrip
from llmitm.addons.background import LlmBackground
from llmitm.addons.cache import LlmCacheLookup
from llmitm.addons.cache_fill import LlmCacheFill
from llmitm.addons.compaction import LlmCompaction, LlmCompactionAnswer
from llmitm.addons.console import LlmConsole
from llmitm.addons.contentview import LlmContentview
from llmitm.addons.conversations import LlmConversations
from llmitm.addons.drain import LlmDrain
from llmitm.addons.egress import LlmEgress, LlmEgressGuard
from llmitm.addons.first_byte import LlmFirstByteWatch
from llmitm.addons.first_screen import LlmFirstScreen
from llmitm.addons.fleet import LlmFleet
from llmitm.addons.gc_freeze import LlmGcFreeze
from llmitm.addons.health import LlmHealth
from llmitm.addons.listenfile import ListenFile
from llmitm.addons.memory import LlmMemoryTrim
from llmitm.addons.metrics import LlmMetrics, LlmMetricsEndpoint
from llmitm.addons.models import LlmModels, LlmUnmatched
from llmitm.addons.namespace import LlmNamespace
from llmitm.addons.patches import LlmPatches
from llmitm.addons.quiet import LlmQuiet
from llmitm.addons.record import LlmFlowRecorder, LlmRecordingsLoad, LlmRecordTap
from llmitm.addons.relay import LlmRelay
from llmitm.addons.responses_api import LlmResponsesApi
from llmitm.addons.responses_state import ResponsesState
from llmitm.addons.responses_writer import LlmResponsesStateWriter
from llmitm.addons.router import LlmRouter
from llmitm.addons.settings import LlmitmSettings
from llmitm.addons.sides import LlmClientSide, LlmFlowSides
from llmitm.addons.stall import LlmStallWatch
from llmitm.addons.status import LlmStatus
from llmitm.addons.store import LlmStore
from llmitm.addons.stream_translator import LlmStreamTranslator
from llmitm.addons.traces import LlmTraces
from llmitm.addons.usage import LlmUsage
from llmitm.addons.websocket import LlmWebSocket


def make_addons() -> list[object]:
    """llmitm's addons, in the order a flow meets them."""
    settings = LlmitmSettings()
    store = LlmStore(settings)  # opened in running, before the listen file says "ready"
    relay = LlmRelay()  # started in running: failover, background runs and resumes use it
    state = ResponsesState(settings, store, relay)
    # The recorder sees the client's request as sent — before LlmResponsesApi inlines stored
    # chains and the router rewrites it — and the upstream's response before LlmStreamTranslator
    # translates it; its tap, after them, sees the translated result.
    # The record builder waits for the memory trim's collection after a burst of flows.
    memory = LlmMemoryTrim()
    recorder = LlmFlowRecorder(store, relay, memory.collection_due)
    # LlmEgress answers what is not an LLM call before anything records or replays it;
    # LlmEgressGuard, after the router, what LLM call nothing in llmitm took.
    egress = LlmEgress(settings, relay)
    fleet = LlmFleet(settings)  # joined in running, when the store is a shared database
    router = LlmRouter(settings, relay, fleet)
    # The response cache answers its hits before anything records or routes them, and keeps
    # the answers of its misses once the translator has made them the client's.
    cache = LlmCacheLookup(settings)
    # LlmMetrics measures calls as they end, after the translator; its scrape (like the model
    # list and the health answers) is served before the recorder or egress takes the path
    # for a foreign one.
    metrics = LlmMetrics(router, recorder, cache.cache)
    # LlmResponsesApi answers state calls and inlines stored chains before the router plans;
    # its done() (ending live background runs) comes before the store closes. LlmUsage reads
    # a non-streamed body before LlmStreamTranslator translates it; LlmResponsesStateWriter
    # stores the translated one, and LlmBackground takes a background call over once it has its id.
    # LlmCompaction turns compaction calls into summarisation calls before the router plans
    # them; LlmCompactionAnswer makes the summary the client's answer before
    # LlmResponsesStateWriter stores it.
    # LlmWebSocket comes first: a call a socket sends back through the proxy gets its target
    # restored before anyone else (egress and the recorder included) sees it.
    return [
        LlmQuiet(),  # first: mitmproxy's info lines go before any is logged
        LlmDrain(),  # its done() lets the flows in flight end before the others' run
        LlmPatches(),  # checks once that the mitmproxy internals llmitm patches are there
        LlmNamespace(),  # answers --transparent's DNS; re-addresses its flows by Host header
        settings,
        LlmHealth(settings, store, relay),  # before access: a probe carries no client key
        LlmAccess(settings),  # refuses browsers, non-JSON calls and missing client keys
        LlmWebSocket(relay),
        LlmModels(settings),
        LlmMetricsEndpoint(metrics),
        LlmClientSide(),  # the client's request before anything rewrites it
        egress,
        cache,  # strips the request's cache field before the recorder keys it
        recorder,
        LlmResponsesApi(state),
        LlmConversations(state),
        LlmCompaction(state),
        store,
        relay,
        LlmRecordingsLoad(recorder),  # replay pools, once the store is open
        fleet,
        LlmStatus(router, relay, fleet),  # the status route, on llmitm's own address
        router,
        LlmUnmatched(settings),  # unmatched = "reject": what the router left alone
        LlmAccessStrip(settings),  # a client key never goes upstream
        LlmFirstByteWatch(settings),  # after the router's slot wait: times the upstream's head
        LlmEgressGuard(egress),
        LlmUsage(store),
        LlmStreamTranslator(),
        LlmStallWatch(settings),  # after LlmStreamTranslator, which installs the stream callable
        LlmCompactionAnswer(state),
        LlmResponsesStateWriter(state),
        LlmBackground(state),
        LlmRecordTap(recorder),  # before the console, which wraps what it finds
        LlmCacheFill(cache, store),
        LlmConsole(),  # after LlmStreamTranslator: it taps the stream callable installed there
        metrics,
        LlmTraces(metrics),  # spans from the facts metrics took (the otel extra, optional)
        LlmContentview(),
        LlmFlowSides(),  # last: the flow gets the client's request back once all have read it
        memory,  # after the flow's last readers: trims once its bodies are let go
        LlmFirstScreen(settings, store),  # before the listen file: said before a command runs
        LlmGcFreeze(),  # after every addon's start-up: freezes what lives as long as the proxy
        ListenFile(),
    ]
