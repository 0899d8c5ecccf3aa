"""The upstream request for a planned call: its body, its headers, one per candidate.

Reads the client's JSON (a 400 OpenAI-shaped error when it is not JSON or names no model),
translates it when the endpoint speaks the other API (or, for a third-party Responses server,
rewrites the shapes only OpenAI takes), and puts the endpoint's model (alias or Azure
deployment) in it. A body that needs no change is forwarded byte for byte.

The header rewrite (the endpoint's credentials in, the client's out, no compression) is
:func:`rewrite_headers` for a request mitmproxy forwards itself and :func:`candidate_headers`
for one the relay sends; :func:`prepare_candidates` builds what each endpoint of a failover
route is sent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, MutableMapping
from dataclasses import dataclass, field, replace
from typing import Any, cast

import orjson

from llmitm.routing.config import Endpoint, Route
from llmitm.routing.plan import Plan, plan_for_endpoint
from llmitm.translate.chat_resume import ChatResume
from llmitm.translate.context import MappedRequest, TranslateOptions, TranslationContext
from llmitm.translate.errors import TranslationError
from llmitm.translate.request_to_chat import responses_request_to_chat
from llmitm.translate.request_to_responses import chat_request_to_responses
from llmitm.translate.responses_compat import needs_rewrite, responses_request_for_compatible
from llmitm.translate.stateless import stateless_request
from llmitm.wire.growing import Grown
from llmitm.wire.paths import ApiName
from llmitm.wire.spliced import spliced


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
    grown: Grown | None = None,
) -> PreparedRequest:
    """The body to send upstream and the context its response translation needs.

    ``ask_usage``: a chat stream relayed to a chat upstream asks for the trailing usage chunk
    (``stream_options.include_usage``) even when the client did not, so its tokens can be
    accounted; ``strip_usage`` then tells the stream to drop that chunk. ``grown``: ``body``
    is this growing parse's, unchanged since (a translation to chat goes on from where the
    last turn's stood, :mod:`llmitm.translate.chat_resume`)."""
    stream = body.get("stream") is True
    rebuilt = False
    if plan.client_api == "responses" == plan.upstream_api and plan.endpoint.emulates_state:
        # llmitm keeps this server's state: it is sent the whole conversation, statelessly.
        stateless = stateless_request(body)
        if stateless is not None:
            body, rebuilt = stateless, True
    if plan.client_api == "chat" and plan.upstream_api == "responses":
        mapped = chat_request_to_responses(dict(body, model=model), options)
    elif plan.client_api == "responses" and plan.upstream_api == "chat":
        # A body kept for the next turn (one large enough to be an agent's history) carries
        # where its translation stood; a small one is translated whole, as cheaply.
        kept = grown if grown is not None and grown.name == "input" else None
        mapped = responses_request_to_chat(
            dict(body, model=model), options, resume=_resume(kept), resumable=kept is not None
        )
        if kept is not None and mapped.resume is not None:
            kept.carry(mapped.resume)
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
        if body.get("model") == plan.upstream_model and not rebuilt:
            return PreparedRequest(content, context, stream)
        rewritten = dict(body, model=plan.upstream_model)
        return PreparedRequest(orjson.dumps(rewritten), context, stream)
    mapped.body["model"] = plan.upstream_model
    mapped.context.model = model  # translated output names the model the client asked for
    return PreparedRequest(_spelt(mapped), mapped.context, stream, mapped.warnings)


def _resume(kept: Grown | None) -> ChatResume | None:
    """Where the last turn's translation stood, when this body resends all its items."""
    carried = kept.carried if kept is not None else None
    if not isinstance(carried, ChatResume) or kept is None:
        return None
    return carried if carried.count <= kept.reused else None


def _spelt(mapped: MappedRequest) -> bytes:
    """The translated body's JSON (its messages' spliced in where the translator spelt
    them: a resent history's are the last turn's bytes)."""
    texts = mapped.message_texts
    if texts is not None:
        spelt = spliced(mapped.body, ("messages",), texts)
        if spelt is not None:
            return spelt
    return orjson.dumps(mapped.body)


