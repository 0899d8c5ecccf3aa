"""Building the recorded record from plain values (replay.capture), sans-IO: header lists,
bodies, timestamps and stream pieces in, a redacted Interaction out; and the replay report
and the text of a strict miss."""

from __future__ import annotations

import itertools
from array import array
from dataclasses import dataclass, field

import orjson
from hypothesis import given
from hypothesis import strategies as st

from llmitm.replay.capture import (
    ClientResponse,
    FlowEnd,
    ReplayReport,
    build_interaction,
    capture_label,
    miss_text,
    relayed_request,
    stream_legs,
)
from llmitm.replay.keys import MatchKey, match_key
from llmitm.replay.model import Interaction, Message, Pieces
from llmitm.replay.pool import Miss

SECRET = "sk-proj-abcdefghijklmnopqrstuvwxyz0123"
BODY = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "Hi"}]})
KEY = match_key("POST", "/v1/chat/completions", [], BODY)
T0 = 1_700_000_000.0


@dataclass(slots=True)
class Seen:
    """A capture as the flow recorder fills it (the ``Captured`` protocol)."""

    scope: str = "global"
    key: MatchKey = KEY
    client_req: Message = field(default_factory=lambda: Message(content=BODY, method="POST"))
    started_us: int = 1_700_000_000_000_000
    credential: str | None = None
    request_clean: bool = True
    forwarded: bool = True
    upstream_req: Message | None = None
    upstream_status: int = 0
    upstream_headers: list[tuple[str, str]] = field(default_factory=list)
    upstream_body: bytes | None = None


def timed(chunks: list[bytes], step: float = 0.015625) -> Pieces:
    times = array("d", [T0 + step * (n + 1) for n in range(len(chunks))])
    return Pieces.timed(times, T0, array("q", map(len, chunks)), b"".join(chunks))


def test_a_plain_forwarded_flow_keeps_four_redacted_legs_and_its_times() -> None:
    sent = Message(  # as the tap notes it: head redacted, the body left for the end
        headers=[("authorization", "Bearer <redacted>")],
        content=orjson.dumps({"model": "m", "api_key": SECRET}),
        method="POST",
        url="https://up.example/v1/chat/completions",
    )
    seen = Seen(
        upstream_req=sent,
        upstream_status=200,
        upstream_headers=[("content-type", "application/json"), ("set-cookie", "a=b")],
        upstream_body=f'{{"echo":"{SECRET}"}}'.encode(),
        credential="fp",
    )
    end = FlowEnd(
        t0=T0,
        response=ClientResponse(200, [("x-a", "1")], b'{"ok":true}', T0 + 0.25, T0 + 1.5),
        endpoint="local",
        plan="chat→responses",
    )
    interaction = build_interaction(seen, end, session="s1", mode="record")
    assert set(interaction.legs) == {"client_req", "upstream_req", "upstream_resp", "client_resp"}
    assert (interaction.status, interaction.ttfb_us, interaction.duration_us) == (
        200,
        250_000,
        1_500_000,
    )
    assert (interaction.endpoint, interaction.plan) == ("local", "chat→responses")
    assert (interaction.session, interaction.mode, interaction.credential) == ("s1", "record", "fp")
    assert interaction.id.startswith(f"{seen.started_us:013x}")
    assert (interaction.key, interaction.route, interaction.model) == (KEY.key, KEY.route, "m")
    for leg in interaction.legs.values():
        assert SECRET not in repr(leg.headers) and SECRET.encode() not in leg.body(), leg
    assert interaction.legs["upstream_resp"].headers == [("content-type", "application/json")]
    assert interaction.legs["client_resp"].content == b'{"ok":true}'
    assert interaction.truncated is None and interaction.error is None


def test_a_flow_answered_before_going_upstream_has_no_upstream_legs() -> None:
    seen = Seen(forwarded=False, upstream_req=Message(method="POST"), upstream_status=200)
    end = FlowEnd(t0=T0, response=ClientResponse(400, [], b"{}", None, T0 + 0.5))
    interaction = build_interaction(seen, end, session="s", mode="record")
    assert set(interaction.legs) == {"client_req", "client_resp"}
    assert interaction.ttfb_us is None and interaction.duration_us == 500_000
    assert interaction.endpoint == "" and interaction.plan == ""


def test_a_relayed_flow_records_what_the_answering_endpoint_was_sent() -> None:
    relayed = relayed_request(
        "POST",
        f"https://b.example/v1/responses?api-key={SECRET}",
        [("api-key", SECRET)],
        orjson.dumps({"input": "x", "client_secret": SECRET}),
    )
    seen = Seen(upstream_req=Message(method="POST", url="http://127.0.0.1:1/relay"))
    interaction = build_interaction(
        seen, FlowEnd(t0=T0, relayed=relayed), session="s", mode="record"
    )
    leg = interaction.legs["upstream_req"]
    assert leg.url.startswith("https://b.example/v1/responses") and SECRET not in leg.url
    assert leg.headers == [("api-key", "<redacted>")]
    assert SECRET.encode() not in leg.body() and b'"input":"x"' in leg.body()
    assert "upstream_resp" not in interaction.legs  # no head came back


