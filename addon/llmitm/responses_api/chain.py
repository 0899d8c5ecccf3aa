"""A stored ancestor chain → the items the next request continues from.

``previous_response_id=P`` means: the input and output items of P's ancestors and of P, in
order, then the new input. Only those ancestors — branching from an older id leaves out
whatever was built on it later — and no ``instructions`` of theirs (OpenAI's documented
rule: a new request's instructions replace them).
"""

from __future__ import annotations

from typing import Any

from llmitm.responses_api.records import StoredResponse

# Keys of stored items that are bookkeeping, not conversation.
_DROP = ("id", "status")


def history_items(chain: list[StoredResponse]) -> list[dict[str, Any]]:
    """Input then output items of each response, oldest first, without ids: inlined into a
    request they are conversation, not references to stored items."""
    items: list[dict[str, Any]] = []
    for record in chain:
        output = record.response.get("output")
        for item in [*record.input_items, *(output if isinstance(output, list) else [])]:
            if isinstance(item, dict):
                items.append({k: v for k, v in item.items() if k not in _DROP})
    return items
