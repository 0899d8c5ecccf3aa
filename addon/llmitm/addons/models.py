"""The model list from the configuration, and the refusal of models no route takes.

``LlmModels`` answers ``GET …/models`` (and ``…/models/{id}``, Azure's ``/openai/models`` and
``/openai/deployments``) from the configuration's routes (:mod:`llmitm.routing.models`), for
a host whose routes name at least one model exactly, unless the file says ``models =
"upstream"``; with no routes, or only globs, the upstream's own list passes through. It comes
before the recorder, so a replay offline lists the models too.

``LlmUnmatched``, right after the router, answers a create call the router left alone —
no route takes its model or host — with a 404 in OpenAI's shape when the file says
``unmatched = "reject"``; a call a recording answers is left to the recorder.
"""

from __future__ import annotations

import time

import orjson
from mitmproxy import http

from llmitm.addons.record import replay_hit
from llmitm.addons.settings import LlmitmSettings
from llmitm.addons.state import flow_state
from llmitm.exchange.request import client_model, parse_body
from llmitm.routing.config import Config
from llmitm.routing.models import (
    find_model,
    list_body,
    models_call,
    one_body,
    served_models,
    serves_host,
    unknown_model,
    unmatched_error,
)
from llmitm.translate.errors import TranslationError
from llmitm.wire.errors import ApiError, openai_error_body
from llmitm.wire.paths import classify_path


def answer_json(flow: http.HTTPFlow, status: int, body: object) -> None:
    flow.response = http.Response.make(
        status,
        orjson.dumps(body),
        {"content-type": "application/json", "cache-control": "no-store"},
    )


def answer_api_error(flow: http.HTTPFlow, error: ApiError) -> None:
    answer_json(flow, error.status, openai_error_body(error))
    assert flow.response is not None
    flow.response.headers["x-should-retry"] = "false"


class LlmModels:
    """``GET /v1/models`` and friends, answered from the configuration."""

    name = "llmitm_models"

    def __init__(self, settings: LlmitmSettings) -> None:
        self.settings = settings
        self._config: Config | None = None
        self._created = 0
        """When the configuration was loaded: every listed model's ``created``."""

    def request(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error or not flow.live or flow.request.method != "GET":
            return
        call = models_call(flow.request.path)
        if call is None:
            return
        config = self.settings.config
        host = flow.request.pretty_host
        if not config.routes or config.settings.models != "config":
            return  # no routes: the upstream's own list passes through
        if not serves_host(config, host):
            return
        models = served_models(config, host)
        if not models:
            return  # only globs take this host: the upstream's list is the better answer
        if config is not self._config:
            self._config, self._created = config, int(time.time())
        if call.model is None:
            answer_json(flow, 200, list_body(call, models, self._created))
            return
        model = find_model(call, models)
        if model is None:
            answer_api_error(flow, unknown_model(config, call.model))
            return
        answer_json(flow, 200, one_body(call, model, self._created))


class LlmUnmatched:
    """``unmatched = "reject"``: a create call no route takes gets a 404, not the network."""

    name = "llmitm_unmatched"

    def __init__(self, settings: LlmitmSettings) -> None:
        self.settings = settings

    def request(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error or not flow.live or flow.request.method != "POST":
            return
        config = self.settings.config
        if config.settings.unmatched != "reject" or not config.routes:
            return
        if flow_state(flow) is not None or replay_hit(flow):
            return  # routed, or a recording answers it
        classified = classify_path(flow.request.path)
        if classified is None:
            return
        try:
            model = client_model(
                parse_body(flow.request.get_content(strict=False)), classified.deployment
            )
        except TranslationError as exc:  # the router found the same and said nothing
            answer_api_error(flow, exc.to_api_error())
            return
        answer_api_error(flow, unmatched_error(config, model, flow.request.pretty_host))
