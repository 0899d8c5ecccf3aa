"""The response cache's shell: looks create calls up before anything records or routes them,
and fills the cache from the answers that complete (the rules are :mod:`llmitm.replay.cache`'s).

Two addons share one :class:`_Pending` per flow, as the recorder and its tap do:

- :class:`LlmCacheLookup` (before the recorder) reads what the request asks (the
  ``x-llmitm-cache`` header, the ``llmitm`` body field — both removed here, so neither the
  match keys nor the upstream see them), picks the route's settings, and answers a hit at
  once with the cached answer (the recorded-answer helper replay uses), marked
  ``x-llmitm-cache: hit``. A hit is not recorded, routed or sent upstream.
- :class:`LlmCacheFill` (after the stream translator) taps the stream of a miss that may be
  kept (one C call per chunk), keeps the client's answer when the flow ends complete, and
  writes a hit's usage record (endpoint ``cache``, every input token cached).

It costs a request nothing unless a route has a cache, the request carries the header, or
its body holds the ``"llmitm"`` field (one byte search). The cache lives in this process's
memory: bounded per route, lost at exit, never shared between processes.
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from dataclasses import dataclass

import orjson
from mitmproxy import http

from llmitm.addons.access import client_key_of
from llmitm.addons.direct import answer_error
from llmitm.addons.record.flows import answer, fields
from llmitm.addons.settings import LlmitmSettings
from llmitm.addons.state import SOCKET_KEY, FlowState, flow_state
from llmitm.addons.store import LlmStore
from llmitm.addons.streams import flow_stream, stream_outcome
from llmitm.exchange.usage import body_tokens, stream_tokens, usage_record
from llmitm.replay import cache
from llmitm.replay.fingerprint import credential, fingerprint
from llmitm.replay.serve import FRAMING
from llmitm.replay.tap import StreamTap
from llmitm.routing.access import route_refusal
from llmitm.routing.config import Config
from llmitm.routing.plan import match_route
from llmitm.wire.errors import ApiError
from llmitm.wire.paths import classify_path

logger = logging.getLogger(__name__)

CACHE_ENDPOINT = "cache"
"""What usage records and metrics name as the endpoint of a hit (no endpoint was called)."""
_NOT_KEPT = FRAMING | {cache.HEADER}


@dataclass(slots=True)
class _Pending:
    """The cache's part in one flow, from lookup to fill."""

    decision: cache.Decision
    route: str
    keys: tuple[str, str]
    """Where an answer everyone may get is kept, and where one only :attr:`credential` may."""
    credential: str | None
    api: str
    stream: bool
    model: str
    hit: cache.Entry | None = None
    tap: StreamTap | None = None


_PENDING: weakref.WeakKeyDictionary[http.HTTPFlow, _Pending] = weakref.WeakKeyDictionary()


def cache_hit(flow: http.HTTPFlow) -> bool:
    """Whether the cache answered ``flow``."""
    pending = _PENDING.get(flow)
    return pending is not None and pending.hit is not None


