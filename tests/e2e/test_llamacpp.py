"""A real backend through a real llmitm process: llama.cpp's server on Gemma-3-270M.

Three endpoints point at the same llama.cpp server, one per way of using it:

- ``via-responses*``: a chat client over llama.cpp's ``/v1/responses`` (``apis =
  ["responses"]``): llmitm translates chat → Responses and
  llama.cpp's non-conformant Responses answers back into chat completions and chunks;
- ``via-chat*``: a Responses client (the SDK, Codex) over llama.cpp's ``/v1/chat/completions``
  (``apis = ["chat"]``): its chat answers become spec-conformant Responses streams;
- ``normalised*``: a Responses client over llama.cpp's OWN Responses API, normalised (as
  every compatible endpoint's is, by default): the SDK's ``responses.stream()`` helper, which
  crashes on llama.cpp's raw stream (no ``sequence_number``/``output_index``), works; ``raw*``
  is the same endpoint trusted with ``conformant = ["responses"]``, the control on which the
  helper still fails.

The model is tiny and babbles: the tests assert on structure (non-empty text, status, finish
reasons), never on content. It also never ends a turn by itself (it writes ChatML's end
marker as text), so every chat answer is cut by ``max_tokens``/the server's ``n_predict`` and
comes back from the chat endpoint as ``finish_reason: "length"`` — which llmitm correctly
turns into ``response.incomplete``, and the SDK's ``get_final_response()`` and Codex both treat
as a failure. Where a Responses client needs a completed turn, the request carries a JSON
schema with a short string (``text.format``, Codex's ``--output-schema``): llmitm maps it to
``response_format``, llama.cpp's grammar makes the model stop after the closing brace, and the
turn ends with ``finish_reason: "stop"``. (llama.cpp's own Responses API reports
``completed`` even for a cut answer, so the chat client needs no such help.)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import openai
import pytest

from .conftest import CodexResult
from .processes import Proxy, llmitm_proxy

pytestmark = pytest.mark.slow

CONFIG = """
[endpoints.llama-responses]
kind = "compatible"
base_url = "{llama}/v1"
apis = ["responses"]

[endpoints.llama-chat]
kind = "compatible"
base_url = "{llama}/v1"
apis = ["chat"]

[endpoints.llama-raw]
kind = "compatible"
base_url = "{llama}/v1"
apis = ["responses"]
conformant = ["responses"]

[[routes]]
models = ["via-responses*", "normalised*"]
endpoints = ["llama-responses"]

[[routes]]
models = ["via-chat*"]
endpoints = ["llama-chat"]

