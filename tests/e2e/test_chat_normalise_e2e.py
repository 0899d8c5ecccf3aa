"""A chat client of a third-party chat server, through a real llmitm process: the server's
quirks are repaired by default, and relayed as they are for an endpoint the config trusts
(``conformant = ["chat"]``).

The upstream is a few lines of stdlib HTTP server that answers every create call with the
quirky bytes a test chose: a tool call whose id and name repeat in every chunk, no finish
reason; or an error object inside the 200 stream. The client is the openai SDK in its default
configuration, through its ``chat.completions.stream()`` helper.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import openai
import orjson
import pytest

from .processes import Proxy, llmitm_proxy

pytestmark = pytest.mark.slow

HEAD = {"id": "chatcmpl-q", "object": "chat.completion.chunk", "created": 1, "model": "q"}


def _frame(payload: dict) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def _call_chunk(arguments: str) -> bytes:
    call = {"index": 0, "id": "call_q", "type": "function"}
    call["function"] = {"name": "lookup", "arguments": arguments}
    return _frame({**HEAD, "choices": [{"index": 0, "delta": {"tool_calls": [call]}}]})


REPEATS = b"".join(
    [_call_chunk('{"q"'), _call_chunk(':"x"'), _call_chunk("}"), b"data: [DONE]\n\n"]
)
IN_STREAM_ERROR = b"".join(
    [
        _frame({**HEAD, "choices": [{"index": 0, "delta": {"content": "par"}}]}),
        _frame({**HEAD, "error": {"code": 502, "message": "Provider returned error"}}),
        _frame({**HEAD, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}),
        b"data: [DONE]\n\n",
    ]
)
BODIES = {"repeats": REPEATS, "error": IN_STREAM_ERROR}


class _Quirky(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        request = orjson.loads(self.rfile.read(int(self.headers["content-length"])))
        body = BODIES[request["model"].rsplit("-", 1)[-1]]
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Quirky)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}/v1"
    config = f"""
[endpoints.third-party]
kind = "compatible"
base_url = "{base}"
apis = ["chat"]

[endpoints.trusted]
kind = "compatible"
base_url = "{base}"
apis = ["chat"]
conformant = ["chat"]

[[routes]]
models = ["default-*"]
endpoints = ["third-party"]

[[routes]]
models = ["trusted-*"]
endpoints = ["trusted"]
"""
    try:
        with llmitm_proxy(Path(tmp_path_factory.mktemp("chatnorm")), config=config) as running:
            yield running
    finally:
        server.shutdown()
        thread.join(timeout=5)


def _client(proxy: Proxy) -> openai.OpenAI:
    return openai.OpenAI(api_key="sk-test", base_url=proxy.base_url(), timeout=20)


def _final_call(proxy: Proxy, model: str) -> tuple[str, str, str, str | None]:
    with _client(proxy).chat.completions.stream(
        model=model, messages=[{"role": "user", "content": "look x up"}]
    ) as stream:
        final = stream.get_final_completion()
    choice = final.choices[0]
    call = (choice.message.tool_calls or [])[0]
    return call.id, call.function.name, call.function.arguments, choice.finish_reason  # type: ignore[union-attr]


def test_a_third_party_servers_repeated_call_id_and_name_are_repaired(proxy: Proxy) -> None:
    assert _final_call(proxy, "default-repeats") == ("call_q", "lookup", '{"q":"x"}', "tool_calls")


def test_a_trusted_endpoints_stream_is_relayed_as_it_came(proxy: Proxy) -> None:
    call_id, name, arguments, finish = _final_call(proxy, "trusted-repeats")
    assert (call_id, name, arguments, finish) == (
        "call_qcall_qcall_q",
        "lookuplookuplookup",
        '{"q":"x"}',
        None,
    )


def test_an_error_inside_a_200_stream_reaches_the_sdk_as_an_error(proxy: Proxy) -> None:
    stream = _client(proxy).chat.completions.create(
        model="default-error", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    with pytest.raises(openai.APIError, match="Provider returned error"):
        for _chunk in stream:
            pass