def prepare_for_endpoint(
    endpoint: Endpoint,
    api: str,
    route: Route,
    content: bytes,
    body: dict[str, Any],
    model: str,
    options: TranslateOptions,
    *,
    grown: Grown | None = None,
) -> tuple[Plan, PreparedRequest]:
    """The plan and the request for sending a call of ``api`` on ``route`` to ``endpoint``
    (the route's alias, if any, is the model sent; ``grown``: as for
    :func:`prepare_request`)."""
    plan = plan_for_endpoint(endpoint, cast(ApiName, api), route.model or model)
    plan = replace(plan, route=route.label)
    prepared = prepare_request(
        content, body, model, plan, options, ask_usage=endpoint.stream_usage, grown=grown
    )
    return plan, prepared


def _asks_usage(body: dict[str, Any]) -> bool:
    stream_options = body.get("stream_options")
    return isinstance(stream_options, dict) and stream_options.get("include_usage") is True


Header = tuple[str, str]


def rewrite_headers(
    headers: MutableMapping[str, str], plan: Plan, *, new_body: bool = False
) -> None:
    """Point a client's headers at ``plan``'s endpoint, in place.

    The plan's credentials replace the client's, and the upstream is asked for plain bytes:
    a stream callable parses SSE and must not see gzip. ``new_body``: llmitm rewrote the
    body, so the client's ``content-encoding`` no longer describes it."""
    for header in plan.remove_headers:
        headers.pop(header, None)
    for header, value in plan.set_headers.items():
        headers[header] = value
    if new_body:
        headers.pop("content-encoding", None)
    headers["accept-encoding"] = "identity"


def candidate_headers(client_headers: Iterable[Header], plan: Plan) -> list[Header]:
    """The headers the relay sends ``plan``'s endpoint: :func:`rewrite_headers` on a list
    (``client_headers`` already without hop-by-hop and encoding headers)."""
    remove = {name.lower() for name in (*plan.remove_headers, *plan.set_headers)}
    headers = [(k, v) for k, v in client_headers if k.lower() not in remove]
    headers += list(plan.set_headers.items())
    headers.append(("accept-encoding", "identity"))
    return headers


def relayable_headers(
    headers: Iterable[Header], *, hop_by_hop: frozenset[str], head_limit: int, slack: int
) -> list[Header]:
    """The client's headers a relayed request carries on (no hop-by-hop or encoding
    header: the relay frames and decodes itself), or a 431 when they would not fit in the
    relay's head limit of ``head_limit`` bytes, less ``slack`` for the request line and the
    headers llmitm adds."""
    kept = [
        (k, v)
        for k, v in headers
        if k.lower() not in hop_by_hop and k.lower() not in {"accept-encoding", "content-encoding"}
    ]
    # Each header takes "name: value\r\n" in an HTTP/1.1 head.
    if sum(len(name) + len(value) + 4 for name, value in kept) > head_limit - slack:
        raise TranslationError(
            f"The request's headers exceed the {head_limit // 1024} KiB llmitm relays "
            "to a failover route; send fewer or smaller headers.",
            code="request_header_fields_too_large",
            status=431,
        )
    return kept


@dataclass(frozen=True, slots=True)
class Candidate:
    """What one endpoint of a relayed route is sent, and how its answer is read back."""

    plan: Plan
    prepared: PreparedRequest
    headers: list[Header]


def prepare_candidates(
    endpoints: Iterable[str],
    prepare: Callable[[str], tuple[Plan, PreparedRequest]],
    client_headers: list[Header],
) -> dict[str, Candidate]:
    """Every endpoint's request, in route order, skipping the ones that cannot take it;
    the first endpoint's error when none can (so the client learns why)."""
    candidates: dict[str, Candidate] = {}
    first_error: TranslationError | None = None
    for name in endpoints:
        try:
            plan, prepared = prepare(name)
        except TranslationError as exc:
            first_error = first_error or exc
            continue
        candidates[name] = Candidate(plan, prepared, candidate_headers(client_headers, plan))
    if not candidates:
        assert first_error is not None
        raise first_error
    return candidates