[[routes]]
models = ["raw*"]
endpoints = ["llama-raw"]
"""

MESSAGES = [{"role": "user", "content": "Say hi"}]
FINISHED = ("stop", "length")
# A JSON answer with one short string: llama.cpp turns the schema into a grammar, so the model
# has to close the object and stop (finish_reason "stop") well within n_predict.
GREETING_SCHEMA = {
    "type": "object",
    "properties": {"greeting": {"type": "string", "maxLength": 12}},
    "required": ["greeting"],
    "additionalProperties": False,
}
GREETING_FORMAT = {
    "format": {"type": "json_schema", "name": "greeting", "schema": GREETING_SCHEMA, "strict": True}
}


@pytest.fixture(scope="module")
def proxy(llama_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    tmp = tmp_path_factory.mktemp("llamacpp")
    with llmitm_proxy(tmp, config=CONFIG.format(llama=llama_server)) as proxy:
        yield proxy
        assert "Traceback" not in proxy.log_text(), proxy.log_text()[-3000:]


@pytest.fixture
def client(proxy: Proxy) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=proxy.base_url(), api_key="sk-llama", max_retries=0, timeout=120
    ) as client:
        yield client


# -- a chat client over llama.cpp's /v1/responses ---------------------------------------------


def test_chat_stream_helper_over_llama_responses(client: openai.OpenAI) -> None:
    with client.chat.completions.stream(
        model="via-responses", messages=MESSAGES, max_tokens=16
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_completion()
    assert kinds[0] == "chunk" and "content.delta" in kinds and "content.done" in kinds
    assert final.choices[0].message.content
    assert final.choices[0].finish_reason in FINISHED
    assert final.model == "via-responses"


def test_chat_create_stream_over_llama_responses(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="via-responses",
            messages=MESSAGES,
            max_tokens=16,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert text
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [f for f in finishes if f] == [finishes[-1]] and finishes[-1] in FINISHED
    assert len({c.id for c in chunks}) == 1
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None and usage.completion_tokens > 0


def test_chat_create_over_llama_responses(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model="via-responses", messages=MESSAGES, max_tokens=16
    )
    assert completion.object == "chat.completion"
    assert completion.choices[0].message.role == "assistant"
    assert completion.choices[0].message.content
    assert completion.choices[0].finish_reason in FINISHED
    assert completion.usage is not None and completion.usage.completion_tokens > 0


# -- a Responses client over llama.cpp's /v1/chat/completions ---------------------------------


def test_responses_stream_helper_over_llama_chat(client: openai.OpenAI) -> None:
    with client.responses.stream(
        model="via-chat", input="Say hi", text=GREETING_FORMAT, max_output_tokens=48
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert final.status == "completed"
    assert [item.type for item in final.output] == ["message"]
    assert isinstance(json.loads(final.output_text)["greeting"], str)
    assert final.usage is not None and final.usage.output_tokens > 0


def test_responses_create_over_llama_chat(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model="via-chat", input="Say hi", text=GREETING_FORMAT, max_output_tokens=48
    )
    assert response.status == "completed"
    assert isinstance(json.loads(response.output_text)["greeting"], str)
    # Without a schema the model runs into the limit: a cut chat answer is an incomplete
    # response, as OpenAI would say it.
    cut = client.responses.create(model="via-chat", input="Say hi", max_output_tokens=8)
    assert cut.status == "incomplete"
    assert cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens"
    assert cut.output_text


# -- llama.cpp's own Responses stream, normalised ----------------------------------------------


def test_responses_stream_helper_over_normalised_llama_responses(client: openai.OpenAI) -> None:
    """The helper needs ``sequence_number``/``output_index``, which llama.cpp leaves out: a
    compatible endpoint's stream is normalised by default."""
    with client.responses.stream(
        model="normalised", input="Say hi", max_output_tokens=16
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [event.type for event in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert [event.sequence_number for event in events] == list(range(len(events)))
    added = [event for event in events if event.type == "response.output_item.added"]
    assert [event.output_index for event in added] == list(range(len(added)))
    assert final.status == "completed"
    assert final.output_text
    assert final.id == events[0].response.id


def test_without_normalisation_the_helper_fails(client: openai.OpenAI) -> None:
    """The control: the same endpoint trusted (``conformant``) passes llama.cpp's stream
    through as is, and the helper cannot read it (no output_index: a TypeError)."""
    with (
        pytest.raises(TypeError),
        client.responses.stream(model="raw", input="Say hi", max_output_tokens=8) as stream,
    ):
        for _event in stream:
            pass
        stream.get_final_response()


# -- Codex over llama.cpp's /v1/chat/completions ----------------------------------------------


def test_codex_says_hi_over_llama_chat(
    proxy: Proxy, run_codex: Callable[..., CodexResult], tmp_path: Path
) -> None:
    """Codex's ~40 KB first request (tools, developer messages, web_search) reaches llama.cpp as
    a chat request that fits its context; the answer ends the turn. ``--output-schema`` makes
    the babbling model stop (see the module docstring): without it every answer is cut, and
    Codex rightly fails on the incomplete response."""
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(GREETING_SCHEMA))
    result = run_codex(
        "Say hi",
        proxy.base_url(),
        tmp_path / "work",
        timeout=300,  # ~4,500 prompt tokens: ~15 s on 2 idle cores, over a minute when busy
        model="via-chat",
        extra_args=["--output-schema", str(schema)],
    )
    output = f"--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-3000:]}"
    assert result.returncode == 0, output
    assert isinstance(json.loads(result.stdout)["greeting"], str), output
    assert "ERROR" not in result.stderr, output
