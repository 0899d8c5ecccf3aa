"""The stateless request a native Responses server gets when llmitm keeps its state.

An endpoint whose ``state`` is emulated (the default for ``compatible`` servers: llama.cpp,
Ollama, vLLM, OpenRouter keep none, or none by default) is sent each create call as a
complete conversation: by the time a request gets here the local Responses API has inlined
the stored chain of ``previous_response_id`` and the conversation's items, so what is left of
the server-side state fields is dropped — ``store`` (llmitm stores), ``background`` (the
call is answered when it is done), ``conversation`` and ``previous_response_id``. A
``previous_response_id`` still present names nothing llmitm stores: OpenAI's own 400, rather
than the server's "not supported".
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
