"""Responses compaction emulated for endpoints without one (``responses_api.compaction``):
the compaction request → the summarisation request, the summary → the compaction answer
(judged by the openai SDK's own types and stream helper), and a later request's compaction
item → the summary message a chat or Responses backend takes. Property tests close it."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.responses import CompactedResponse, ResponseCompactionItem

from llmitm.responses_api.compaction import (
    COMPACTION,
    MAX_BLOCK_CHARS,
    SUMMARY_INSTRUCTIONS,
    SUMMARY_PREFIX,
    CompactionCall,
    CompactionError,
    compacted_response,
    compaction_item,
    create_path,
    drop_unopened,
    event_stream,
    has_trigger,
    restore_compactions,
    summary_request,
    summary_text,
    transcript,
    triggered_events,
    triggered_response,
)
from llmitm.responses_api.seal import ReasoningSeal
from llmitm.translate.context import TranslateOptions
from llmitm.translate.request_to_chat import responses_request_to_chat
from llmitm.wire.ids import CountingIds
from llmitm.wire.objects import message_item, output_text_part, reasoning_item, response_object
from llmitm.wire.paths import classify_path
from tests.helpers.oracle import client_serving, sdk_responses_stream

SEAL = ReasoningSeal(b"c" * 32)
OPTIONS = TranslateOptions()


def user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


# A history shaped like Codex 0.171's compaction request (remote_compaction_v2): tools inside an
# additional_tools item, a configuration_update, a tool round trip, and the trigger last.
CODEX_INPUT = [
    {"type": "additional_tools", "role": "developer", "tools": [{"type": "function", "name": "x"}]},
    {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Rules."}]},
    user("<environment_context>cwd</environment_context>"),
    user("List the files."),
    {"type": "configuration_update", "reasoning": {"effort": "low"}},
    {"type": "reasoning", "summary": [], "encrypted_content": "opaque-thought"},
    {
        "type": "function_call",
        "call_id": "call_1",
        "name": "exec_command",
        "arguments": '{"cmd":"ls"}',
    },
    {"type": "function_call_output", "call_id": "call_1", "output": "README.md\nsetup.py"},
    {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "There are two files."}],
    },
    {"type": "compaction_trigger"},
]


def codex_body(**extra: object) -> dict:
    return {
        "model": "gpt-test",
        "instructions": "You are Codex.",
        "input": [dict(item) for item in CODEX_INPUT],
        "stream": True,
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "session-1",
        **extra,
    }


def summarised(text: str = "The user listed files: README.md, setup.py.") -> dict:
    """The translated answer of the summarisation call, as LlmStreamTranslator hands it on."""
    response = response_object(
        response_id="resp_0001", created_at=1_700_000_000, model="gpt-test", status="completed"
    )
    response["output"] = [
        reasoning_item("rs_1", ["Thinking about it."], "completed"),
        message_item("msg_1", [output_text_part(text)], "completed"),
    ]
    response["usage"] = {
        "input_tokens": 120,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 12,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 132,
    }
    return response


# --- which requests are compactions ---------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/v1/responses/compact", "/v1/responses"),
        ("/v1/responses/compact/", "/v1/responses"),
        ("/gateway/v1/responses/compact", "/gateway/v1/responses"),
        ("/openai/v1/responses/compact", "/openai/v1/responses"),
        (
            "/openai/responses/compact?api-version=2025-04-01-preview",
            "/openai/responses?api-version=2025-04-01-preview",
        ),
        ("/v1/responses", None),
        ("/v1/responses/resp_123", None),
        ("/v1/responses/compact/input_items", None),
        ("/v1/chat/completions", None),
    ],
)
def test_a_compact_path_maps_to_the_create_path_of_the_same_form(
    path: str, expected: str | None
) -> None:
    assert create_path(path) == expected
    if expected is not None:
        classified = classify_path(expected)
        assert classified is not None and classified.api == "responses"


def test_a_trigger_item_marks_a_create_call_as_a_compaction() -> None:
    assert has_trigger(codex_body())
    assert not has_trigger({"input": [user("hi")]})
    assert not has_trigger({"input": "compaction_trigger"})
    assert not has_trigger({"input": None})


# --- the summarisation request ---------------------------------------------------------------


def test_a_codex_compaction_becomes_a_plain_summarisation_request() -> None:
    request, call = summary_request(codex_body(), "trigger")

    assert set(request) == {"model", "instructions", "input", "stream", "store"}
    assert request["model"] == "gpt-test"
    assert request["instructions"] == SUMMARY_INSTRUCTIONS
    assert request["stream"] is False and request["store"] is False
    [message] = request["input"]
    assert message["role"] == "user"
    text = message["content"][0]["text"]
    for expected in (
        "[developer]\nRules.",
        "[user]\nList the files.",
        '[assistant called tool exec_command]\n{"cmd":"ls"}',
        "[tool output for call call_1]\nREADME.md\nsetup.py",
        "[assistant]\nThere are two files.",
    ):
        assert expected in text
    # Bookkeeping items and the model's private reasoning are not conversation.
    for absent in ("opaque-thought", "additional_tools", "configuration_update", "trigger"):
        assert absent not in text
    assert call.form == "trigger" and call.stream is True and call.kept == ()
    assert call.echo["instructions"] == "You are Codex."
    assert call.echo["prompt_cache_key"] == "session-1"

    # The chat translation of it is two messages and nothing a small backend could refuse.
    chat = responses_request_to_chat(request, OPTIONS).body
    assert [m["role"] for m in chat["messages"]] == ["system", "user"]
    assert "tools" not in chat


def test_the_clients_output_limit_bounds_the_summary() -> None:
    request, _call = summary_request(codex_body(max_output_tokens=300), "trigger")
    assert request["max_output_tokens"] == 300
    request, _call = summary_request(codex_body(max_output_tokens=None), "trigger")
    assert "max_output_tokens" not in request


def test_a_compact_call_keeps_the_user_messages_for_its_output() -> None:
    body = {"model": "m", "input": [*CODEX_INPUT[:-1]], "instructions": "Be brief."}
    _request, call = summary_request(body, "compact")
    assert call.form == "compact" and call.stream is False
    assert [item["content"][0]["text"] for item in call.kept] == [
        "<environment_context>cwd</environment_context>",
        "List the files.",
    ]
    # A string input is one user message.
    _request, call = summary_request({"model": "m", "input": "Hello there."}, "compact")
    assert [item["content"][0]["text"] for item in call.kept] == ["Hello there."]


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"input": [user("hi")]}, "model", "missing_required_parameter"),
        ({"model": 3, "input": [user("hi")]}, "model", "missing_required_parameter"),
        ({"model": "m", "input": [user("hi"), "oops"]}, "input", None),
        ({"model": "m", "input": {"role": "user"}}, "input", None),
        ({"model": "m", "input": []}, "input", None),
        ({"model": "m", "input": [{"type": "compaction_trigger"}]}, "input", None),
    ],
)
def test_a_compaction_openai_would_refuse_gets_its_400(
    body: dict, param: str, code: str | None
) -> None:
    with pytest.raises(CompactionError) as raised:
        summary_request(body, "compact")
    error = raised.value.error
    assert (error.status, error.type, error.param, error.code) == (
        400,
        "invalid_request_error",
        param,
        code,
    )


def test_an_unknown_item_kind_keeps_its_text() -> None:
    text = transcript(
        [
            {"type": "web_search_call", "id": "ws_1", "status": "completed"},
            {"type": "agent_message", "content": [{"type": "input_text", "text": "From b."}]},
            {"type": "local_shell_call_output", "call_id": "c", "output": "done"},
        ]
    )
    assert text == "[agent_message]\nFrom b.\n\n[local_shell_call_output]\ndone"


def test_a_long_tool_output_is_clipped_to_its_start_and_end() -> None:
    output = "BEGIN " + "x" * 50_000 + " END"
    text = transcript([{"type": "function_call_output", "call_id": "c", "output": output}])
    assert len(text) < MAX_BLOCK_CHARS + 200
    assert "BEGIN" in text and text.endswith("END")
    assert "characters left out" in text


def test_media_and_foreign_compactions_become_markers() -> None:
    text = transcript(
        [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Look:"},
                    {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
                    {"type": "input_file", "filename": "a.pdf", "file_data": "AAAA"},
                ],
            },
            {"type": "compaction", "encrypted_content": "someone-elses-token"},
        ]
    )
    assert "[user]\nLook:\n[image]\n[file a.pdf]" in text
    assert "AAAA" not in text and "someone-elses-token" not in text
    assert "compacted elsewhere" in text


# --- the answers ---------------------------------------------------------------------------


def test_the_summary_is_the_answers_message_text_only() -> None:
    assert summary_text(summarised("  Summary.  ")) == "Summary."
    assert summary_text({"output": [reasoning_item("rs", ["only thoughts"])]}) == ""
    assert summary_text({"error": {"message": "no"}}) == ""
    assert summary_text(None) == ""


def test_a_compact_answer_is_the_sdks_compacted_response() -> None:
    body = {"model": "m", "input": [*CODEX_INPUT[:-1]]}
    _request, call = summary_request(body, "compact")
    token = SEAL.seal_text("Summary.", COMPACTION)
    result = compacted_response(summarised(), call, compaction_item("cmp_1", token), CountingIds())

    client = client_serving(orjson.dumps(result), "application/json")
    parsed = client.responses.compact(model="m", input=body["input"])
    assert isinstance(parsed, CompactedResponse)
    assert parsed.object == "response.compaction"
    assert parsed.id == "resp_0001" and parsed.usage.total_tokens == 132
    *kept, item = parsed.output
    assert [message.role for message in kept] == ["user", "user"]
    assert isinstance(item, ResponseCompactionItem)
    assert item.encrypted_content == token and "Summary" not in token


def test_a_summary_cut_by_the_token_limit_still_completes_the_compaction() -> None:
    _request, call = summary_request(codex_body(), "trigger")
    cut = {**summarised(), "status": "incomplete"}
    cut["incomplete_details"] = {"reason": "max_output_tokens"}
    response = triggered_response(cut, call, compaction_item("cmp_1", "t"))
    assert (response["status"], response["incomplete_details"]) == ("completed", None)


def test_a_triggered_stream_is_what_the_sdk_and_codex_accept() -> None:
    _request, call = summary_request(codex_body(), "trigger")
    token = SEAL.seal_text("Summary.", COMPACTION)
    response = triggered_response(summarised(), call, compaction_item("cmp_1", token))
    sse = event_stream(triggered_events(response))

    events, final = sdk_responses_stream(sse)
    assert [event.type for event in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.output_item.done",
        "response.completed",
    ]
    assert [event.sequence_number for event in events] == [0, 1, 2, 3, 4]
    # Codex wants exactly one output item of type compaction, then response.completed.
    done = [event.item for event in events if event.type == "response.output_item.done"]
    assert [item.type for item in done] == ["compaction"]
    assert final is not None and final.status == "completed"
    assert [item.type for item in final.output] == ["compaction"]
    assert final.output[0].encrypted_content == token
    # It repeats the client's request, not the summariser's.
    assert final.instructions == "You are Codex."
    assert final.prompt_cache_key == "session-1"
    assert final.usage is not None and final.usage.output_tokens == 12


# --- the item in later requests --------------------------------------------------------------


def test_a_sealed_summary_comes_back_as_a_user_message() -> None:
    token = SEAL.seal_text("We listed the files.", COMPACTION)
    items = [user("List the files."), compaction_item("cmp_1", token), user("Next step?")]
    assert restore_compactions(items, SEAL) == 1
    assert items[1] == user(f"{SUMMARY_PREFIX}We listed the files.")
    # Toward a chat backend it is an ordinary user turn.
    chat = responses_request_to_chat({"model": "m", "input": items}, OPTIONS).body
    assert chat["messages"][1] == {
        "role": "user",
        "content": f"{SUMMARY_PREFIX}We listed the files.",
    }


def test_only_llmitms_compaction_tokens_open() -> None:
    reasoning_token = SEAL.seal({"summary": [{"type": "summary_text", "text": "a thought"}]})
    other_key = ReasoningSeal(b"o" * 32).seal_text("theirs", COMPACTION)
    items = [
        {"type": "compaction", "encrypted_content": reasoning_token},
        {"type": "compaction", "encrypted_content": other_key},
        {"type": "compaction", "encrypted_content": 42},
        {"type": "compaction"},
    ]
    before = orjson.dumps(items)
    assert restore_compactions(items, SEAL) == 0
    assert orjson.dumps(items) == before  # another provider's items are left for its endpoint
    # Nor does a compaction token open as reasoning.
    assert SEAL.open(SEAL.seal_text("summary", COMPACTION)) is None
    assert SEAL.open_text(reasoning_token, COMPACTION) is None


def test_unopened_items_are_dropped_for_endpoints_that_cannot_read_them() -> None:
    ours = compaction_item("cmp_1", SEAL.seal_text("ours", COMPACTION))
    theirs = {"type": "compaction", "encrypted_content": "someone-elses"}
    items = [user("a"), ours, theirs, {"type": "compaction_summary"}, user("b")]
    assert restore_compactions(items, SEAL) == 1
    assert drop_unopened(items) == 2
    assert items == [user("a"), user(f"{SUMMARY_PREFIX}ours"), user("b")]
    assert drop_unopened("not a list") == 0


def test_a_replayed_token_opens_once_remembered() -> None:
    recorded = ReasoningSeal(b"r" * 32).seal_text("Recorded summary.", COMPACTION)
    items = [{"type": "compaction", "encrypted_content": recorded}]
    assert restore_compactions(items, SEAL) == 0
    SEAL.remember(recorded, "Recorded summary.", COMPACTION)
    assert restore_compactions(items, SEAL) == 1
    assert items[0] == user(f"{SUMMARY_PREFIX}Recorded summary.")


def test_the_call_is_saved_with_flows_as_plain_data() -> None:
    import copy

    call = CompactionCall(form="trigger", stream=True, echo={"instructions": "x"})
    assert copy.deepcopy(call) == {"form": "trigger", "stream": True}


# --- properties -------------------------------------------------------------------------------

PROPS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
texts = st.text(min_size=1, max_size=300).filter(lambda s: s.strip())


@PROPS
@given(summary=texts)
def test_any_summary_survives_seal_and_restore(summary: str) -> None:
    item = compaction_item("cmp_1", SEAL.seal_text(summary, COMPACTION))
    items = [item]
    assert restore_compactions(items, SEAL) == 1
    assert items[0]["content"][0]["text"] == f"{SUMMARY_PREFIX}{summary}"


@st.composite
def conversations(draw: st.DrawFn) -> list[dict]:
    items: list[dict] = []
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["user", "assistant", "call", "output", "reasoning"]))
        text = draw(texts)
        if kind in ("user", "assistant"):
            part = "input_text" if kind == "user" else "output_text"
            content = draw(st.sampled_from([text, [{"type": part, "text": text}]]))
            items.append({"type": "message", "role": kind, "content": content})
        elif kind == "call":
            items.append({"type": "function_call", "call_id": "c", "name": "f", "arguments": text})
        elif kind == "output":
            items.append({"type": "function_call_output", "call_id": "c", "output": text})
        else:
            items.append({"type": "reasoning", "summary": [{"type": "summary_text", "text": text}]})
    return items


@PROPS
@given(items=conversations(), trigger=st.booleans(), stream=st.booleans())
def test_any_conversation_summarises_to_one_translatable_message(
    items: list[dict], trigger: bool, stream: bool
) -> None:
    body = {"model": "m", "input": [*items, *([{"type": "compaction_trigger"}] if trigger else [])]}
    body["stream"] = stream
    spoken = [item for item in items if item["type"] != "reasoning"]
    if not spoken:
        with pytest.raises(CompactionError):
            summary_request(body, "trigger")
        return
    request, call = summary_request(body, "trigger")
    [message] = request["input"]
    text = message["content"][0]["text"]
    for item in spoken:
        value = item.get("content") or item.get("arguments") or item.get("output")
        first = value if isinstance(value, str) else value[0]["text"]
        assert first[:100] in text
    assert call.stream is stream
    chat = responses_request_to_chat(orjson.loads(orjson.dumps(request)), OPTIONS).body
    assert [m["role"] for m in chat["messages"]] == ["system", "user"]


@PROPS
@given(summary=texts, item_id=st.from_regex(r"cmp_[A-Za-z0-9]{1,24}", fullmatch=True))
def test_any_triggered_answer_streams_to_the_sdk(summary: str, item_id: str) -> None:
    _request, call = summary_request(codex_body(), "trigger")
    item = compaction_item(item_id, SEAL.seal_text(summary, COMPACTION))
    _events, final = sdk_responses_stream(
        event_stream(triggered_events(triggered_response(summarised(), call, item)))
    )
    assert final is not None
    assert [(i.type, i.id) for i in final.output] == [("compaction", item_id)]
    assert SEAL.open_text(final.output[0].encrypted_content, COMPACTION) == summary
