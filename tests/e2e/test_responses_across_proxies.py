"""Two real llmitm processes sharing one store, as a fleet behind a load balancer (issue 18):
a client's requests alternate between them, and the Responses state each one keeps is the
other's too.

- an openai-agents conversation whose every model call goes to the other proxy, chained by
  ``previous_response_id`` over a chat-only upstream; and the same agent Codex-style
  (``store: false``, reasoning sealed into ``encrypted_content`` and restored by the other
  proxy);
- retrieve, ``input_items``, delete and continuation right after the create, on the other
  proxy (its write may not be committed yet: the lookup waits for it), within the
  credential's scope;
- a background response started on one proxy, retrieved, streamed from ``starting_after``
  (live) and cancelled from the other;
- a proxy killed (SIGKILL) or stopped in the middle of a background response: the other one
  ends it ``failed``, and a client following its stream there gets ``response.failed``.

The store is a parameter (:data:`STORES`, :func:`store_location`: the value given to
``llmitm_store`` and the environment the proxies need for it): a SQLite file, which processes
on one host share, and a database on a real PostgreSQL server (its password in
``PGPASSWORD``), which a fleet on several hosts shares. Every test runs on both.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx  # the openai SDK's own HTTP library: its client takes the transport below
import openai
import orjson
import pytest

pytest.importorskip("agents", reason="openai-agents is in the e2e extra (make e2e-deps)")

from agents import (
    Agent,
    ModelSettings,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)

from .processes import TWO_ENDPOINTS as CONFIG
from .processes import Proxy, Upstream, fake_upstream, llmitm_proxy

pytestmark = pytest.mark.slow

LEASE_S = 2.0
"""The run lease the proxies are given (``llmitm_run_lease_ms``): short, for the kill tests."""
WAIT_MS = 4000
"""How long a lookup waits for the other proxy's write (its grace without a pending mark is
a twentieth of it)."""
THOUGHT = "The user wants a short greeting.\n\nI will answer briefly."  # the fake's reasoning
TOOL_PREFIX = "fleet-tool-ok"
SLOW = {"x-fake-scenario": "text;events=400;event_delay_ms=25"}  # ~10 s of deltas

calls: list[str] = []


@function_tool
def lookup_code(topic: str) -> str:
    """Look up the secret code for a topic.

    Args:
        topic: what to look the code up for.
    """
    calls.append(topic)
    return f"{TOOL_PREFIX}:{topic}"


STORES = ["sqlite", "postgresql"]
"""The stores the fleet tests run on: each a kind :func:`store_location` knows."""


@dataclass(frozen=True)
class FleetStore:
    """A store for a fleet: the ``llmitm_store`` value, and the environment its proxies need."""

    location: str
    env: dict[str, str] = field(default_factory=dict)


@contextmanager
def store_location(request: pytest.FixtureRequest, kind: str, folder: Path) -> Iterator[FleetStore]:
    """A fresh store of ``kind`` for a fleet, made for a test and dropped after it."""
    if kind == "sqlite":
        yield FleetStore(str(folder / "fleet.db"))  # processes on one host share one file
        return
    if kind == "postgresql":
        server = request.getfixturevalue("postgres")  # the worker's real server
        dsn = server.create_database()
        try:
            yield FleetStore(dsn, server.env())  # the password in PGPASSWORD, not the URL
        finally:
            server.drop_database(dsn)
        return
    raise LookupError(f"no {kind} store for the fleet tests")


@pytest.fixture(scope="module", params=STORES)
def shared_store(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FleetStore]:
    """Where both proxies of the module's fleet keep their state."""
    with store_location(request, request.param, tmp_path_factory.mktemp("store")) as store:
        yield store


@pytest.fixture(params=STORES)
def fresh_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FleetStore]:
    """A store of its own, for a test that kills one of its proxies."""
    with store_location(request, request.param, tmp_path) as store:
        yield store


@contextmanager
def fleet(
    tmp: Path, store: FleetStore, chat: Upstream, responses: Upstream | None = None
) -> Iterator[tuple[Proxy, Proxy]]:
    """Two proxies with one configuration and one store."""
    config = CONFIG.format(chat=chat.url, responses=responses.url if responses else "http://x")
    options = [
        "--set", f"llmitm_store={store.location}",
        "--set", f"llmitm_run_lease_ms={int(LEASE_S * 1000)}",
        "--set", f"llmitm_responses_wait_ms={WAIT_MS}",
    ]  # fmt: skip
    with (
        llmitm_proxy(tmp / "a", config=config, extra=options, env=store.env) as a,
        llmitm_proxy(tmp / "b", config=config, extra=options, env=store.env) as b,
    ):
        yield a, b


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, shared_store: FleetStore
) -> Iterator[tuple[Proxy, Proxy, Upstream]]:
    set_tracing_disabled(True)
    tmp = tmp_path_factory.mktemp("fleet")
    with fake_upstream(tmp, "chat") as chat, fleet(tmp, shared_store, chat) as (a, b):
        yield a, b, chat


