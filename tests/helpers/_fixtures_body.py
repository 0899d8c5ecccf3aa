"""Shared helpers of the non-streamed body tests.

Real captured bodies are read in place from ``shared/fixtures/real/`` next to the repository
(never copied in); a checkout without them skips those cases. The openai SDK's pydantic types
are the oracle: every translated body must validate, and must not carry keys the types do not
know (the SDK accepts unknown keys silently, which would hide a misspelt field).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from openai import BaseModel as SdkModel
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from llmitm.translate.context import TranslateOptions, TranslationContext
from llmitm.wire.ids import CountingIds, fixed_clock
from llmitm.wire.modes import ReasoningMode

REAL = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "real"
NOW = 1_800_000_000.0
MODES: tuple[ReasoningMode, ...] = ("think-tags", "reasoning_content", "reasoning", "drop")


def context(
    reasoning: ReasoningMode = "think-tags",
    *,
    think_open_missing: bool = False,
    **fields: Any,
) -> TranslationContext:
    """A context with deterministic ids (``resp_0001``, ``msg_0002``…) and a frozen clock."""
    options = TranslateOptions(
        reasoning=reasoning,
        think_open_missing=think_open_missing,
        ids=CountingIds(),
        clock=fixed_clock(NOW),
    )
    return TranslationContext(options=options, **fields)


def _meta(body_path: Path) -> dict[str, Any]:
    meta_path = body_path.with_name(body_path.name[: -len(".json")] + ".meta.json")
    return orjson.loads(meta_path.read_bytes()) if meta_path.exists() else {}


def _is_body(path: Path) -> bool:
    return not path.name.endswith((".request.json", ".meta.json"))


def real_cases(api: str, *, errors: bool = False) -> list[Any]:
    """pytest params of the real non-streamed bodies of ``api`` (``chat`` / ``responses``).

    ``errors`` selects the HTTP error bodies instead of the 2xx ones. Without the fixtures
    directory the single param skips, so the test shows up as skipped rather than vanishing.
    """
    if not REAL.is_dir():
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"{REAL} not present"))]
    names = []
    for path in sorted(REAL.glob("*.json")):
        if not _is_body(path):
            continue
        meta = _meta(path)
        status = (meta.get("http") or {}).get("status", 200)
        if meta.get("api") == api and (status >= 400) == errors:
            names.append(pytest.param(path.name[: -len(".json")], id=path.name))
    return names


def load_real(name: str) -> tuple[Any, dict[str, Any]]:
    """The parsed body and its sidecar metadata."""
    path = REAL / f"{name}.json"
    if not path.exists():
        pytest.skip(f"{path} not present")
    return orjson.loads(path.read_bytes()), _meta(path)


def load_real_bytes(name: str) -> bytes:
    path = REAL / f"{name}.json"
    if not path.exists():
        pytest.skip(f"{path} not present")
    return path.read_bytes()


def _extras(model: Any, where: str, allowed: frozenset[tuple[str, str]]) -> list[str]:
    """Keys the SDK types do not declare, except ``(class name, key)`` pairs in ``allowed``."""
    found: list[str] = []
    if isinstance(model, SdkModel):
        for key in model.model_extra or {}:
            if (type(model).__name__, key) not in allowed:
                found.append(f"{where}.{key}")
        for name in type(model).model_fields:
            found += _extras(getattr(model, name), f"{where}.{name}", allowed)
    elif isinstance(model, list):
        for index, value in enumerate(model):
            found += _extras(value, f"{where}[{index}]", allowed)
    return found


# llmitm's reasoning fields for chat clients (the configured reasoning mode).
CHAT_EXTRAS = frozenset(
    {("ChatCompletionMessage", "reasoning_content"), ("ChatCompletionMessage", "reasoning")}
)
# Fields the live API sends that the SDK's output types do not declare: `store` (see the
# real fixtures) and `status` on custom_tool_call (declared on the stored-item type
# ResponseCustomToolCallItem; the shared item builders write it).
RESPONSE_EXTRAS = frozenset({("Response", "store"), ("ResponseCustomToolCall", "status")})


def validate_chat(body: dict[str, Any]) -> ChatCompletion:
    """The SDK's ``ChatCompletion`` of ``body``; the reasoning fields are llmitm's only extras."""
    # Round-trip through JSON first: the proxy sends bytes, not dicts.
    completion = ChatCompletion.model_validate(orjson.loads(orjson.dumps(body)))
    assert _extras(completion, "completion", CHAT_EXTRAS) == []
    return completion


def validate_response(body: dict[str, Any]) -> Response:
    """The SDK's ``Response`` of ``body``, with no undeclared keys but the known ones."""
    response = Response.model_validate(orjson.loads(orjson.dumps(body)))
    assert _extras(response, "response", RESPONSE_EXTRAS) == []
    return response
