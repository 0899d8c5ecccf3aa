"""Record/replay's sans-IO core: redaction, match keys, pools, the folder format, serving."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmitm.replay.folder import FolderError, interaction_from_json, interaction_to_json
from llmitm.replay.keys import KeyOptions, match_key, route_of
from llmitm.replay.model import Interaction, Message
from llmitm.replay.pool import Hit, Miss, ReplayPool, canonical_diff
from llmitm.replay.serve import from_upstream, miss_error, verbatim
from llmitm.store.folder import read_folder, write_folder
from llmitm.wire.redact import (
    find_secrets,
    may_hold_secret,
    redact_body,
    redact_chunks,
    redact_headers,
    redact_json,
    redact_url,
)

KEY = "sk-proj-" + "A1b2C3d4" * 5
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"


def chat_body(**extra: object) -> bytes:
    body = {"model": "gpt-4.1", "messages": [{"role": "user", "content": "Hi"}], **extra}
    return orjson.dumps(body)


def key_of(content: bytes, **options: object) -> str:
    return match_key("POST", "/v1/chat/completions", [], content, KeyOptions(**options)).key


# --- redaction -------------------------------------------------------------------------------


def test_headers_become_placeholders_not_deletions() -> None:
    headers = [
        ("Authorization", f"Bearer {KEY}"),
        ("api-key", "0123456789abcdef0123456789abcdef"),
        ("Cookie", "session=abc"),
        ("content-type", "application/json"),
        ("set-cookie", "x=y"),
        ("x-note", f"token {KEY}"),
    ]
    assert redact_headers(headers) == [
        ("Authorization", "Bearer <redacted>"),
        ("api-key", "<redacted>"),
        ("Cookie", "<redacted>"),
        ("content-type", "application/json"),
        ("x-note", "token <redacted>"),
    ]


def test_query_strings_and_userinfo() -> None:
    url = (
        "https://user:pw@x.openai.azure.com/openai/responses?api-version=2025-04-01&api-key=s3cr3t"
    )
    redacted = redact_url(url)
    assert "s3cr3t" not in redacted and "pw@" not in redacted
    assert "api-version=2025-04-01" in redacted and "api-key=<redacted>" in redacted


def test_json_bodies_by_field_name_and_by_shape() -> None:
    body = orjson.dumps(
        {
            "model": "m",
            "max_tokens": 5,
            "api_key": "plain",
            "nested": {"github_token": "t0k", "text": f"use {KEY} and {JWT}"},
        }
    )
    out = orjson.loads(redact_body(body) or b"")
    assert out["max_tokens"] == 5 and out["api_key"] == "<redacted>"
    assert out["nested"] == {"github_token": "<redacted>", "text": "use <redacted> and <redacted>"}
    clean = chat_body()
    assert redact_body(clean) is clean  # untouched bytes when nothing matched


def test_a_body_without_a_secret_shape_still_loses_its_secret_named_fields() -> None:
    # No credential literal in the bytes: only the field names are looked at, deep down too.
    body = orjson.dumps(
        {"input": [{"type": "message", "content": [{"text": "hi", "refresh_token": "r"}]}]}
    )
    assert orjson.loads(redact_body(body) or b"")["input"][0]["content"][0] == {
        "text": "hi",
        "refresh_token": "<redacted>",
    }
    # A key spelt with a \u escape is one all the same once parsed.
    escaped = b'{"note": "use s\\u006b-' + KEY[3:].encode() + b'"}'
    assert orjson.loads(redact_body(escaped) or b"") == {"note": "use <redacted>"}


_JSON_NAMES = st.sampled_from(["text", "api_key", "max_tokens", "x_token", "a", "secret"])
_JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.sampled_from(["", "x", f"k {KEY}", "Bearer"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_JSON_NAMES, inner, max_size=4),
    max_leaves=20,
)


@given(_JSON_VALUES)
def test_redacting_a_body_is_redacting_its_json(value: object) -> None:
    # The fast paths (bytes without a credential literal) agree with the full walk.
    content = orjson.dumps(value)
    assert orjson.loads(redact_body(content) or b"null") == redact_json(value)


@given(_JSON_VALUES)
def test_a_redacted_body_keys_the_same_without_a_second_redaction(value: object) -> None:
    content = redact_body(orjson.dumps({"model": "m", "input": value})) or b""
    again = match_key("POST", "/v1/responses", [], content)
    assert match_key("POST", "/v1/responses", [], content, redacted=True) == again


def test_stream_redaction_keeps_split_points_even_across_a_secret() -> None:
    text = f'data: {{"t":"key {KEY} end"}}\n\n'.encode()
    cut = text.index(b"sk-") + 6  # the secret straddles two pieces
    chunks = [(0, text[:10]), (5, text[10:cut]), (9, text[cut:])]
    out = redact_chunks(chunks)
    assert [t for t, _ in out] == [0, 5, 9]
    assert b"".join(d for _, d in out) == text.replace(KEY.encode(), b"<redacted>")
    assert out[0][1] == text[:10]
    assert not find_secrets(b"".join(d for _, d in out).decode())


# The pre-check looks for each literal by a rare byte first and scans for it once that byte
# turns out common: either way it must say exactly whether a literal is there.
ANCHOR_HEAVY = st.lists(
    st.sampled_from([b"B", b"-", b"J", b"s", b"k", b"e", b"y", b"x", b"Bearer", b"sk-", b"eyJ"]),
    max_size=120,
).map(b"".join)


@given(ANCHOR_HEAVY)
def test_the_secret_pre_check_finds_each_literal_wherever_it_is(data: bytes) -> None:
    expected = any(literal in data for literal in (b"Bearer", b"sk-", b"eyJ"))
    assert may_hold_secret(data) is expected


def test_the_secret_pre_check_finds_a_key_after_many_common_anchors() -> None:
    frames = b"".join(b'data: {"id":"chatcmpl-%d","x":"B J"}\n\n' % i for i in range(100))
    assert not may_hold_secret(frames)
    assert may_hold_secret(frames + KEY.encode()) and may_hold_secret(frames + JWT.encode())
    assert may_hold_secret(frames + b"Bearer abcdefgh12345")
    for decoys in range(40):  # the literal at each position of the anchor's hits
        for literal, anchor in ((b"Bearer", b"B"), (b"sk-", b"-"), (b"eyJ", b"J")):
            assert may_hold_secret(anchor * decoys + literal)
            assert may_hold_secret(b"x" + (anchor + b"x") * decoys + literal + b"x")


# --- match keys ------------------------------------------------------------------------------


def test_key_ignores_order_user_metadata_uuids_and_timestamps() -> None:
    a = orjson.dumps(
        {
            "model": "gpt-4.1",
            "user": "alice",
            "metadata": {"run": "1"},
            "messages": [
                {
                    "role": "user",
                    "content": "id 0b7f9a44-1d2e-4c3b-9a8f-123456789abc at 2025-01-02T03:04:05Z",
                }
            ],
        }
    )
    b = orjson.dumps(
        {
            "messages": [
                {
                    "content": "id 9c1e02d4-7a61-43f0-8b3f-aaaaaaaaaaaa at 2026-11-30T09:00:00Z",
                    "role": "user",
                }
            ],
            "user": "bob",
            "model": "gpt-4.1",
        }
    )
    assert key_of(a) == key_of(b)
    assert key_of(a, profile="strict") != key_of(b, profile="strict")


def test_numbered_placeholders_keep_which_value_repeats_where() -> None:
    same = chat_body(tools_ref=["call_abcdef12", "call_abcdef12"])
    different = chat_body(tools_ref=["call_abcdef12", "call_zyxwvu98"])
    assert key_of(same) != key_of(different)
    assert key_of(same) == key_of(chat_body(tools_ref=["call_99999999", "call_99999999"]))


def test_a_changed_prompt_or_tool_schema_changes_the_key() -> None:
    assert key_of(chat_body()) != key_of(
        orjson.dumps({"model": "gpt-4.1", "messages": [{"role": "user", "content": "Hello"}]})
    )
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    changed = {"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}
    assert key_of(chat_body(tools=[tool])) != key_of(chat_body(tools=[changed]))


def test_profiles_and_ignore_paths() -> None:
    assert key_of(chat_body(temperature=0.1)) != key_of(chat_body(temperature=0.9))
    assert key_of(chat_body(temperature=0.1), profile="loose") == key_of(
        chat_body(temperature=0.9), profile="loose"
    )
    other = orjson.dumps({"model": "gpt-4.1", "messages": [{"role": "user", "content": "Yo"}]})
    assert key_of(chat_body(), ignore=("messages.*.content",)) == key_of(
        other, ignore=("messages.*.content",)
    )
    assert key_of(chat_body(stream=True)) != key_of(chat_body())


def test_codex_item_metadata_is_ignored_except_under_strict() -> None:
    """Codex (default configuration) stamps every input item with its local creation time."""

    def codex(stamp: float) -> bytes:
        item = {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "hi"}],
            "internal_chat_message_metadata_passthrough": {"create_time": stamp},
        }
        return orjson.dumps({"model": "gpt-6.2-sol", "input": [item]})

    def key(stamp: float, profile: str) -> str:
        options = KeyOptions(profile=profile)  # type: ignore[arg-type]
        return match_key("POST", "/v1/responses", [], codex(stamp), options).key

    assert key(1.5, "default") == key(2.5, "default")
    assert key(1.5, "loose") == key(2.5, "loose")
    assert key(1.5, "strict") != key(2.5, "strict")


def test_a_redacted_secret_still_matches_and_never_enters_the_key() -> None:
    a = match_key("POST", "/v1/chat/completions", [], chat_body(note=f"key {KEY}"))
    b = match_key("POST", "/v1/chat/completions", [], chat_body(note="key sk-" + "z" * 30))
    assert a.key == b.key and KEY not in a.canonical


def test_routes_are_the_same_for_openai_and_azure_paths() -> None:
    assert route_of("POST", "/v1/chat/completions") == ("chat.completions", None)
    assert route_of("POST", "/openai/deployments/gpt4/chat/completions?api-version=1") == (
        "chat.completions",
        "gpt4",
    )
    assert route_of("POST", "/openai/v1/responses")[0] == "responses"
    assert route_of("GET", "/gateway/v1/models?x=1") == ("/v1/models", None)
    azure = match_key(
        "POST", "/openai/deployments/gpt4/chat/completions?api-version=2024-10-21", [], b"{}"
    )
    assert azure.model == "gpt4"
    assert (
        azure.key
        == match_key(
            "POST", "/openai/deployments/gpt4/chat/completions?api-version=2025-01-01", [], b"{}"
        ).key
    )


# --- pools -----------------------------------------------------------------------------------


def interaction(n: int, key: str, scope: str = "global", canonical: str = "{}") -> Interaction:
    return Interaction(
        id=f"id{n}",
        scope=scope,
        key=key,
        key_version=1,
        method="POST",
        route="chat.completions",
        model="m",
        stream=False,
        canonical_utf8=canonical.encode(),
        started_us=n,
        legs={"client_resp": Message(status=200, content=f"answer {n}".encode())},
    )


def test_fifo_per_key_then_exhausted_and_scopes_apart() -> None:
    k = match_key("POST", "/v1/chat/completions", [], chat_body())
    pool = ReplayPool.build(
        [interaction(2, k.key), interaction(1, k.key), interaction(3, k.key, scope="t2")]
    )
    first, second = pool.take("global", k), pool.take("global", k)
    assert isinstance(first, Hit) and first.interaction.id == "id1" and first.served == 1
    assert isinstance(second, Hit) and second.interaction.id == "id2"
    third = pool.take("global", k)
    assert isinstance(third, Miss) and third.reason == "exhausted"
    assert "served 2 of 2" in third.describe()
    assert isinstance(pool.take("t2", k), Hit)
    assert isinstance(pool.take("t3", k), Miss) and pool.take("t3", k).reason == "no-scope"
    assert pool.unused() == []


def test_a_miss_names_the_closest_recording_and_a_diff() -> None:
    recorded = match_key("POST", "/v1/chat/completions", [], chat_body())
    asked = match_key(
        "POST",
        "/v1/chat/completions",
        [],
        orjson.dumps({"model": "gpt-4.1", "messages": [{"role": "user", "content": "Bye"}]}),
    )
    pool = ReplayPool.build(
        [
            interaction(1, recorded.key, canonical=recorded.canonical),
            interaction(2, "other", canonical='{"route": "responses"}'),
        ]
    )
    miss = pool.take("global", asked)
    assert isinstance(miss, Miss) and miss.closest is not None and miss.closest.id == "id1"
    diff = canonical_diff(miss.closest.canonical, asked.canonical)
    assert any(line.startswith("-") and '"Hi"' in line for line in diff)
    assert any(line.startswith("+") and '"Bye"' in line for line in diff)
    status, headers, body = miss_error(miss, "recordings/x.json")
    assert status == 400 and ("x-should-retry", "false") in headers
    message = orjson.loads(body)["error"]["message"]
    for part in (asked.key, "global", "id1", "recordings/x.json", "llmitm rec diff --last-miss"):
        assert part in message


# --- folder format and serving ---------------------------------------------------------------


def full_interaction() -> Interaction:
    chunks = [
        (1200, b'data: {"a":1}\n\n'),
        (2500, b"data: \xc3"),
        (2600, b"\xa9\n\ndata: [DONE]\n\n"),
    ]
    return Interaction(
        id="abc",
        scope="tests/test_x.py::test_y",
        key="0123456789abcdef",
        key_version=1,
        method="POST",
        route="chat.completions",
        model="m",
        stream=True,
        canonical_utf8=b'{\n  "a": 1\n}',
        started_us=5,
        status=200,
        ttfb_us=1000,
        legs={
            "client_req": Message(
                headers=[("content-type", "application/json")],
                content=chat_body(stream=True),
                method="POST",
                url="http://x/v1/chat/completions",
            ),
            "upstream_resp": Message(
                headers=[("content-type", "text/event-stream"), ("date", "today")],
                chunks=chunks,
                status=200,
            ),
            "client_resp": Message(
                headers=[("content-type", "text/event-stream")], chunks=chunks, status=200
            ),
        },
    )


def test_interaction_json_round_trip_keeps_bytes_and_split_points(tmp_path) -> None:
    original = full_interaction()
    value = interaction_to_json(original)
    assert value["client_req"]["body"]["json"]["model"] == "gpt-4.1"  # embedded, not a string
    back = interaction_from_json(orjson.loads(orjson.dumps(value)))
    assert back.legs["client_resp"].chunks == original.legs["client_resp"].chunks
    assert back.legs["client_req"].body() == original.legs["client_req"].body()
    assert ("date", "today") not in back.legs["upstream_resp"].headers  # volatile: not in files
    files = write_folder(tmp_path, [original])
    assert files[0].name == "0000-chat.completions-01234567.json"
    again = write_folder(tmp_path, [original])
    assert [f.read_bytes() for f in files] == [f.read_bytes() for f in again]  # stable
    assert (
        read_folder(tmp_path)[0].legs["upstream_resp"].body()
        == original.legs["upstream_resp"].body()
    )
    (tmp_path / "manifest.json").write_text('{"format_version": 99}')
    with pytest.raises(FolderError, match="format_version"):
        read_folder(tmp_path)


def test_serving_verbatim_and_from_upstream_without_a_plan() -> None:
    recorded = full_interaction()
    assert verbatim(recorded).body == recorded.legs["client_resp"].body()
    answer = from_upstream(recorded, None, None)
    assert answer.body == recorded.legs["upstream_resp"].body()
    assert all(name.lower() != "content-length" for name, _ in answer.headers)


_VOLATILE_TEXT = st.lists(
    st.sampled_from(
        [
            "2024-01-02",
            "2024-01-02T03:04:05Z",
            " 12:30",
            "123e4567-e89b-12d3-a456-426614174000",
            "call_",
            "chatcmpl-",
            "resp_",
            "abcdef12",
            "x",
            "-",
            "_",
            " ",
            "9",
            "\n",
            "é",
        ]
    ),
    max_size=30,
).map("".join)


@given(_VOLATILE_TEXT, st.sampled_from(["default", "strict"]))
def test_volatile_values_are_found_where_the_regex_finds_them(text: str, profile: str) -> None:
    # The fast scan (only near a "-" or "_") finds every match the plain search does, in order.
    from llmitm.replay import keys

    pattern = keys._VOLATILE_STRICT if profile == "strict" else keys._VOLATILE
    expected = [(m.span(), m.lastgroup) for m in pattern.finditer(text)]
    found, at = [], 0
    while (match := keys._next_match(pattern, text, at)) is not None:
        found.append((match.span(), match.lastgroup))
        at = match.end()
    assert found == expected
