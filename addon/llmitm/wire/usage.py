"""Token usage in both APIs' shapes, converted exactly (cached and reasoning tokens kept).

Unknown usage is ``None``, never a partial object: Codex rejects a ``usage`` that lacks any of
the three totals.
"""

from __future__ import annotations

from typing import Any


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _detail(usage: dict[str, Any], details_key: str, key: str) -> int:
    details = usage.get(details_key)
    if isinstance(details, dict):
        return _int(details.get(key)) or 0
    return 0


def chat_usage_to_responses(usage: Any) -> dict[str, Any] | None:
    """``CompletionUsage`` → ``ResponseUsage``; ``None`` when the totals are not all there."""
    if not isinstance(usage, dict):
        return None
    prompt = _int(usage.get("prompt_tokens"))
    completion = _int(usage.get("completion_tokens"))
    if prompt is None or completion is None:
        return None
    total = _int(usage.get("total_tokens"))
    return {
        "input_tokens": prompt,
        # The SDK's ResponseUsage requires cache_write_tokens next to cached_tokens.
        "input_tokens_details": {
            "cached_tokens": _detail(usage, "prompt_tokens_details", "cached_tokens"),
            "cache_write_tokens": _detail(usage, "prompt_tokens_details", "cache_write_tokens"),
        },
        "output_tokens": completion,
        "output_tokens_details": {
            "reasoning_tokens": _detail(usage, "completion_tokens_details", "reasoning_tokens")
        },
        "total_tokens": total if total is not None else prompt + completion,
    }


def responses_usage_to_chat(usage: Any) -> dict[str, Any] | None:
    """``ResponseUsage`` → ``CompletionUsage``; ``None`` when the totals are not all there."""
    if not isinstance(usage, dict):
        return None
    input_tokens = _int(usage.get("input_tokens"))
    output_tokens = _int(usage.get("output_tokens"))
    if input_tokens is None or output_tokens is None:
        return None
    total = _int(usage.get("total_tokens"))
    prompt_details = {"cached_tokens": _detail(usage, "input_tokens_details", "cached_tokens")}
    cache_write = _detail(usage, "input_tokens_details", "cache_write_tokens")
    if cache_write:
        prompt_details["cache_write_tokens"] = cache_write  # optional in CompletionUsage
    return {
        "prompt_tokens": input_tokens,
        "completion_tokens": output_tokens,
        "total_tokens": total if total is not None else input_tokens + output_tokens,
        "prompt_tokens_details": prompt_details,
        "completion_tokens_details": {
            "reasoning_tokens": _detail(usage, "output_tokens_details", "reasoning_tokens")
        },
    }


def usage_tokens(usage: Any) -> tuple[int, int, int, int] | None:
    """``(input, cached, output, reasoning)`` tokens of a usage object of either API's shape
    (``prompt_tokens``… or ``input_tokens``…), through the converters above; ``None`` when
    the totals are not all there."""
    if not isinstance(usage, dict):
        return None
    if "input_tokens" in usage or "output_tokens" in usage:
        shaped = chat_usage_to_responses(responses_usage_to_chat(usage))
    else:
        shaped = chat_usage_to_responses(usage)
    if shaped is None:
        return None
    return (
        shaped["input_tokens"],
        shaped["input_tokens_details"]["cached_tokens"],
        shaped["output_tokens"],
        shaped["output_tokens_details"]["reasoning_tokens"],
    )