@pytest.fixture
def proxies(stack: tuple[Proxy, Proxy, Upstream]) -> tuple[Proxy, Proxy]:
    httpx.post(f"{stack[2].url}/_reset")
    calls.clear()
    return stack[0], stack[1]


class Alternating(httpx.AsyncBaseTransport):
    """A load balancer in the client: each request goes to the next proxy in turn."""

    def __init__(self, proxies: tuple[Proxy, ...]) -> None:
        self.ports = itertools.cycle([p.port() for p in proxies])
        self.sent: list[int] = []
        self.inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        port = next(self.ports)
        self.sent.append(port)
        request.url = request.url.copy_with(port=port)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def alternating_client(
    proxies: tuple[Proxy, Proxy], **headers: str
) -> tuple[openai.AsyncOpenAI, Alternating]:
    transport = Alternating(proxies)
    client = openai.AsyncOpenAI(
        base_url=proxies[0].base_url(),
        api_key="sk-fleet",
        max_retries=0,
        default_headers=headers,
        http_client=httpx.AsyncClient(transport=transport),
    )
    return client, transport


def client_of(proxy: Proxy, key: str = "sk-fleet") -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.base_url(), api_key=key, max_retries=0)


def upstream_requests(upstream: Upstream) -> list[dict]:
    return orjson.loads(httpx.get(f"{upstream.url}/_requests").content)


def no_traceback(*proxies: Proxy) -> None:
    for proxy in proxies:
        log = proxy.log_text()
        assert "Traceback" not in log, log[-3000:]


# -- conversations across proxies ------------------------------------------------------------


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
async def test_an_agent_conversation_alternates_proxies_call_by_call(
    proxies: tuple[Proxy, Proxy], stack: tuple[Proxy, Proxy, Upstream], streamed: bool
) -> None:
    """Two agent turns of two model calls each (the tool call, then the answer), every call
    chained on the one before by ``previous_response_id`` and sent to the other proxy."""
    chat = stack[2]
    client, transport = alternating_client(proxies)
    agent = Agent(
        name="coder",
        instructions="Use lookup_code, then answer with what it returned.",
        model=OpenAIResponsesModel(model="over-chat", openai_client=client),
        tools=[lookup_code],
    )
    try:
        previous = None
        for question in ("What is the code for x?", "And for y?"):
            kwargs: dict[str, Any] = {"previous_response_id": previous}
            if streamed:
                running = Runner.run_streamed(
                    agent, question, auto_previous_response_id=True, **kwargs
                )
                [_ async for _ in running.stream_events()]
                result: Any = running
            else:
                result = await Runner.run(agent, question, auto_previous_response_id=True, **kwargs)
            previous = result.last_response_id
            assert previous
    finally:
        await client.close()

    a, b = (p.port() for p in proxies)
    assert transport.sent == [a, b, a, b]  # each call on the other proxy
    assert calls == ["x", "x"]
    assert f"{TOOL_PREFIX}:x" in str(result.final_output)
    sent = upstream_requests(chat)
    assert len(sent) == 4
    conversation = [
        (m["role"], m.get("content") if m["role"] != "assistant" or not m.get("tool_calls")
         else orjson.loads(m["tool_calls"][0]["function"]["arguments"])["topic"])
        for m in sent[-1]["body"]["messages"]
    ]  # fmt: skip
    assert conversation == [  # the last call's proxy rebuilt all three responses before it
        ("system", "Use lookup_code, then answer with what it returned."),
        ("user", "What is the code for x?"),
        ("assistant", "x"),
        ("tool", f"{TOOL_PREFIX}:x"),
        ("assistant", f"Tool result: {TOOL_PREFIX}:x"),
        ("user", "And for y?"),
        ("assistant", "x"),
        ("tool", f"{TOOL_PREFIX}:x"),
    ]
    no_traceback(*proxies)