class LlmCacheLookup:
    """Reads the request's wishes, answers hits; owns the process's :attr:`cache`."""

    name = "llmitm_cache"

    def __init__(self, settings: LlmitmSettings) -> None:
        self.settings = settings
        self.cache = cache.ResponseCache()
        self._fingerprint_key = os.urandom(32)
        """Credentials are told apart by an HMAC under a key of this process's own (the
        cache is its own too): nothing about a key is kept in the clear."""
        self._config: Config | None = None
        self._any_route_caches = False

    def _routes_cache(self, config: Config) -> bool:
        if config is not self._config:
            self._config = config
            self._any_route_caches = any(route.cache is not None for route in config.routes)
        return self._any_route_caches

    def request(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error or not flow.live or flow.metadata.get(SOCKET_KEY):
            return
        request = flow.request
        if request.method != "POST":
            return
        classified = classify_path(request.path)
        if classified is None:
            return
        header = request.headers.get(cache.HEADER)
        content = request.get_content(strict=False) or b""
        config = self.settings.config
        stripped = cache.strip_field(content)
        if header is None and stripped is None and not self._routes_cache(config):
            return
        try:
            directive = None
            if header is not None:
                del request.headers[cache.HEADER]  # llmitm's: never forwarded
                directive = cache.parse_header(header)
            if stripped is not None:
                content, value = stripped
                request.content = content  # the upstream and the match keys never see it
                directive = cache.parse_field(value) or directive
        except cache.CacheRequestError as exc:
            error = ApiError(str(exc), "invalid_request_error", "invalid_cache_request", status=400)
            answer_error(flow, error)
            return
        try:
            self._look_up(flow, classified.api, classified.deployment, content, directive)
        except Exception:  # the cache must never cost the client its answer
            logger.exception("llmitm: cache lookup failed for %s", request.pretty_url)

    def _look_up(
        self,
        flow: http.HTTPFlow,
        api: str,
        deployment: str | None,
        content: bytes,
        directive: cache.Directive | None,
    ) -> None:
        request = flow.request
        body = _json_object(content)
        if cache.refusal(body) is not None:
            return
        assert isinstance(body, dict)
        headers = fields(request.headers)
        key = cache.request_key(
            request.method, request.path, headers, content, request.pretty_host, body
        )
        model = key.model or deployment or ""
        route = match_route(self.settings.config, model, request.pretty_host) if model else None
        if route is not None and route_refusal(client_key_of(flow, self.settings), route.name):
            return  # the router refuses it: a cached answer must not get round that
        decision = cache.decide(route.cache if route is not None else None, directive)
        if decision is None:
            return
        sent = credential(headers)
        who = fingerprint(self._fingerprint_key, sent) if sent is not None else None
        name = route.label if route is not None else ""
        keys = cache.cache_keys(key, name, request.pretty_host, who, decision.settings)
        pending = _Pending(decision, name, keys, who, api, key.stream, model)
        _PENDING[flow] = pending
        if not decision.read:
            return
        entry = self.cache.get(name, keys, who, time.monotonic())
        if entry is None:
            return
        pending.hit = entry
        answer(flow, entry.status, [*entry.headers, (cache.HEADER, "hit")], entry.body, None)


class LlmCacheFill:
    """Keeps complete answers of misses; accounts hits."""

    name = "llmitm_cache_fill"

    def __init__(self, lookup: LlmCacheLookup, store: LlmStore) -> None:
        self.lookup = lookup
        self.store = store

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        pending = _PENDING.get(flow)
        response = flow.response
        if pending is None or pending.hit is not None or response is None:
            return
        response.headers[cache.HEADER] = pending.decision.label
        if not pending.decision.write:
            return
        stream = flow_stream(flow)
        if stream is not None:
            pending.tap = tap = StreamTap()
            stream.add_note(tap.note)

    def response(self, flow: http.HTTPFlow) -> None:
        pending = _PENDING.get(flow)  # kept: the metrics, after this, ask whether it was a hit
        if pending is None:
            return
        try:
            if pending.hit is not None:
                self._account_hit(pending, pending.hit)
            elif pending.decision.write:
                self._fill(flow, pending)
        except Exception:
            logger.exception("llmitm: cache fill failed for %s", flow.request.pretty_url)

    def error(self, flow: http.HTTPFlow) -> None:
        _PENDING.pop(flow, None)  # a cut or aborted answer is never kept

    def _fill(self, flow: http.HTTPFlow, pending: _Pending) -> None:
        response = flow.response
        if response is None or flow.error is not None:
            return
        state = flow_state(flow)
        planned = state if isinstance(state, FlowState) else None
        if planned is not None and planned.upstream_cut is not None:
            return
        tap = pending.tap
        if tap is not None:
            _times, upstream, client = tap.finish()
            body = (client or upstream).body()
            outcome = stream_outcome(flow)
            tokens = stream_tokens(outcome) if outcome is not None else None
        else:
            if response.stream:
                return  # streamed by something that is not llmitm's: nothing was kept
            body = response.get_content(strict=False) or b""
            tokens = body_tokens(body)
        status = response.status_code
        if not cache.answer_complete(pending.api, pending.stream, status, body):
            return
        headers = [(k, v) for k, v in fields(response.headers) if k.lower() not in _NOT_KEPT]
        endpoint = ""
        if planned is not None:
            routed = planned.routed
            endpoint = (routed.endpoint if routed is not None else None) or (
                planned.plan.endpoint.name
            )
        settings = pending.decision.settings
        private = cache.holds_sealed_reasoning(body)
        entry = cache.Entry(
            status=status,
            headers=headers,
            body=cache.marked_body(pending.stream, body),
            expires=time.monotonic() + pending.decision.ttl,
            credential=pending.credential,
            private=private,
            tokens=tokens,
            model=pending.model,
            endpoint=endpoint,
        )
        key = pending.keys[1] if private else pending.keys[0]
        self.lookup.cache.put(pending.route, key, entry, settings.max_entries)

    def _account_hit(self, pending: _Pending, entry: cache.Entry) -> None:
        if entry.tokens is None:
            return
        input_tokens, _cached, output, reasoning = entry.tokens
        self.store.submit(
            usage_record(
                (input_tokens, input_tokens, output, reasoning),
                endpoint=CACHE_ENDPOINT,
                model=entry.model,
                route=pending.route,
            )
        )


def _json_object(content: bytes) -> object:
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
