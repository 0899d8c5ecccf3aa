"""translate_error_body: any upstream error body → an OpenAI error body for either API."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai.types import ErrorObject

from llmitm.translate.error_bodies import MAX_MESSAGE_CHARS, translate_error_body
from tests.helpers._fixtures_body import load_real, load_real_bytes, real_cases

APIS = ("chat", "responses")

AZURE_CONTENT_FILTER = {
    "error": {
        "message": "The response was filtered due to the prompt triggering Azure OpenAI's "
        "content management policy.",
        "type": None,
        "param": "prompt",
        "code": "content_filter",
        "status": 400,
        "innererror": {
            "code": "ResponsibleAIPolicyViolation",
            "content_filter_result": {
                "hate": {"filtered": False, "severity": "safe"},
                "jailbreak": {"filtered": True, "detected": True},
                "self_harm": {"filtered": False, "severity": "safe"},
                "sexual": {"filtered": False, "severity": "safe"},
                "violence": {"filtered": False, "severity": "safe"},
            },
        },
    }
}


def _error(body: dict[str, Any]) -> ErrorObject:
    """The ``error`` object, validated by the SDK's own error type."""
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return ErrorObject.model_validate(body["error"])


@pytest.mark.parametrize("to", APIS)
@pytest.mark.parametrize(
    "name", real_cases("responses", errors=True) + real_cases("chat", errors=True)
)
def test_checklist_23_real_error_bodies(name: str, to: str) -> None:
    _, meta = load_real(name)
    raw = load_real_bytes(name)
    status, body = translate_error_body(raw, meta["http"]["status"], to)
    error = _error(body)
    assert status == meta["http"]["status"]
    assert error.message == orjson.loads(raw)["error"]["message"]


@pytest.mark.parametrize("to", APIS)
def test_checklist_23_llamacpp_context_size_is_context_length_exceeded(to: str) -> None:
    raw = load_real_bytes("llamacpp-gemma270m-responses-ctx-error")
    status, body = translate_error_body(raw, 400, to)
    error = _error(body)
    assert status == 400
    assert error.code == "context_length_exceeded"
    assert error.type == "invalid_request_error"
    assert "exceeds the available context size" in error.message


def test_checklist_23_azure_content_filter_for_chat_clients() -> None:
    status, body = translate_error_body(orjson.dumps(AZURE_CONTENT_FILTER), 400, "chat")
    error = _error(body)
    assert (status, error.code, error.param, error.type) == (
        400,
        "content_filter",
        "prompt",
        "invalid_request_error",
    )
    assert error.message.startswith("The response was filtered")


def test_checklist_23_azure_content_filter_is_non_retryable_for_responses_clients() -> None:
    status, body = translate_error_body(AZURE_CONTENT_FILTER, 400, "responses")
    error = _error(body)
    # Codex retries unknown codes five times; invalid_prompt is OpenAI's final verdict.
    assert (status, error.code, error.param) == (400, "invalid_prompt", "prompt")


