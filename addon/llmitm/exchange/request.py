"""The upstream request body for a planned create call.

Reads the client's JSON (a 400 OpenAI-shaped error when it is not JSON or names no model),
translates it when the endpoint speaks the other API (or, for a third-party Responses server,
rewrites the shapes only OpenAI takes), and puts the endpoint's model (alias or Azure
deployment) in it. A body that needs no change is forwarded byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from llmitm.routing.plan import Plan
from llmitm.translate.context import TranslateOptions, TranslationContext
from llmitm.translate.errors import TranslationError
from llmitm.translate.request_to_chat import responses_request_to_chat
from llmitm.translate.request_to_responses import chat_request_to_responses
from llmitm.translate.responses_compat import needs_rewrite, responses_request_for_compatible


@dataclass(slots=True)
class PreparedRequest:
    content: bytes
    context: TranslationContext
    stream: bool
    warnings: list[str] = field(default_factory=list)
    strip_usage: bool = False
    """The body asks a chat upstream for the usage chunk the client did not ask for: strip
    that chunk from the stream before the client sees it."""


def parse_body(content: bytes | None) -> dict[str, Any]:
    """The request's JSON object, or a 400 that says what is wrong with it."""
    if not content:
        raise TranslationError(
            "The request has no body; send the request parameters as a JSON object.",
            code="invalid_json",
        )
    try:
        body = orjson.loads(content)
    except orjson.JSONDecodeError as exc:
        raise TranslationError(
            f"The request body is not valid JSON ({exc}); send a JSON object.",
            code="invalid_json",
        ) from None
    if not isinstance(body, dict):
        raise TranslationError("The request body must be a JSON object.", code="invalid_json")
    return body


def client_model(body: dict[str, Any], deployment: str | None) -> str:
    """The model the client asked for (Azure classic chat names it in the path)."""
    model = body.get("model")
    if isinstance(model, str) and model:
        return model
    if deployment:
        return deployment
    raise TranslationError(
        "model is required; send the model name as a string.",
        param="model",
        code="missing_required_parameter",
    )


def prepare_request(
    content: bytes,
    body: dict[str, Any],
    model: str,
    plan: Plan,
    options: TranslateOptions,
    *,
    ask_usage: bool = False,
) -> PreparedRequest:
    """The body to send upstream and the context its response translation needs.

    ``ask_usage``: a chat stream relayed to a chat upstream asks for the trailing usage chunk
    (``stream_options.include_usage``) even when the client did not, so its tokens can be
    accounted; ``strip_usage`` then tells the stream to drop that chunk."""
    stream = body.get("stream") is True
    if plan.client_api == "chat" and plan.upstream_api == "responses":
        mapped = chat_request_to_responses(dict(body, model=model), options)
    elif plan.client_api == "responses" and plan.upstream_api == "chat":
        mapped = responses_request_to_chat(dict(body, model=model), options)
    elif (
        plan.client_api == "responses"
        and plan.endpoint.kind == "compatible"
        and needs_rewrite(body)
    ):
        # A third-party Responses server takes only the plain shapes (OpenAI and Azure read
        # Codex's additional_tools, namespaces and custom tools natively: they get it as is).
        mapped = responses_request_for_compatible(body, options)
    else:
        context = TranslationContext(options=options, model=model)
        strip = ask_usage and stream and plan.client_api == "chat" and not _asks_usage(body)
        if strip:
            options_ = body.get("stream_options")
            options_ = dict(options_) if isinstance(options_, dict) else {}
            rewritten = dict(body, model=plan.upstream_model, stream_options=options_)
            options_["include_usage"] = True
            return PreparedRequest(orjson.dumps(rewritten), context, stream, strip_usage=True)
        if body.get("model") == plan.upstream_model:
            return PreparedRequest(content, context, stream)
        rewritten = dict(body, model=plan.upstream_model)
        return PreparedRequest(orjson.dumps(rewritten), context, stream)
    mapped.body["model"] = plan.upstream_model
    mapped.context.model = model  # translated output names the model the client asked for
    return PreparedRequest(orjson.dumps(mapped.body), mapped.context, stream, mapped.warnings)


def _asks_usage(body: dict[str, Any]) -> bool:
    stream_options = body.get("stream_options")
    return isinstance(stream_options, dict) and stream_options.get("include_usage") is True
