"""Recording and replay of LLM API flows: the flow recorder, the recordings load and the
record tap (:mod:`llmitm.addons.record.recorder`)."""

from __future__ import annotations

from llmitm.addons.record.recorder import (
    Capture,
    LlmRecorder,
    LlmRecordingsLoad,
    LlmRecordTap,
    replay_hit,
)

__all__ = ["Capture", "LlmRecordTap", "LlmRecorder", "LlmRecordingsLoad", "replay_hit"]
