"""Classifying request paths of both APIs in OpenAI and both Azure forms."""

from __future__ import annotations

import pytest

from llmitm.wire.paths import ClassifiedPath, classify_path, is_llm_call, translated_path


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/v1/chat/completions", ClassifiedPath("chat", "openai", "/v1")),
        ("/v1/responses", ClassifiedPath("responses", "openai", "/v1")),
        ("/api/v1/responses/", ClassifiedPath("responses", "openai", "/api/v1")),
        (
            "/openai/deployments/gpt-5-codex/chat/completions?api-version=2024-10-21",
            ClassifiedPath("chat", "azure-classic", "", "gpt-5-codex", "2024-10-21"),
        ),
        (
            "/openai/responses?api-version=2025-04-01-preview",
            ClassifiedPath("responses", "azure-classic", "", None, "2025-04-01-preview"),
        ),
        ("/openai/v1/responses", ClassifiedPath("responses", "azure-v1", "")),
        (
            "/openai/v1/chat/completions?api-version=preview",
            ClassifiedPath("chat", "azure-v1", "", None, "preview"),
        ),
    ],
)
def test_create_calls_are_classified(path: str, expected: ClassifiedPath) -> None:
    assert classify_path(path) == expected


@pytest.mark.parametrize(
    "path",
    [
        "/v1/models",
        "/v1/embeddings",
        "/v1/responses/resp_1",
        "/v1/responses/resp_1/input_items",
        "/openai/deployments/d/embeddings?api-version=2024-10-21",
        "/v1/files",
    ],
)
def test_everything_else_is_not_a_create_call(path: str) -> None:
    assert classify_path(path) is None


def test_checklist_39_azure_deployment_chat_path_becomes_responses_with_model() -> None:
    """Dir 1 Azure …/deployments/{dep}/chat/completions?api-version=X → the Responses URL, with
    the deployment as the body's model (the Responses API takes it there)."""
    classified = classify_path(
        "/openai/deployments/codex-mini/chat/completions?api-version=2025-04-01-preview"
    )
    assert classified is not None
    path, model = translated_path(classified, "responses")
    assert path == "/openai/responses?api-version=2025-04-01-preview"
    assert model == "codex-mini"


def test_old_chat_api_version_is_raised_to_one_that_knows_responses() -> None:
    classified = classify_path("/openai/deployments/d/chat/completions?api-version=2024-10-21")
    assert classified is not None
    path, _model = translated_path(classified, "responses")
    assert path == "/openai/responses?api-version=2025-04-01-preview"


def test_openai_and_azure_v1_paths_swap_the_api_part_only() -> None:
    openai_path = classify_path("/v1/responses")
    assert openai_path is not None
    assert translated_path(openai_path, "chat") == ("/v1/chat/completions", None)
    azure_v1 = classify_path("/openai/v1/chat/completions")
    assert azure_v1 is not None
    assert translated_path(azure_v1, "responses") == ("/openai/v1/responses", None)


def test_azure_classic_responses_to_chat_needs_a_deployment() -> None:
    classified = classify_path("/openai/responses?api-version=2025-04-01-preview")
    assert classified is not None
    with pytest.raises(ValueError, match="deployment"):
        translated_path(classified, "chat")


@pytest.mark.parametrize(
    "path",
    [
        "/v1/chat/completions",
        "/v1/responses",
        "/gateway/v1/responses?x=1",
        "/openai/deployments/d/chat/completions?api-version=2024-10-21",
        "/openai/v1/responses",
        "/v1/responses/resp_1",
        "/v1/responses/resp_1/input_items?limit=2",
        "/v1/responses/resp_1/cancel",
        "/openai/responses/resp_1?api-version=2025-04-01-preview",
        "/v1/responses/compact",
        "/v1/responses/input_tokens",
        "/v1/chat/completions/chatcmpl-1/messages",
        "/llmitm-scope/t%3A%3Aa/v1/chat/completions",
    ],
)
def test_llm_calls_are_told_by_path(path: str) -> None:
    assert is_llm_call(path)


@pytest.mark.parametrize(
    "path",
    [
        "/otlp/v1/metrics",
        "/v1/traces/ingest",
        "/repos/openai/plugins",
        "/v1/models",
        "/v1/files",
        "/openai/deployments/d/embeddings?api-version=2024-10-21",
        "/v1/responses/resp_1/other",
        "/backend-api/codex/analytics?to=/v1/responses",
    ],
)
def test_telemetry_lookups_and_other_apis_are_not_llm_calls(path: str) -> None:
    assert not is_llm_call(path)
