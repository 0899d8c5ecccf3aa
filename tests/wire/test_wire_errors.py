"""Reading errors in every provider's spelling (wire.errors.normalise_error)."""

from __future__ import annotations

import pytest

from llmitm.wire.errors import normalise_error, responses_error_event


@pytest.mark.parametrize(
    ("code", "status", "type_"),
    [
        ("rate_limit_exceeded", 429, "rate_limit_error"),
        ("insufficient_quota", 429, "rate_limit_error"),
        ("context_length_exceeded", 400, "invalid_request_error"),
        ("something_else", 500, "server_error"),
    ],
)
def test_a_mid_stream_error_without_status_takes_it_from_its_code(
    code: str, status: int, type_: str
) -> None:
    """A flat error event has no HTTP status: its code decides (a rate limit is no 500)."""
    error = normalise_error({"code": code, "message": "m"}, 500)
    assert (error.status, error.type, error.code) == (status, type_, code)


def test_llamacpp_context_error_becomes_context_length_exceeded() -> None:
    body = {
        "error": {
            "code": 400,
            "message": "request (3024 tokens) exceeds the available context size (2048 tokens)",
            "type": "exceed_context_size_error",
        }
    }
    error = normalise_error(body)
    assert (error.status, error.code, error.type) == (
        400,
        "context_length_exceeded",
        "invalid_request_error",
    )


def test_azure_content_filter_is_non_retryable_for_responses_clients() -> None:
    body = {
        "error": {
            "code": "content_filter",
            "status": 400,
            "message": "filtered",
            "innererror": {"code": "ResponsibleAIPolicyViolation"},
        }
    }
    error = normalise_error(body)
    assert error.code == "content_filter"
    event = responses_error_event(error, 7)
    assert event["error"]["code"] == event["code"] == "invalid_prompt"
    assert event["sequence_number"] == 7


def test_an_innererror_code_of_any_json_type_does_not_crash() -> None:
    """Found by the property test of error bodies: ``innererror.code`` was a list."""
    for odd in ([], [1], {}, 3, None):
        error = normalise_error({"error": {"message": "m", "innererror": {"code": odd}}}, 400)
        assert error.status == 400 and error.code is None
