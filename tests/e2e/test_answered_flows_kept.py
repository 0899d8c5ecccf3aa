"""A flow whose client has its whole answer is accounted and recorded, whatever ends it.

The fake upstream here ends each stream's body a while after its last event (``end_delay_ms``),
as servers that flush each event and close the body later do. Two things then happen before
the body ends, and neither may lose the flow's usage or its record:

- the client hangs up at the last event (the openai SDK stops reading a chat stream at
  ``[DONE]``), and mitmproxy ends the flow with "Client disconnected";
- a Responses client hangs up at ``response.completed``: the Response it was given is
  stored all the same, and its next turn's ``previous_response_id`` finds it;
- llmitm is stopped (SIGTERM) while a client that has the last event waits for the body's end:
  the stop lets the flows in flight end first (``llmitm_stop_grace``).

Both on a single-endpoint route (mitmproxy forwards the stream) and on a failover route (the
relay does), through real ``llmitm run`` processes.
"""

from __future__ import annotations

import signal
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import openai
import orjson
import pytest

from .processes import fake_upstream, llmitm_proxy

pytestmark = pytest.mark.slow

CONFIG = """
[routing]
backoff = 0.01

[endpoints.a]
kind = "compatible"
base_url = "{url}/v1"
apis = ["chat", "responses"]

[endpoints.b]
kind = "compatible"
base_url = "{url}/v1"
apis = ["chat", "responses"]

[[routes]]
name = "single"
models = ["single-*"]
endpoints = ["a"]

[endpoints.chat-only]
kind = "compatible"
base_url = "{url}/v1"
apis = ["chat"]

[[routes]]
name = "failover"
models = ["failover-*"]
endpoints = ["a", "b"]
affinity = false

[[routes]]
name = "translated"
models = ["translated-*"]
endpoints = ["chat-only"]
"""

END_DELAY_MS = 1500
"""How long after its last event the upstream ends a stream's body: far longer than anything
below takes between the last event and its check."""
SCENARIO = {"x-fake-scenario": f"text;end_delay_ms={END_DELAY_MS}"}
ROUTES = ["single", "failover"]


def _counts(db: Path) -> tuple[int, int]:
    """(usage rows, recorded flows) in the store."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as connection:
        usage = connection.execute("SELECT count(*) FROM usage").fetchone()[0]
        recorded = connection.execute("SELECT count(*) FROM rec_interactions").fetchone()[0]
    return usage, recorded


@pytest.mark.parametrize("route", ROUTES)
def test_a_chat_stream_the_client_left_at_done_is_accounted(tmp_path: Path, route: str) -> None:
    db = tmp_path / "llmitm.db"
    with (
        fake_upstream(tmp_path) as fake,
        llmitm_proxy(tmp_path, config=CONFIG.format(url=fake.url)) as proxy,
    ):
        client = openai.OpenAI(base_url=proxy.base_url(), api_key="sk-client", max_retries=0)
        for n in range(3):
            text = "".join(
                chunk.choices[0].delta.content or ""
                for chunk in client.chat.completions.create(
                    model=f"{route}-model",
                    messages=[{"role": "user", "content": f"hello {n}"}],
                    stream=True,
                    stream_options={"include_usage": True},
                    extra_headers=SCENARIO,
                )
                if chunk.choices
            )
            assert text == "Hello from the fake upstream."
    assert proxy.process.returncode == 0, proxy.log_text()
    assert "Client disconnected" in proxy.log_text()  # the SDK did leave before the body's end
    assert _counts(db) == (3, 3)


def _read_to_last_event(chunks: Iterator[bytes], last: bytes) -> bytes:
    """Read ``chunks`` through the whole event that starts with ``last``, leaving them open:
    the caller holds the iterator (one let go closes the response: the client hangs up)."""
    seen = b""
    for data in chunks:
        seen += data
        if last in seen and seen.endswith(b"\n\n"):
            return seen
    raise AssertionError(f"the stream ended without {last!r}: {seen[-300:]!r}")


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("api", ["chat", "responses"])
def test_a_stop_keeps_a_stream_whose_client_has_its_last_event(
    tmp_path: Path, route: str, api: str
) -> None:
    db = tmp_path / "llmitm.db"
    if api == "chat":
        path, last = "chat/completions", b"data: [DONE]"
        body: dict[str, object] = {"messages": [{"role": "user", "content": "hello"}]}
    else:
        path, last = "responses", b"event: response.completed"
        body = {"input": "hello"}
    body |= {"model": f"{route}-model", "stream": True}
    headers = {"authorization": "Bearer sk-client", **SCENARIO}
    with (
        fake_upstream(tmp_path) as fake,
        llmitm_proxy(tmp_path, config=CONFIG.format(url=fake.url)) as proxy,
        httpx.Client(timeout=30) as client,
        client.stream("POST", f"{proxy.base_url()}/{path}", json=body, headers=headers) as answer,
    ):
        assert answer.status_code == 200
        chunks = answer.iter_raw()
        seen = _read_to_last_event(chunks, last)
        # The client has its answer and is still there; the upstream's body ends only in
        # END_DELAY_MS.
        proxy.process.send_signal(signal.SIGTERM)
        assert proxy.process.wait(timeout=END_DELAY_MS / 1000 + 8) == 0, proxy.log_text()
        # What is left is the body's end, read without a cut (a cut raises here).
        rest = b"".join(chunks)
    log = proxy.log_text()
    assert rest == b"", (seen[-200:], rest[:200], log)
    assert "Client disconnected" not in log, log
    assert _counts(db) == (1, 1), log


@pytest.mark.parametrize("route", [*ROUTES, "translated"])
def test_a_responses_stream_the_client_left_at_completed_is_stored(
    tmp_path: Path, route: str
) -> None:
    """The compatible endpoints' Responses state is llmitm's (emulated over a native
    Responses server, or over chat): the client leaving at the terminal event, before the
    body's end, must not cost it the next turn."""
    body = {"model": f"{route}-model", "stream": True, "input": "hello"}
    headers = {"authorization": "Bearer sk-client", **SCENARIO}
    with (
        fake_upstream(tmp_path) as fake,
        llmitm_proxy(tmp_path, config=CONFIG.format(url=fake.url)) as proxy,
    ):
        with (
            httpx.Client(timeout=30) as client,
            client.stream(
                "POST", f"{proxy.base_url()}/responses", json=body, headers=headers
            ) as answer,
        ):
            assert answer.status_code == 200
            seen = _read_to_last_event(answer.iter_raw(), b"event: response.completed")
        # The client has hung up; the upstream's body ends only in END_DELAY_MS.
        completed = seen.rsplit(b"event: response.completed", 1)[1]
        response_id = orjson.loads(completed.split(b"data: ", 1)[1].split(b"\n", 1)[0])["response"][
            "id"
        ]
        sdk = openai.OpenAI(base_url=proxy.base_url(), api_key="sk-client", max_retries=0)
        stored = sdk.responses.retrieve(response_id)
        assert stored.status == "completed"
        assert stored.output_text == "Hello from the fake upstream."
        second = sdk.responses.create(
            model=f"{route}-model", input="and again", previous_response_id=response_id
        )
        assert second.output_text == "Hello from the fake upstream."
    assert proxy.process.returncode == 0, proxy.log_text()
