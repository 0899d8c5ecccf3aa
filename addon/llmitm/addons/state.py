"""What llmitm keeps on a flow (``flow.metadata["llmitm"]``) between its hooks."""

from __future__ import annotations

from dataclasses import dataclass

from llmitm.routing.plan import Plan
from llmitm.translate.context import TranslationContext

METADATA_KEY = "llmitm"


@dataclass(slots=True)
class FlowState:
    plan: Plan
    context: TranslationContext
    client_stream: bool
    streamed: bool = False
    upstream_cut: str | None = None
    """Why the upstream's stream ended early, when it did."""