async def test_codex_style_sealed_reasoning_is_restored_by_the_other_proxy(
    proxies: tuple[Proxy, Proxy], stack: tuple[Proxy, Proxy, Upstream]
) -> None:
    """``store: false``: the agent keeps the conversation and sends the reasoning items back
    with the ``encrypted_content`` one proxy sealed; the other opens it (one key in the
    store) and gives the chat upstream the reasoning back."""
    chat = stack[2]
    client, transport = alternating_client(proxies, **{"x-fake-scenario": "reasoning"})
    agent = Agent(
        name="thinker",
        instructions="Answer briefly.",
        model=OpenAIResponsesModel(model="over-chat", openai_client=client),
        model_settings=ModelSettings(store=False, response_include=["reasoning.encrypted_content"]),
    )
    try:
        first = await Runner.run(agent, "hi")
        sealed = [i for i in first.to_input_list() if i.get("type") == "reasoning"]
        assert sealed and sealed[0]["encrypted_content"]
        assert "greeting" not in sealed[0]["encrypted_content"]
        second = await Runner.run(
            agent, [*first.to_input_list(), {"role": "user", "content": "and?"}]
        )
    finally:
        await client.close()
    assert second.final_output
    assert transport.sent == [p.port() for p in proxies]  # sealed on one, opened on the other
    first_sent, second_sent = upstream_requests(chat)
    assert all("reasoning_content" not in m for m in first_sent["body"]["messages"])
    [assistant] = [m for m in second_sent["body"]["messages"] if m["role"] == "assistant"]
    assert assistant["reasoning_content"] == THOUGHT
    no_traceback(*proxies)


def test_state_calls_reach_a_response_the_other_proxy_just_answered(
    proxies: tuple[Proxy, Proxy],
) -> None:
    a, b = (client_of(p) for p in proxies)
    for stream in (False, True):
        if stream:
            with a.responses.stream(model="over-chat", input="one") as events:
                created = events.get_final_response()
        else:
            created = a.responses.create(model="over-chat", input="one")
        # At once, on the other proxy: its write may still be in the first one's queue.
        got = b.responses.retrieve(created.id)
        assert got.id == created.id and got.output_text == created.output_text
        assert got.model_dump() == a.responses.retrieve(created.id).model_dump()
        [item] = b.responses.input_items.list(created.id).data
        assert item.content[0].text == "one"
        following = b.responses.create(
            model="over-chat", input="two", previous_response_id=created.id
        )
        assert a.responses.retrieve(following.id).previous_response_id == created.id
        b.responses.delete(following.id)
        # A delete reaches the other proxy once B's queue has committed it (milliseconds).
        until(lambda rid=following.id: gone(a, rid), "deleted on the other proxy")

    # Another credential sees none of it, on either proxy (one fingerprint key in the store).
    created = a.responses.create(model="over-chat", input="mine")
    stranger = client_of(proxies[1], key="sk-stranger")
    with pytest.raises(openai.NotFoundError):
        stranger.responses.retrieve(created.id)
    with pytest.raises(openai.BadRequestError) as caught:
        stranger.responses.create(model="over-chat", input="x", previous_response_id=created.id)
    assert caught.value.code == "previous_response_not_found"
    with pytest.raises(openai.BadRequestError) as caught:  # unknown: not found, after a wait
        b.responses.create(model="over-chat", input="x", previous_response_id="resp_unknown")
    assert caught.value.code == "previous_response_not_found"
    no_traceback(*proxies)


# -- background runs across proxies ----------------------------------------------------------


def follow(
    client: openai.OpenAI, response_id: str, after: int, into: list[Any]
) -> threading.Thread:
    """Stream ``response_id`` from ``after`` in a thread, each event into ``into``."""

    def read() -> None:
        for event in client.responses.retrieve(response_id, stream=True, starting_after=after):
            into.append(event)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def gone(client: openai.OpenAI, response_id: str) -> bool:
    try:
        client.responses.retrieve(response_id)
    except openai.NotFoundError:
        return True
    return False


