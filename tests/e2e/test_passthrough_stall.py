"""An LLM call's stream that no route matched (relayed as it is) is bounded by the global
``stream_idle_timeout`` too: through a real llmitm process in front of a fake upstream that
stops sending mid-stream (``stall_after``), the client's stream ends in bounded time with a
terminal error in its protocol (raw client and the openai SDK), the events before the stall
arrive byte for byte, and the proxy serves the next request.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx2 as httpx
import openai
import orjson
import pytest

from .processes import Proxy, fake_upstream, llmitm_proxy

pytestmark = pytest.mark.slow

IDLE_S = 1.0
STALL = {"x-fake-scenario": "text;stall_after=2"}


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proxy, str]]:
    tmp = tmp_path_factory.mktemp("passthrough-stall")
    idle = ["--set", f"llmitm_stream_idle_timeout={IDLE_S:g}"]
    with (
        fake_upstream(tmp) as fake,
        llmitm_proxy(tmp, modes=[f"reverse:{fake.url}"], extra=idle) as running,
    ):
        yield running, fake.url


def request_for(api: str, stream: bool = True) -> tuple[str, dict]:
    if api == "chat":
        body = {"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}]}
        return "/v1/chat/completions", {**body, "stream": stream}
    return "/v1/responses", {"model": "gpt-5", "input": "hi", "stream": stream}


def frames(text: str) -> list[str]:
    return [block for block in text.split("\n\n") if block.strip()]


def data_of(frame: str) -> str:
    return "\n".join(line[5:].strip() for line in frame.splitlines() if line.startswith("data:"))


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_a_stalled_unrouted_stream_ends_in_the_clients_protocol(
    proxy: tuple[Proxy, str], api: str
) -> None:
    running, _upstream = proxy
    path, body = request_for(api)
    with httpx.Client(base_url=f"http://127.0.0.1:{running.port()}", timeout=30) as client:
        started = time.monotonic()
        answer = client.post(path, json=body, headers=STALL)
        took = time.monotonic() - started
        assert answer.status_code == 200
        assert IDLE_S <= took < IDLE_S + 3, took
        assert "x-llmitm-endpoint" not in answer.headers  # no route took it
        got = frames(answer.text)
    if api == "chat":
        assert data_of(got[-1]) == "[DONE]"
        error = orjson.loads(data_of(got[-2]))["error"]
        assert error["type"] == "server_error" and error["message"]
        relayed = got[:-2]
    else:
        names = [frame.splitlines()[0].removeprefix("event:").strip() for frame in got[-2:]]
        assert names == ["error", "response.failed"]
        assert orjson.loads(data_of(got[-1]))["response"]["status"] == "failed"
        relayed = got[:-2]
    # The two events the upstream sent before it went silent, as it sent them.
    assert len(relayed) == 2
    first = orjson.loads(data_of(relayed[0]))
    assert first.get("object") == "chat.completion.chunk" or first["type"] == "response.created"
    with httpx.Client(base_url=f"http://127.0.0.1:{running.port()}", timeout=30) as client:
        path, body = request_for(api, stream=False)
        assert client.post(path, json=body, headers={"x-fake-scenario": "text"}).status_code == 200


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_the_sdk_reads_the_stall_as_an_api_error(proxy: tuple[Proxy, str], api: str) -> None:
    running, _upstream = proxy
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{running.port()}/v1", api_key="sk-x")
    started = time.monotonic()
    with pytest.raises(openai.APIError) as info:
        if api == "chat":
            messages = [{"role": "user", "content": "hi"}]
            for _ in client.chat.completions.create(
                model="gpt-5", messages=messages, stream=True, extra_headers=STALL
            ):
                pass
        else:
            for _ in client.responses.create(
                model="gpt-5", input="hi", stream=True, extra_headers=STALL
            ):
                pass
    # The API's error event, not a transport error (APIConnectionError, APITimeoutError).
    assert type(info.value) is openai.APIError
    assert time.monotonic() - started < IDLE_S + 3
