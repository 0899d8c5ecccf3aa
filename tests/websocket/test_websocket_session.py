"""The Responses WebSocket protocol core: messages in, messages and calls out."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.responses import ResponsesServerEvent
from pydantic import TypeAdapter

from llmitm.websocket import handshake
from llmitm.websocket.frames import text_frame
from llmitm.websocket.session import HISTORY, Call, ResponsesSocket, Send, Start
from llmitm.wire.ids import CountingIds

SERVER_EVENT = TypeAdapter(ResponsesServerEvent)


def socket() -> ResponsesSocket:
    return ResponsesSocket(mint_id=CountingIds(), clock=lambda: 1_800_000_000.0)


def create(**fields: Any) -> bytes:
    return orjson.dumps({"type": "response.create", "model": "m", "input": "hi", **fields})


def started(actions: list[Any]) -> list[Call]:
    return [action.call for action in actions if isinstance(action, Start)]


def sent(actions: list[Any]) -> list[dict[str, Any]]:
    return [orjson.loads(action.data) for action in actions if isinstance(action, Send)]


def answer(
    session: ResponsesSocket, call: Call, response_id: str, output: list[Any] | None = None
) -> list[Any]:
    """Feed a whole short answer (named events, as llmitm's own streams carry them)."""
    output = output if output is not None else [_message("hello")]
    response = {"id": response_id, "object": "response", "status": "in_progress", "output": []}
    actions: list[Any] = []
    actions += session.call_event(
        call,
        "response.created",
        orjson.dumps({"type": "response.created", "sequence_number": 0, "response": response}),
    )
    actions += session.call_event(
        call,
        "response.output_text.delta",
        b'{"type":"response.output_text.delta","sequence_number":1,"delta":"hello"}',
    )
    done = dict(response, status="completed", output=output)
    actions += session.call_event(
        call,
        "response.completed",
        orjson.dumps({"type": "response.completed", "sequence_number": 2, "response": done}),
    )
    return actions + session.call_ended(call)


def _message(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def test_a_create_becomes_one_streamed_call_without_the_envelope() -> None:
    session = socket()
    (call,) = started(session.receive_text(create(generate=True, stream_id=None)))
    body = orjson.loads(call.body)
    assert body == {"model": "m", "input": "hi", "stream": True}
    actions = answer(session, call, "resp_1")
    events = sent(actions)
    assert [event["type"] for event in events] == [
        "response.created",
        "response.output_text.delta",
        "response.completed",
    ]
    # Events without a lane go out as they came: no parse, no re-encoding.
    assert (
        actions[1].data
        == b'{"type":"response.output_text.delta","sequence_number":1,"delta":"hello"}'
    )
    assert session.running == []


def test_a_lane_runs_its_calls_in_order_and_lanes_run_side_by_side() -> None:
    session = socket()
    (first,) = started(session.receive_text(create(stream_id="a", input="1")))
    assert started(session.receive_text(create(stream_id="a", input="2"))) == []
    (other,) = started(session.receive_text(create(stream_id="b", input="3")))
    assert set(session.running) == {first, other}
    actions = answer(session, first, "resp_a1")
    assert all(event["stream_id"] == "a" for event in sent(actions))
    (second,) = started(actions)
    assert orjson.loads(second.body)["input"] == "2"
    assert all(event["stream_id"] == "b" for event in sent(answer(session, other, "resp_b")))


def test_a_warm_up_is_answered_here_and_continued_from() -> None:
    session = socket()
    warm = create(generate=False, store=False, input=[{"role": "user", "content": "task"}])
    actions = session.receive_text(warm)
    assert started(actions) == []
    events = sent(actions)
    assert [event["type"] for event in events] == [
        "response.created",
        "response.in_progress",
        "response.completed",
    ]
    for event in events:
        SERVER_EVENT.validate_python(event)
    completed = events[-1]["response"]
    assert completed["status"] == "completed" and completed["output"] == []
    warm_id = completed["id"]

    more = [{"role": "user", "content": "more"}]
    (call,) = started(
        session.receive_text(create(store=False, previous_response_id=warm_id, input=more))
    )
    body = orjson.loads(call.body)
    assert "previous_response_id" not in body  # no store knows a warm-up
    assert body["input"] == [{"role": "user", "content": "task"}, *more]
    echoed = sent(answer(session, call, "resp_2"))
    assert echoed[0]["response"]["previous_response_id"] == warm_id
    assert echoed[-1]["response"]["previous_response_id"] == warm_id
    # What holds no Response object goes as it came, unparsed (spaced as it came too).
    (call,) = started(
        session.receive_text(create(store=False, previous_response_id="resp_2", input=more))
    )
    delta = b'{"type": "response.output_text.delta", "sequence_number": 1, "delta": "hi"}'
    [sent_delta] = session.call_event(call, "response.output_text.delta", delta)
    assert isinstance(sent_delta, Send) and sent_delta.data == delta


def test_store_false_turns_expand_into_the_whole_conversation() -> None:
    session = socket()
    (first,) = started(session.receive_text(create(store=False, input="one")))
    output = [_message("answer one")]
    answer(session, first, "resp_1", output)
    tool_result = [{"type": "function_call_output", "call_id": "c1", "output": "ok"}]
    (second,) = started(
        session.receive_text(create(store=False, previous_response_id="resp_1", input=tool_result))
    )
    assert orjson.loads(second.body)["input"] == [
        {"type": "message", "role": "user", "content": "one"},
        *output,
        *tool_result,
    ]
    answer(session, second, "resp_2", [_message("answer two")])
    (third,) = started(
        session.receive_text(create(store=False, previous_response_id="resp_2", input="three"))
    )
    whole = orjson.loads(third.body)["input"]
    assert len(whole) == 5 and whole[-1]["content"] == "three"


def test_stored_and_unknown_previous_ids_go_on_to_the_store() -> None:
    session = socket()
    (first,) = started(session.receive_text(create(input="one")))  # store defaults to true
    answer(session, first, "resp_1")
    for previous in ("resp_1", "resp_elsewhere"):
        (call,) = started(session.receive_text(create(previous_response_id=previous)))
        body = orjson.loads(call.body)
        assert body["previous_response_id"] == previous and body["input"] == "hi"
        answer(session, call, f"resp_after_{previous}")


def test_the_connection_remembers_a_bounded_number_of_responses() -> None:
    session = socket()
    for number in range(HISTORY + 1):
        (call,) = started(session.receive_text(create(store=False)))
        answer(session, call, f"resp_{number}")
    (oldest,) = started(session.receive_text(create(store=False, previous_response_id="resp_0")))
    assert orjson.loads(oldest.body)["previous_response_id"] == "resp_0"
    answer(session, oldest, "resp_x")
    (newest,) = started(
        session.receive_text(create(store=False, previous_response_id=f"resp_{HISTORY}"))
    )
    assert "previous_response_id" not in orjson.loads(newest.body)


def test_an_http_error_becomes_an_error_message_with_its_status_and_the_lane_goes_on() -> None:
    session = socket()
    (call,) = started(session.receive_text(create(stream_id="x")))
    assert started(session.receive_text(create(stream_id="x", input="next"))) == []
    body = b'{"error":{"message":"Slow down","type":"rate_limit_error","code":null}}'
    failed = session.call_failed(call, 429, body, [("Retry-After", "2"), ("server", "x")])
    (error,) = sent(failed)
    assert error == {
        "type": "error",
        "status": 429,
        "error": {
            "type": "rate_limit_error",
            "code": "rate_limit_exceeded",
            "message": "Slow down",
            "param": None,
        },
        "headers": {"retry-after": "2"},
        "stream_id": "x",
    }
    SERVER_EVENT.validate_python(error)
    after = session.call_ended(call)
    assert sent(after) == []  # no second error for the same call
    (following,) = started(after)
    assert orjson.loads(following.body)["input"] == "next"


def test_a_stream_that_ends_without_a_terminal_event_gets_one() -> None:
    session = socket()
    (call,) = started(session.receive_text(create()))
    session.call_event(call, "response.created", b'{"type":"response.created","response":{}}')
    (error,) = sent(session.call_ended(call, "The answer broke off."))
    assert error["type"] == "error" and error["status"] == 502
    assert error["error"]["code"] == "stream_cut"
    assert error["error"]["message"] == "The answer broke off."


def test_a_mid_stream_error_event_ends_the_call() -> None:
    session = socket()
    (call,) = started(session.receive_text(create()))
    event = b'{"type":"error","sequence_number":3,"code":"server_error","message":"boom"}'
    (error,) = sent(session.call_event(call, "error", event))
    assert error["message"] == "boom"
    assert sent(session.call_ended(call)) == []
    assert session.call_event(call, None, b'{"type":"response.output_text.delta"}') == []


def test_data_only_events_are_parsed_for_their_type() -> None:
    session = socket()
    (call,) = started(session.receive_text(create(store=False)))
    response = {"id": "resp_d", "status": "completed", "output": [_message("x")]}
    done = orjson.dumps({"type": "response.completed", "response": response})
    assert session.call_event(call, None, b"[DONE]") == []
    assert sent(session.call_event(call, None, done))[0]["type"] == "response.completed"
    session.call_ended(call)
    (next_call,) = started(session.receive_text(create(store=False, previous_response_id="resp_d")))
    assert "previous_response_id" not in orjson.loads(next_call.body)


def test_bad_messages_get_an_error_and_the_socket_goes_on() -> None:
    session = socket()
    for message, code in (
        (b"{not json", "invalid_json"),
        (b"[1, 2]", "invalid_json"),
        (b'{"type": "session.update"}', "unknown_message_type"),
        (create(background=True), "unsupported_parameter"),
        (create(input=5), "invalid_type"),
        (create(stream_id=7), "invalid_type"),
    ):
        (error,) = sent(session.receive_text(message))
        assert error["type"] == "error" and error["status"] == 400, message
        assert error["error"]["code"] == code, message
        SERVER_EVENT.validate_python(error)
    (error,) = sent(session.receive_binary())
    assert error["status"] == 400
    assert session.running == []
    assert len(started(session.receive_text(create()))) == 1


def test_processed_is_acknowledged_silently_and_steering_is_refused() -> None:
    session = socket()
    assert session.receive_text(b'{"type":"response.processed","response_id":"resp_1"}') == []
    steer = {"type": "response.steer", "previous_response_id": "resp_1", "input": "faster"}
    (failed,) = sent(session.receive_text(orjson.dumps(steer)))
    assert failed["type"] == "response.steer.failed"
    assert failed["error"]["code"] == "steering_not_supported"
    assert failed["steer"] == {"input": "faster", "previous_response_id": "resp_1"}
    SERVER_EVENT.validate_python(failed)


@settings(max_examples=200, deadline=None)
@given(
    lanes=st.lists(st.sampled_from([None, "a", "b"]), min_size=1, max_size=12),
    order=st.randoms(use_true_random=False),
)
def test_every_create_gets_exactly_one_answer_in_lane_order(lanes: list[Any], order: Any) -> None:
    """Any creates on any lanes, answered in any order the lanes allow: one running call per
    lane, calls of a lane in the order sent, each ending in exactly one terminal message."""
    session = socket()
    running: list[Call] = []
    terminals: dict[int, int] = {}
    finished: dict[str | None, list[int]] = {}
    for lane in lanes:
        running += started(session.receive_text(create(stream_id=lane, store=False)))
    while running:
        assert len({call.lane for call in session.running}) == len(session.running)
        call = running.pop(order.randrange(len(running)))
        actions = answer(session, call, f"resp_{call.number}")
        for event in sent(actions):
            if event["type"] == "response.completed":
                terminals[call.number] = terminals.get(call.number, 0) + 1
        finished.setdefault(call.lane, []).append(call.number)
        running += started(actions)
    assert terminals == {number: 1 for number in range(1, len(lanes) + 1)}
    for numbers in finished.values():
        assert numbers == sorted(numbers)


def test_a_stream_id_is_added_without_parsing() -> None:
    session = socket()
    (call,) = started(session.receive_text(create(stream_id='lane "1"')))
    data = b'{"type":"response.output_text.delta","delta":"x"}'
    (message,) = session.call_event(call, "response.output_text.delta", data)
    assert orjson.loads(message.data) == {**orjson.loads(data), "stream_id": 'lane "1"'}


def test_the_handshake_answer_and_refusal() -> None:
    # RFC 6455's own example.
    assert handshake.accept_key("dGhlIHNhbXBsZSBub25jZQ==") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
    head = handshake.switching_protocols("dGhlIHNhbXBsZSBub25jZQ==")
    assert head.startswith(b"HTTP/1.1 101 ") and head.endswith(b"\r\n\r\n")
    status, headers, body = handshake.refusal("testing")
    assert status == 426 and headers["content-type"] == "application/json"
    assert orjson.loads(body)["error"]["code"] == "websocket_not_served"
    assert handshake.is_upgrade([("Upgrade", "WebSocket")])
    assert not handshake.is_upgrade([("Upgrade", "h2c")])
    kept = handshake.call_headers(
        [
            ("Authorization", "Bearer sk-x"),
            ("OpenAI-Beta", "responses_websockets=2026-02-06"),
            ("Sec-WebSocket-Key", "k"),
            ("Upgrade", "websocket"),
            ("x-codex-turn-metadata", "{}"),
        ]
    )
    assert kept == [
        ("Authorization", "Bearer sk-x"),
        ("x-codex-turn-metadata", "{}"),
        ("content-type", "application/json"),
        ("accept", "text/event-stream"),
    ]


@settings(max_examples=100, deadline=None)
@given(
    texts=st.lists(
        st.text(max_size=70_000) | st.sampled_from(["", "x" * 125, "y" * 126, "z" * 65_536]),
        max_size=6,
    )
)
def test_text_frames_read_back_through_wsproto(texts: list[str]) -> None:
    """wsproto, as the client, is the oracle for the frames llmitm writes itself."""
    from wsproto.connection import Connection, ConnectionType
    from wsproto.events import TextMessage

    client = Connection(ConnectionType.CLIENT)
    client.receive_data(b"".join(text_frame(text.encode()) for text in texts))
    got: list[str] = []
    parts: list[str] = []
    for event in client.events():
        assert isinstance(event, TextMessage)
        parts.append(event.data)
        if event.message_finished:
            got.append("".join(parts))
            parts = []
    assert got == texts


def test_the_response_failed_after_a_stream_error_still_reaches_the_client() -> None:
    session = socket()
    (call,) = started(session.receive_text(create()))
    error = b'{"type":"error","sequence_number":3,"code":"server_error","message":"stalled"}'
    failed = orjson.dumps(
        {"type": "response.failed", "sequence_number": 4, "response": {"id": "resp_f"}}
    )
    assert sent(session.call_event(call, "error", error))[0]["message"] == "stalled"
    assert session.call_event(call, None, b'{"type":"response.output_text.delta"}') == []
    (last,) = sent(session.call_event(call, "response.failed", failed))
    assert last["type"] == "response.failed"
    assert session.call_event(call, "response.failed", failed) == []  # once
    assert sent(session.call_ended(call)) == []


def test_a_resent_history_is_parsed_from_the_last_message_and_shared() -> None:
    """A client without ``previous_response_id`` resends its whole history: each message is
    parsed where it is new, the body is the whole message's, and the turns the socket
    remembers share the items they resend rather than hold a copy each."""
    session = socket()
    history: list[Any] = [{"role": "user", "content": "a long task " * 1000}]
    calls = []
    for turn in range(3):
        message = create(input=history, client_metadata={"turn": turn})
        (call,) = started(session.receive_text(message.decode()))
        expected = {k: v for k, v in orjson.loads(message).items() if k != "type"}
        assert orjson.loads(call.body) == dict(expected, stream=True)
        answer(session, call, f"resp_{turn}")
        calls.append(call)
        history = [*history, _message(f"answer {turn}"), {"role": "user", "content": f"{turn}"}]
    assert calls[2].input[0] is calls[1].input[0] is calls[0].input[0]
    assert calls[2].input[1] is calls[1].input[1]
