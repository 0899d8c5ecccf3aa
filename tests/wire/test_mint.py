"""The per-flow mint: recorded values come back in order per kind, then fresh ones; and a
replayed sealed token opens in a process whose key did not seal it."""

from __future__ import annotations

from llmitm.responses_api.seal import ReasoningSeal
from llmitm.translate.context import TranslateOptions, TranslationContext
from llmitm.translate.pipeline import StreamPipeline
from llmitm.wire.ids import Mint

CHAT_STREAM = (
    b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"}}]}\n\n'
    b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    b"data: [DONE]\n\n"
)


def test_a_fresh_mint_notes_what_it_hands_out() -> None:
    mint = Mint()
    first, second = mint.id("resp"), mint.id("msg")
    now = mint.now()
    assert first.startswith("resp_") and second.startswith("msg_") and now > 1.7e9
    assert mint.tape == {"resp": [first], "msg": [second], "clock": [now]}
    assert not mint.replayed(first)


def test_a_seeded_mint_hands_out_the_recording_per_kind_then_fresh_values() -> None:
    mint = Mint({"msg": ["msg_a", "msg_b"], "clock": [100.0]})
    assert mint.id("resp").startswith("resp_")  # not recorded: fresh
    assert [mint.id("msg"), mint.id("msg")] == ["msg_a", "msg_b"]
    assert mint.id("msg") not in {"msg_a", "msg_b"}
    assert mint.now() == 100.0 and mint.now() != 100.0
    assert mint.replayed("msg_a") and not mint.replayed("resp_x")


def _translate(mint: Mint) -> bytes:
    options = TranslateOptions(ids=mint.id, clock=mint.now)
    pipeline = StreamPipeline("chat-to-responses", TranslationContext(options, model="m"))
    return pipeline.start() + pipeline.feed(CHAT_STREAM) + pipeline.close()


def test_a_translation_replayed_from_its_tape_is_byte_identical() -> None:
    live = Mint()
    recorded = _translate(live)
    assert _translate(Mint(live.tape)) == recorded
    assert _translate(Mint()) != recorded  # fresh ids and times otherwise


def test_a_replayed_sealed_token_opens_under_another_key() -> None:
    recording, replaying = ReasoningSeal(), ReasoningSeal()
    token = recording.seal({"type": "reasoning", "summary": [], "content": []})
    assert replaying.open(token) is None
    replaying.remember(token, "thought")
    assert replaying.open(token) == "thought"