def until(condition: Any, what: str, timeout: float = 30.0) -> None:
    """Wait for ``condition()`` (a hang guard, not a timing claim)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)


def test_a_background_response_started_on_one_is_streamed_and_cancelled_from_the_other(
    proxies: tuple[Proxy, Proxy], stack: tuple[Proxy, Proxy, Upstream]
) -> None:
    chat = stack[2]
    a, b = (client_of(p) for p in proxies)
    created = a.responses.create(
        model="over-chat", input="long", background=True, extra_headers=SLOW
    )
    assert created.status in ("queued", "in_progress")
    seen = b.responses.retrieve(created.id)  # at once, on the other proxy
    assert seen.id == created.id and seen.background is True
    until(lambda: b.responses.retrieve(created.id).status == "in_progress", "in progress")

    events: list[Any] = []
    reading = follow(b, created.id, 3, events)
    until(lambda: len(events) >= 12, "live events through the other proxy")
    cancelled = b.responses.cancel(created.id)
    assert cancelled.id == created.id and cancelled.status == "cancelled"
    reading.join(timeout=30)
    assert not reading.is_alive(), "the stream on B did not end with the run"
    numbers = [e.sequence_number for e in events]
    assert numbers == list(range(4, 4 + len(numbers)))  # from starting_after, none missing
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert 0 < len(deltas) < 400  # live: cut by the cancel, long before the run's end
    assert a.responses.retrieve(created.id).status == "cancelled"
    until(lambda: httpx.get(f"{chat.url}/_stats").json()["in_flight"] == 0, "upstream call ended")
    assert b.responses.cancel(created.id).status == "cancelled"  # idempotent
    again = list(b.responses.retrieve(created.id, stream=True, starting_after=3))
    assert [e.sequence_number for e in again][: len(numbers)] == numbers  # stored, replayable

    # A finished one, streamed from the other proxy from any point.
    done = a.responses.create(
        model="over-chat",
        input="short",
        background=True,
        extra_headers={"x-fake-scenario": "text;events=5"},
    )
    until(lambda: b.responses.retrieve(done.id).status == "completed", "completed")
    replayed = list(b.responses.retrieve(done.id, stream=True, starting_after=-1))
    assert replayed[0].type == "response.created" and replayed[-1].type == "response.completed"
    assert replayed[-1].response.output_text == a.responses.retrieve(done.id).output_text

    # Deleting it on B while A runs it: gone for good, and A's run stops.
    doomed = a.responses.create(
        model="over-chat", input="doomed", background=True, extra_headers=SLOW
    )
    until(lambda: b.responses.retrieve(doomed.id).status == "in_progress", "in progress")
    b.responses.delete(doomed.id)
    until(lambda: httpx.get(f"{chat.url}/_stats").json()["in_flight"] == 0, "upstream call ended")
    time.sleep(LEASE_S)  # A's last writes are behind it
    for client in (a, b):
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(doomed.id)

    # Another credential cannot reach a run either.
    other = a.responses.create(
        model="over-chat", input="theirs", background=True, extra_headers=SLOW
    )
    stranger = client_of(proxies[1], key="sk-stranger")
    with pytest.raises(openai.NotFoundError):
        stranger.responses.cancel(other.id)
    with pytest.raises(openai.NotFoundError):
        list(stranger.responses.retrieve(other.id, stream=True))
    assert a.responses.cancel(other.id).status == "cancelled"
    no_traceback(*proxies)


@pytest.mark.timing
@pytest.mark.parametrize("ending", ["sigkill", "sigterm"])
def test_a_proxy_that_dies_or_stops_ends_its_runs_failed_for_the_other(
    tmp_path: Path, fresh_store: FleetStore, ending: str
) -> None:
    with fake_upstream(tmp_path, "chat") as chat, fleet(tmp_path, fresh_store, chat) as proxies:
        a, b = (client_of(p) for p in proxies)
        created = a.responses.create(
            model="over-chat", input="long", background=True, extra_headers=SLOW
        )
        until(lambda: b.responses.retrieve(created.id).status == "in_progress", "in progress")
        events: list[Any] = []
        reading = follow(b, created.id, -1, events)
        until(lambda: len(events) >= 6, "live events through the other proxy")
        owner = proxies[0].process
        stopped = time.monotonic()
        os.kill(owner.pid, signal.SIGKILL if ending == "sigkill" else signal.SIGTERM)
        owner.wait(timeout=15)
        reading.join(timeout=30)
        assert not reading.is_alive(), "the stream on B never ended"
        ended = time.monotonic() - stopped
        last = events[-1]
        assert last.type == "response.failed", last
        assert last.sequence_number == events[-2].sequence_number + 1
        failed = b.responses.retrieve(created.id)
        assert failed.status == "failed" and failed.error is not None
        expected = "no heartbeat" if ending == "sigkill" else "stopped before"
        assert expected in failed.error.message, failed.error.message
        assert b.responses.retrieve(created.id).status == "failed"  # and stays so
        with pytest.raises(openai.BadRequestError):
            b.responses.cancel(created.id)  # a failed response cannot be cancelled
        no_traceback(proxies[1])
        print(f"{ending}: the run read failed on the other proxy {ended:.2f} s after")
        # The bound: the lease (a stopped proxy ends its runs at once), plus a heartbeat
        # interval (lease / 5) and the follower's reads.
        assert ended < LEASE_S * 1.2 + 1.0
