"""The response cache's shell: looks create calls up before anything records or routes them,
and (``cache_fill.py``) fills the cache from the answers that complete (the rules are
:mod:`llmitm.replay.cache`'s).

Two addons share one :class:`Pending` per flow, as the recorder and its tap do:

- :class:`LlmCacheLookup` (before the recorder) reads what the request asks (the
  ``x-llmitm-cache`` header, the ``llmitm`` body field — both removed here, so neither the
  match keys nor the upstream see them), picks the route's settings, and answers a hit at
  once with the cached answer (the recorded-answer helper replay uses), marked
  ``x-llmitm-cache: hit``. A hit is not recorded, routed or sent upstream.
- :class:`~llmitm.addons.cache_fill.LlmCacheFill` (after the stream translator) taps the
  stream of a miss that may be kept (one C call per chunk), keeps the client's answer when
  the flow ends complete, and writes a hit's usage record (endpoint ``cache``, every input
  token cached).

It costs a request nothing unless a route has a cache, the request carries the header, or
its body holds the ``"llmitm"`` field (a byte search of its edges); while a route has a cache,
a request on another route costs one parse of its body (to find its route), and only a
request the cache takes part in has its key made. The cache lives in this process's
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
from llmitm.addons.state import SOCKET_KEY
from llmitm.replay import cache
from llmitm.replay.fingerprint import credential, fingerprint
from llmitm.replay.tap import StreamTap
from llmitm.routing.access import route_refusal
from llmitm.routing.config import Config
from llmitm.routing.plan import match_route
from llmitm.wire.errors import ApiError
from llmitm.wire.paths import classify_path

logger = logging.getLogger(__name__)

CACHE_ENDPOINT = "cache"
"""What usage records and metrics name as the endpoint of a hit (no endpoint was called)."""


@dataclass(slots=True)
class Pending:
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


PENDING: weakref.WeakKeyDictionary[http.HTTPFlow, Pending] = weakref.WeakKeyDictionary()


def cache_hit(flow: http.HTTPFlow) -> bool:
    """Whether the cache answered ``flow``."""
    pending = PENDING.get(flow)
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
        named = body.get("model")
        model = deployment or (named if isinstance(named, str) else "")
        route = match_route(self.settings.config, model, request.pretty_host) if model else None
        if route is not None and route_refusal(client_key_of(flow, self.settings), route.name):
            return  # the router refuses it: a cached answer must not get round that
        decision = cache.decide(route.cache if route is not None else None, directive)
        if decision is None:
            return  # a route without a cache: no key is made
        headers = fields(request.headers)
        key = cache.request_key(
            request.method, request.path, headers, content, request.pretty_host, body
        )
        sent = credential(headers)
        who = fingerprint(self._fingerprint_key, sent) if sent is not None else None
        name = route.label if route is not None else ""
        keys = cache.cache_keys(key, name, request.pretty_host, who, decision.settings)
        pending = Pending(decision, name, keys, who, api, key.stream, model)
        PENDING[flow] = pending
        if not decision.read:
            return
        entry = self.cache.get(name, keys, who, time.monotonic())
        if entry is None:
            return
        pending.hit = entry
        answer(flow, entry.status, [*entry.headers, (cache.HEADER, "hit")], entry.body, None)


def _json_object(content: bytes) -> object:
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