def test_a_cut_names_its_side_and_the_translators_reason_comes_first() -> None:
    seen = Seen()
    by_client = build_interaction(
        seen, FlowEnd(t0=T0, error="Client disconnected."), session="s", mode="record"
    )
    assert by_client.truncated == "client: Client disconnected." and by_client.error
    by_upstream = build_interaction(
        seen, FlowEnd(t0=T0, error="Connection reset"), session="s", mode="record"
    )
    assert by_upstream.truncated == "upstream: Connection reset"
    noticed = FlowEnd(t0=T0, error="Connection reset", endpoint="e", upstream_cut="no [DONE]")
    assert build_interaction(seen, noticed, session="s", mode="record").truncated == (
        "upstream: no [DONE]"
    )


def test_a_passthrough_stream_shares_its_pieces_between_both_legs() -> None:
    upstream = timed([b"data: 1\n\n", b"data: 2\n\n"])
    seen = Seen(upstream_req=Message(method="POST"), upstream_status=200)
    end = FlowEnd(
        t0=T0,
        response=ClientResponse(200, [], None, T0 + 0.01, T0 + 0.02),
        upstream_stream=upstream,
        minted={"clock": [1]},
    )
    interaction = build_interaction(seen, end, session="s", mode="record")
    assert interaction.legs["client_resp"].chunks is interaction.legs["upstream_resp"].chunks
    assert list(interaction.legs["client_resp"].chunks or ()) == [
        (15_625, b"data: 1\n\n"),
        (31_250, b"data: 2\n\n"),
    ]
    assert interaction.minted == {"clock": [1]}


def test_clean_inputs_make_a_clean_translation_that_is_not_scanned_again() -> None:
    upstream, client = timed([b"a", b"b"]), timed([b"x", b"y", b"z"])
    assert stream_legs(upstream, client, request_clean=True) == (upstream, client)
    out_upstream, out_client = stream_legs(upstream, client, request_clean=True)
    assert out_upstream is upstream and out_client is client
    # A request that held a secret may have echoed it into the answer: that one is redacted.
    echoed = timed([b"data: ", SECRET.encode(), b"\n\n"])
    _, redacted = stream_legs(upstream, echoed, request_clean=False)
    assert redacted is not None and SECRET.encode() not in b"".join(d for _, d in redacted)
    assert len(redacted) == 3  # split at the same places


def test_nothing_streamed_is_no_stream_legs() -> None:
    assert stream_legs(None, None, request_clean=True) == (None, None)


@given(
    before=st.binary(max_size=40).filter(lambda b: b"sk-" not in b),
    after=st.binary(max_size=40),
    cuts=st.lists(st.integers(min_value=0, max_value=120), max_size=6),
    translated=st.booleans(),
)
def test_a_secret_never_reaches_a_recorded_stream_wherever_it_is_split(
    before: bytes, after: bytes, cuts: list[int], translated: bool
) -> None:
    body = before + b" " + SECRET.encode() + b" " + after
    points = sorted({min(c, len(body)) for c in cuts} | {0, len(body)})
    chunks = [body[a:b] for a, b in itertools.pairwise(points)]
    upstream = timed(chunks)
    client = timed([body]) if translated else None
    up, cl = stream_legs(upstream, client, request_clean=True)
    assert up is not None and cl is not None
    for leg in (up, cl):
        assert SECRET.encode() not in b"".join(data for _, data in leg)
    assert [t for t, _ in up] == list(upstream.offsets)  # each piece keeps its time


def test_a_miss_is_reported_and_explained() -> None:
    closest = Interaction(
        id="rec1",
        scope="t",
        key="other",
        key_version=1,
        method="POST",
        route=KEY.route,
        model="m",
        stream=False,
        canonical_utf8=b'{"model":"n"}',
        started_us=0,
        source="recordings/t/0001.json",
    )
    miss = Miss("no-key", "t", KEY, closest, keys_in_scope=1)
    text = miss_text(miss, mode="replay", profile="default", loaded=3, unused=2, diff=["- a"])
    lines = text.splitlines()
    assert lines[0] == "REPLAY MISS scope=t mode=replay profile=default"
    assert f"  key     : {KEY.key} (match key version {KEY.version})" in lines
    assert "(3 loaded, 2 unused)" in lines[3]
    assert "  closest : rec1 recordings/t/0001.json" in lines
    assert "  diff    : - a" in lines and lines[-1].startswith("  fix     :")
    alone = miss_text(
        Miss("no-scope", "u", KEY, None), mode="once", profile="loose", loaded=0, unused=0, diff=[]
    )
    assert "closest" not in alone and "no recordings in scope 'u'" in alone

    report = ReplayReport(mode="replay", hits=1)
    report.add_miss(miss, ["- a"])
    document = report.to_json([closest])
    assert document["misses"] == [
        {
            "scope": "t",
            "key": KEY.key,
            "reason": "no-key",
            "request": f"POST {KEY.route}",
            "model": "m",
            "closest": "rec1",
            "diff": ["- a"],
        }
    ]
    assert document["unused"] == [
        {"id": "rec1", "scope": "t", "key": "other", "route": KEY.route, "model": "m"}
    ]
    assert (document["mode"], document["hits"], document["recorded"]) == ("replay", 1, 0)
    assert capture_label(closest) == f"POST {KEY.route} model=m"
