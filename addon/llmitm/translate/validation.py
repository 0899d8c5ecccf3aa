"""The checks every request mapping starts with, and their 400 messages."""

from __future__ import annotations

from typing import Any

from llmitm.translate.errors import TranslationError


def require_model(body: Any, api: str) -> str:
    """The request's model; a 400 when the body is not an object or names no model."""
    if not isinstance(body, dict):
        raise TranslationError(
            f"The request body must be a JSON object; send the {api} request as an object.",
            code=None,
        )
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise TranslationError(
            "model is required; send the model name as a string.",
            param="model",
            code="missing_required_parameter",
        )
    return model
