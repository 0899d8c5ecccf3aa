"""Usage accounting: tokens from bodies and streams of both APIs (translated and passthrough),
the usage and store addons under taddons, and ``llmitm usage``'s table, JSON and errors.

Upstream answers come from the fake upstream's own renderers (llmitm.testing.fake_upstream), so
the expected numbers are the fake's, not llmitm's."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from mitmproxy import http
from mitmproxy.exceptions import OptionsError
from mitmproxy.test import taddons, tflow

from llmitm.addons import make_addons
from llmitm.addons.state import METADATA_KEY, FlowState
from llmitm.addons.store import LlmStore
from llmitm.addons.usage import LlmUsage
from llmitm.cli.usage import UsageError, parse_since
from llmitm.exchange.stream import StreamRewriter
from llmitm.exchange.usage import UsageRecord, body_tokens, stream_tokens
from llmitm.routing.config import Endpoint
from llmitm.routing.plan import plan_for_endpoint
from llmitm.store import SqliteStore, default_store_path
from llmitm.testing import fake_upstream as fu
from llmitm.translate.context import TranslationContext
from llmitm.translate.guard import StreamGuard
from llmitm.translate.pipeline import StreamPipeline
from llmitm.wire.usage import usage_tokens

ROOT = Path(__file__).resolve().parents[2]

USAGE = fu.Usage(input=40, output=12, reasoning=5)
EXPECTED = (40, 20, 12, 5)  # the fake caches half the input


def reply(include_usage: bool = True, scenario: str = "reasoning") -> tuple[fu.Plan, fu.Reply]:
    body: dict[str, Any] = {"model": "m", "stream": True}
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    spec = fu.choose_scenario(scenario, body)
    plan = fu.build_plan(spec, body, lambda: "call_1")
    return plan, fu.Reply(1, 1_750_000_000, "m", body, spec, USAGE)


def chat_sse(include_usage: bool = True) -> bytes:
    return b"".join(fu.chat_chunks(*reply(include_usage)))


def responses_sse() -> bytes:
    return b"".join(fu.responses_frames(*reply()))


def run(pipeline: StreamPipeline | StreamGuard, sse: bytes, size: int = 0) -> bytes:
    """Feed ``sse`` whole events per chunk (size 0), or split every ``size`` bytes."""
    rewriter = StreamRewriter(pipeline)
    if size:
        pieces = [sse[i : i + size] for i in range(0, len(sse), size)]
    else:
        pieces = [frame + b"\n\n" for frame in sse.split(b"\n\n") if frame]
    out = [rewriter(piece) for piece in pieces] + [rewriter(b"")]
    return b"".join(b"".join(chunks) for chunks in out)


# --- normalising either shape -----------------------------------------------------------------


def test_usage_tokens_reads_both_shapes_alike() -> None:
    assert usage_tokens(USAGE.chat()) == EXPECTED
    assert usage_tokens(USAGE.responses()) == EXPECTED
    assert usage_tokens({"prompt_tokens": 3, "completion_tokens": 4}) == (3, 0, 4, 0)
    assert usage_tokens({"prompt_tokens": 3}) is None
    assert usage_tokens(None) is None


def test_bodies_of_both_apis() -> None:
    plan, answer = reply()
    assert body_tokens(orjson.dumps(fu.chat_completion(plan, answer))) == EXPECTED
    assert body_tokens(orjson.dumps(fu.responses_object(plan, answer))) == EXPECTED
    assert body_tokens(b'{"id": "x"}') is None
    assert body_tokens(b'{"usage": ') is None
    assert body_tokens(b"") is None


# --- streams ------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 7])
def test_responses_to_chat_reads_the_terminal_usage_even_when_the_client_did_not_ask(
    size: int,
) -> None:
    pipeline = StreamPipeline("responses-to-chat", TranslationContext(include_usage=False))
    out = run(pipeline, responses_sse(), size)
    assert b'"usage":{' not in out  # the client did not ask to see it
    assert stream_tokens(pipeline) == EXPECTED


@pytest.mark.parametrize("size", [0, 7])
def test_chat_to_responses_reads_the_usage_chunk(size: int) -> None:
    pipeline = StreamPipeline("chat-to-responses", TranslationContext(model="m"))
    run(pipeline, chat_sse(), size)
    assert stream_tokens(pipeline) == EXPECTED


def test_the_normaliser_keeps_the_terminal_usage() -> None:
    pipeline = StreamPipeline("normalise-responses", TranslationContext(model="m"))
    run(pipeline, responses_sse())
    assert stream_tokens(pipeline) == EXPECTED


@pytest.mark.parametrize("size", [0, 5, 64, 100_000])
@pytest.mark.parametrize("api", ["chat", "responses"])
def test_the_guard_reads_usage_from_the_last_chunks_and_relays_bytes_untouched(
    api: str, size: int
) -> None:
    sse = chat_sse() if api == "chat" else responses_sse()
    guard = StreamGuard(api)  # type: ignore[arg-type]
    assert run(guard, sse, size) == sse
    assert stream_tokens(guard) == EXPECTED


def test_the_guard_reads_a_usage_chunk_sent_with_done_in_one_piece() -> None:
    frames = chat_sse().split(b"\n\n")
    glued = b"\n\n".join(frames[:-3]) + b"\n\n"  # all but the usage chunk and [DONE]
    tail = frames[-3] + b"\n\n" + frames[-2] + b"\n\n"
    guard = StreamGuard("chat")
    rewriter = StreamRewriter(guard)
    rewriter(glued)
    rewriter(tail)
    rewriter(b"")
    assert stream_tokens(guard) == EXPECTED


def test_the_guard_without_usage() -> None:
    guard = StreamGuard("chat")
    run(guard, chat_sse(include_usage=False))
    assert guard.finished
    assert stream_tokens(guard) is None


def test_a_cut_stream_has_no_usage() -> None:
    sse = responses_sse()
    guard = StreamGuard("responses")
    run(guard, sse[: len(sse) // 2])
    assert stream_tokens(guard) is None


# --- the addons ---------------------------------------------------------------------------------


class RecordingStore:
    def __init__(self) -> None:
        self.writes: list[Any] = []

    def submit(self, write: Any) -> None:
        self.writes.append(write)


ENDPOINT = Endpoint(
    name="local", kind="compatible", base_url="http://h/v1", apis=frozenset({"chat"})
)


def planned_flow(client_api: str, content: bytes, *, stream: Any = None, status: int = 200):
    plan = plan_for_endpoint(ENDPOINT, client_api, "qwen")  # type: ignore[arg-type]
    flow = tflow.tflow()
    flow.metadata[METADATA_KEY] = FlowState(
        replace(plan, route="local-route"),
        TranslationContext(model="gpt-client"),
        client_stream=stream is not None,
        streamed=stream is not None,
    )
    flow.response = http.Response.make(status, content, {"content-type": "application/json"})
    if stream is not None:
        flow.response.stream = stream
    return flow


def usage_addon() -> tuple[LlmUsage, RecordingStore]:
    store = RecordingStore()
    return LlmUsage(store), store  # type: ignore[arg-type]


def test_a_non_streamed_flow_is_recorded_with_endpoint_client_model_and_route() -> None:
    addon, store = usage_addon()
    plan, answer = reply()
    with taddons.context(addon):
        addon.response(planned_flow("chat", orjson.dumps(fu.chat_completion(plan, answer))))
    (record,) = store.writes
    assert isinstance(record, UsageRecord)
    assert (record.endpoint, record.model, record.route) == ("local", "gpt-client", "local-route")
    assert (
        record.input_tokens,
        record.cached_tokens,
        record.output_tokens,
        record.reasoning_tokens,
    ) == EXPECTED
    assert record.at.tzinfo is not None


def test_a_streamed_flow_is_recorded_from_its_pipeline() -> None:
    addon, store = usage_addon()
    guard = StreamGuard("chat")
    rewriter = StreamRewriter(guard)
    run_flow = planned_flow("chat", b"", stream=rewriter)
    run(guard, chat_sse())  # the stream has gone through before the response hook
    with taddons.context(addon):
        addon.response(run_flow)
    assert [w.output_tokens for w in store.writes] == [12]


def test_flows_without_usage_errors_and_unplanned_flows_are_not_recorded() -> None:
    addon, store = usage_addon()
    with taddons.context(addon):
        addon.response(planned_flow("chat", b'{"choices": []}'))
        addon.response(planned_flow("chat", orjson.dumps({"usage": USAGE.chat()}), status=500))
        addon.response(tflow.tflow(resp=True))
    assert store.writes == []
    assert addon.without_usage == 2


def test_make_addons_puts_usage_before_the_body_translation() -> None:
    names = [addon.name for addon in make_addons()]  # type: ignore[attr-defined]
    assert names.index("llmitm_store") < names.index("llmitm_usage")
    assert names.index("llmitm_usage") < names.index("llmitm_stream_translator")


def store_addon() -> tuple[LlmStore, Any]:
    addons = make_addons()
    return next(a for a in addons if isinstance(a, LlmStore)), addons


def test_store_path_option_then_config_then_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    config = tmp_path / "llmitm.toml"
    config.write_text('[llmitm]\nstore = "from-config.db"\n')
    store, addons = store_addon()
    with taddons.context(*addons) as tctx:
        assert store.location() == str(tmp_path / "xdg" / "llmitm" / "llmitm.db")
        tctx.options.update(llmitm_config=str(config))
        assert store.location() == str(tmp_path / "from-config.db")
        tctx.options.update(llmitm_store=str(tmp_path / "option.db"))
        assert store.location() == str(tmp_path / "option.db")
        tctx.options.update(llmitm_store="postgresql://llmitm@db:5432/llmitm")
        assert store.location() == "postgresql://llmitm@db:5432/llmitm"  # not a path
        with pytest.raises(OptionsError, match="PGPASSWORD") as refused:
            tctx.options.update(llmitm_store="postgresql://llmitm:s3cret@db:5432/llmitm")
        assert "s3cret" not in str(refused.value)
        tctx.options.update(llmitm_store="")
        assert store.location() is None


def test_default_store_path_ignores_a_relative_xdg_data_home() -> None:
    assert default_store_path({"XDG_DATA_HOME": "/d"}) == Path("/d/llmitm/llmitm.db")
    home = Path("~/.local/share/llmitm/llmitm.db").expanduser()
    assert default_store_path({"XDG_DATA_HOME": "rel"}) == home
    assert default_store_path({}) == home


async def test_running_opens_and_done_closes_with_every_write_on_disk(tmp_path: Path) -> None:
    db = tmp_path / "u.db"
    store, addons = store_addon()
    with taddons.context(*addons) as tctx:
        tctx.options.update(llmitm_store=str(db))
        opening = store.running()
        assert opening is not None  # the master awaits it; a hot reload only schedules it
        store.submit(UsageRecord(datetime.now(UTC), "e", "m", "r", 1))  # before the open ends
        await opening
        store.submit(UsageRecord(datetime.now(UTC), "e", "m", "r", 2))
        closing = store.done()
        assert closing is not None
        store.submit(UsageRecord(datetime.now(UTC), "e", "m", "r", 4))  # after done: ignored
        await closing
    async with SqliteStore(db, read_only=True) as reader:
        (row,) = await reader.usage_rows()
    assert (row.requests, row.input_tokens) == (2, 3)


def test_hooks_stay_sync_for_hot_reload() -> None:
    assert not asyncio.iscoroutinefunction(LlmStore.running)
    assert not asyncio.iscoroutinefunction(LlmStore.done)


async def test_a_disabled_store_does_nothing(tmp_path: Path) -> None:
    store, addons = store_addon()
    with taddons.context(*addons) as tctx:
        tctx.options.update(llmitm_store="")
        assert store.running() is None
        store.submit(UsageRecord(datetime.now(UTC), "e", "m", "r", 1))
        assert store.done() is None


async def test_a_store_that_cannot_open_is_logged_and_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "file").write_text("")
    store, addons = store_addon()
    with taddons.context(*addons) as tctx:
        tctx.options.update(llmitm_store=str(tmp_path / "file" / "u.db"))
        opening = store.running()
        assert opening is not None
        await opening
        assert store.store is None
        assert "cannot open the store" in caplog.text
        store.submit(UsageRecord(datetime.now(UTC), "e", "m", "r", 1))


# --- llmitm usage -------------------------------------------------------------------------------


def llmitm(*args: str) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name("llmitm")
    return subprocess.run(
        [str(script), *args], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture
def usage_db(tmp_path: Path) -> Path:
    db = tmp_path / "usage.db"

    async def fill() -> None:
        async with SqliteStore(db) as store:
            day1 = datetime(2025, 1, 1, 12, tzinfo=UTC)
            day2 = datetime(2025, 1, 2, 12, tzinfo=UTC)
            store.submit(UsageRecord(day1, "azure", "gpt-5", "main", 100, 50, 10, 5))
            store.submit(UsageRecord(day2, "azure", "gpt-5", "main", 200, 0, 20, 0))
            store.submit(UsageRecord(day2, "local", "qwen", "routes[1]", 1000, 0, 300, 7))

    asyncio.run(fill())
    return db


def test_usage_json_per_model_with_totals(usage_db: Path) -> None:
    result = llmitm("usage", "--db", str(usage_db), "--by", "model", "--json")
    assert result.returncode == 0, result.stderr
    document = orjson.loads(result.stdout)
    assert document["by"] == "model"
    assert [(r["key"], r["requests"], r["input_tokens"]) for r in document["rows"]] == [
        ("gpt-5", 2, 300),
        ("qwen", 1, 1000),
    ]
    assert document["total"] == {
        "requests": 3,
        "input_tokens": 1300,
        "cached_tokens": 50,
        "output_tokens": 330,
        "reasoning_tokens": 12,
    }


def test_usage_since_a_day(usage_db: Path) -> None:
    result = llmitm(
        "usage", "--db", str(usage_db), "--by", "day", "--since", "2025-01-02", "--json"
    )
    document = orjson.loads(result.stdout)
    assert [(r["key"], r["requests"]) for r in document["rows"]] == [("2025-01-02", 2)]


def test_usage_table(usage_db: Path) -> None:
    result = llmitm("usage", "--db", str(usage_db), "--by", "route")
    assert result.returncode == 0, result.stderr
    for text in ("Token usage by route", "main", "routes[1]", "1,300", "total", "reasoning"):
        assert text in result.stdout


def test_usage_does_not_write_to_the_database(usage_db: Path) -> None:
    before = usage_db.read_bytes()
    assert llmitm("usage", "--db", str(usage_db)).returncode == 0
    assert usage_db.read_bytes() == before


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--db", "{tmp}/missing.db"), "no usage database at"),
        (("--since", "yesterday"), "--since: expected YYYY-MM-DD"),
        (("--by", "colour"), "--by: expected one of endpoint, model, day, route"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(
    usage_db: Path, tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    argv = [a.format(tmp=tmp_path) for a in args]
    if "--db" not in argv:
        argv += ["--db", str(usage_db)]
    result = llmitm("usage", *argv)
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1
    assert result.stderr.startswith("llmitm usage: ") and message in result.stderr


def test_parse_since() -> None:
    now = datetime(2025, 3, 10, 12, tzinfo=UTC)
    assert parse_since("7d", now) == datetime(2025, 3, 3, 12, tzinfo=UTC)
    assert parse_since("24h", now) == datetime(2025, 3, 9, 12, tzinfo=UTC)
    assert parse_since("2025-03-01", now) == datetime(2025, 3, 1, tzinfo=UTC)
    assert parse_since(None, now) is None
    with pytest.raises(UsageError):
        parse_since("-1d", now)