@pytest.mark.parametrize("to", APIS)
@pytest.mark.parametrize(
    ("body", "status", "expected"),
    [
        (
            {
                "error": {
                    "message": "Rate limit reached for gpt-4o",
                    "type": "requests",
                    "param": None,
                    "code": "rate_limit_exceeded",
                }
            },
            429,
            (429, "requests", "rate_limit_exceeded", None),
        ),
        (
            {
                "error": {
                    "message": "Invalid value for 'temperature'",
                    "type": "invalid_request_error",
                    "param": "temperature",
                    "code": "invalid_value",
                }
            },
            400,
            (400, "invalid_request_error", "invalid_value", "temperature"),
        ),
        (
            {
                "error": {
                    "message": "This model's maximum context length is 128000 tokens.",
                    "type": "invalid_request_error",
                    "param": "messages",
                    "code": "context_length_exceeded",
                }
            },
            400,
            (400, "invalid_request_error", "context_length_exceeded", "messages"),
        ),
        # A server that reports context overflow as a 500: retrying cannot help.
        (
            {"error": {"message": "prompt is too long: maximum context length exceeded"}},
            500,
            (400, "invalid_request_error", "context_length_exceeded", None),
        ),
        (
            {"error": {"message": "Incorrect API key provided", "code": "invalid_api_key"}},
            401,
            (401, "authentication_error", "invalid_api_key", None),
        ),
        # vLLM's flat error object.
        (
            {"object": "error", "message": "model not loaded", "type": "NotFoundError",
             "param": None, "code": 404},
            404,
            (404, "NotFoundError", None, None),
        ),
        # Ollama and many small servers: a bare string.
        ({"error": "model 'llama9' not found"}, 404, (404, "not_found_error", None, None)),
        ({"detail": "Not Found"}, 404, (404, "not_found_error", None, None)),
        # An error inside a 2xx body takes the status it names.
        (
            {"error": {"code": 502, "message": "Provider returned error"}},
            200,
            (502, "server_error", None, None),
        ),
        ({"error": {"message": "overloaded"}}, 200, (500, "server_error", None, None)),
    ],
    ids=["openai-429", "openai-400", "openai-context", "context-as-500", "auth", "vllm-flat",
         "error-string", "fastapi-detail", "error-in-200", "bare-error-in-200"],
)  # fmt: skip
def test_json_error_bodies(
    body: dict[str, Any], status: int, expected: tuple[Any, ...], to: str
) -> None:
    out_status, out = translate_error_body(orjson.dumps(body), status, to)
    error = _error(out)
    assert (out_status, error.type, error.code, error.param) == expected
    message = body.get("error") or body.get("message") or body.get("detail")
    if isinstance(message, dict):
        message = message["message"]
    assert error.message == message


def test_fastapi_validation_detail_list() -> None:
    body = {"detail": [{"loc": ["body", "model"], "msg": "field required", "type": "missing"}]}
    status, out = translate_error_body(body, 422, "chat")
    error = _error(out)
    assert (status, error.type, error.message) == (422, "invalid_request_error", "field required")


@pytest.mark.parametrize("to", APIS)
@pytest.mark.parametrize(
    ("raw", "status", "message"),
    [
        (b"Bad Gateway", 502, "Bad Gateway"),
        ("upstream timed out\n", 504, "upstream timed out"),
        (b"", 503, "Upstream returned HTTP 503 with an empty body."),
        (b"\xff\xfe not utf-8", 500, "\ufffd\ufffd not utf-8"),
        (b"[1, 2]", 500, "[1,2]"),
        (b'"just a string"', 400, "just a string"),
    ],
)
def test_non_json_or_odd_bodies(raw: bytes | str, status: int, message: str, to: str) -> None:
    out_status, out = translate_error_body(raw, status, to)
    error = _error(out)
    assert out_status == status
    assert error.message == message
    assert error.type == ("invalid_request_error" if status == 400 else "server_error")


def test_html_error_page_is_cut() -> None:
    page = ("<html><body>" + "x" * 10_000 + "</body></html>").encode()
    _, out = translate_error_body(page, 502, "chat")
    message = _error(out).message
    assert message.startswith("<html><body>xxx")
    assert len(message) == MAX_MESSAGE_CHARS + 1


def test_unknown_target_api_is_refused() -> None:
    with pytest.raises(ValueError, match="chat"):
        translate_error_body(b"x", 500, "completions")  # type: ignore[arg-type]


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.sampled_from(["error", "message", "code", "type", "status",
                                       "param", "detail", "innererror"]), children, max_size=4),
    max_leaves=12,
)  # fmt: skip


@given(
    st.binary() | st.text() | _json.map(orjson.dumps),
    st.integers(100, 599),
    st.sampled_from(APIS),
)
def test_any_body_gives_a_well_formed_error(raw: bytes | str, status: int, to: str) -> None:
    out_status, out = translate_error_body(raw, status, to)
    error = _error(out)
    assert 400 <= out_status <= 599
    assert error.message
    assert isinstance(error.type, str) and error.type
    if 400 <= status <= 599 and error.code != "context_length_exceeded":
        assert out_status == status
    orjson.dumps(out)  # serialisable as it stands
