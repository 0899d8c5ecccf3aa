"""The stateless request a native Responses server gets when llmitm keeps its state.

An endpoint configured ``state = "emulate"`` (the default for ``compatible`` servers:
llama.cpp, Ollama, vLLM, OpenRouter keep none, or none by default) is sent each create call
as a complete conversation: by the time a request gets here the local Responses API has
inlined the stored chain of ``previous_response_id`` and the conversation's items
(:mod:`.create`), so what is left of the server-side state fields is dropped —
``store`` (llmitm stores), ``background`` (answered when it is done, see below),
``conversation`` and ``previous_response_id``. A ``previous_response_id`` still present
names nothing llmitm stores: OpenAI's own 400, rather than the server's "not supported".

``background`` is not run by llmitm over a native server: the call completes in the
request, and the stored answer serves the client's polling (``GET``) as a finished one.
"""

from __future__ import annotations

from typing import Any

from llmitm.translate.errors import TranslationError

STATE_FIELDS = ("store", "background", "background_options", "conversation")


def stateless_request(body: dict[str, Any]) -> dict[str, Any] | None:
    """``body`` without its server-state fields (a new dict), or ``None`` when it has none.
    Raises OpenAI's 400 for a ``previous_response_id`` left unresolved."""
    previous = body.get("previous_response_id")
    if previous is not None:
        raise TranslationError(
            f"Previous response with id '{previous}' not found.",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    if not any(name in body for name in STATE_FIELDS):
        return None
    return {key: value for key, value in body.items() if key not in STATE_FIELDS}


def stored_native_response(
    response: dict[str, Any], previous_response_id: str | None
) -> dict[str, Any]:
    """A native server's Response as llmitm stores it for ``GET``: with the state fields the
    client sent and the server never saw."""
    return dict(response, store=True, previous_response_id=previous_response_id)
