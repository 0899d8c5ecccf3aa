"""A failover route's upstream connections through a real llmitm process, against local TLS
upstreams with a CA made for the test: kept alive across requests (the upstream counts its
handshakes), HTTP/2 where the upstream offers it, mitmproxy's TLS options honoured (the CA
bundle, a wrong one failing with an OpenAI-shaped error that names the TLS failure, and
``ssl_insecure``), and mitmproxy's ``upstream:`` mode honoured by the relay (a CONNECT-counting
proxy sees its tunnels)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import openai
import orjson
import pytest

from llmitm.relay.client import KEEPALIVE
from llmitm.testing.tls_upstream import TlsUpstream, make_certificates, serve_in_thread

from ..helpers.connect_proxy import ConnectProxy, connect_proxy
from .processes import Proxy, llmitm_proxy

pytestmark = pytest.mark.slow

CONFIG = """
[routing]
connect_timeout = 5
first_byte_timeout = 10

[endpoints.h1-a]
kind = "compatible"
base_url = "{h1}/v1"
apis = ["chat"]

[endpoints.h1-b]
kind = "compatible"
base_url = "{h1}/v1"
apis = ["chat"]

[endpoints.h2-a]
kind = "compatible"
base_url = "{h2}/v1"
apis = ["chat"]

[endpoints.h2-b]
kind = "compatible"
base_url = "{h2}/v1"
apis = ["chat"]

[[routes]]
models = ["h1-*"]
endpoints = ["h1-a", "h1-b"]

[[routes]]
models = ["h2-*"]
endpoints = ["h2-a", "h2-b"]
"""


def _body(model: str) -> dict:
    return {"model": model, "stream": True, "messages": [{"role": "user", "content": "hi"}]}


async def _streams(url: str, model: str, count: int, concurrent: bool, **client: object) -> list:
    """``count`` streamed chat requests (one after another, or all at once): each answer's
    status and whether its stream ended with ``[DONE]``."""

    async def one(session: httpx.AsyncClient) -> tuple[int, bool]:
        async with session.stream("POST", url, json=_body(model)) as response:
            body = await response.aread()
        return response.status_code, body.rstrip().endswith(b"data: [DONE]")

    async with httpx.AsyncClient(timeout=30, **client) as session:  # type: ignore[arg-type]
        if concurrent:
            return list(await asyncio.gather(*(one(session) for _ in range(count))))
        return [await one(session) for _ in range(count)]


def _chat_url(proxy: Proxy) -> str:
    return f"{proxy.base_url()}/chat/completions"


@pytest.fixture(scope="module")
def upstreams() -> Iterator[tuple[TlsUpstream, TlsUpstream]]:
    with serve_in_thread(http2=False) as h1, serve_in_thread(http2=True) as h2:
        yield h1, h2


def _config(h1: TlsUpstream, h2: TlsUpstream) -> str:
    return CONFIG.format(h1=h1.base_url, h2=h2.base_url)


@pytest.fixture(scope="module")
def trusting(
    tmp_path_factory: pytest.TempPathFactory, upstreams: tuple[TlsUpstream, TlsUpstream]
) -> Iterator[Proxy]:
    """llmitm trusting the upstreams' CA through ``ssl_verify_upstream_trusted_ca``."""
    h1, h2 = upstreams
    tmp = tmp_path_factory.mktemp("relay-pool")
    # One bundle with both upstreams' CAs (each made its own).
    bundle = tmp / "cas.pem"
    bundle.write_bytes(Path(h1.ca_file).read_bytes() + Path(h2.ca_file).read_bytes())
    extra = ["--set", f"ssl_verify_upstream_trusted_ca={bundle}", "--set", "llmitm_record=off"]
    with llmitm_proxy(tmp, config=_config(h1, h2), extra=extra) as proxy:
        yield proxy


def test_http1_upstream_connections_are_kept_alive(
    trusting: Proxy, upstreams: tuple[TlsUpstream, TlsUpstream]
) -> None:
    h1, _ = upstreams
    before = h1.stats()
    results = asyncio.run(_streams(_chat_url(trusting), "h1-m", 12, concurrent=False))
    assert results == [(200, True)] * 12
    concurrent = asyncio.run(_streams(_chat_url(trusting), "h1-m", 6, concurrent=True))
    assert concurrent == [(200, True)] * 6
    after = h1.stats()
    assert after["requests"] - before["requests"] == 18
    # One connection carried the 12 requests in turn; 6 at once need at most 6.
    handshakes = after["handshakes"] - before["handshakes"]
    assert 1 <= handshakes <= 6 <= KEEPALIVE, after
    assert set(after["protocols"]) == {"http/1.1"}


def test_http2_is_spoken_where_the_upstream_offers_it(
    trusting: Proxy, upstreams: tuple[TlsUpstream, TlsUpstream]
) -> None:
    _, h2 = upstreams
    before = h2.stats()
    results = asyncio.run(_streams(_chat_url(trusting), "h2-m", 8, concurrent=False))
    results += asyncio.run(_streams(_chat_url(trusting), "h2-m", 8, concurrent=True))
    assert results == [(200, True)] * 16
    after = h2.stats()
    assert after["requests"] - before["requests"] == 16
    assert after["handshakes"] - before["handshakes"] <= 1  # 16 streams, one connection
    assert after["protocols"] == {"h2": 1}


def test_a_wrong_ca_fails_with_an_openai_error_naming_the_tls_failure(
    tmp_path: Path, upstreams: tuple[TlsUpstream, TlsUpstream]
) -> None:
    h1, h2 = upstreams
    other_ca, _ = make_certificates(tmp_path, name="another")
    extra = ["--set", f"ssl_verify_upstream_trusted_ca={other_ca}", "--set", "llmitm_record=off"]
    with llmitm_proxy(tmp_path / "llmitm", config=_config(h1, h2), extra=extra) as proxy:
        response = httpx.post(_chat_url(proxy), json=_body("h1-m"), timeout=30)
    assert response.status_code >= 500, response.text
    error = orjson.loads(response.content)["error"]
    assert {"message", "type", "code"} <= set(error)
    # Each attempt in the error's list says why it failed.
    assert [a["outcome"] for a in error["attempts"]] == ["connect_error", "connect_error"]
    assert all("CERTIFICATE_VERIFY_FAILED" in a["message"] for a in error["attempts"]), error


def test_ssl_insecure_and_the_upstream_proxy_mode_are_honoured(
    tmp_path: Path, upstreams: tuple[TlsUpstream, TlsUpstream]
) -> None:
    """No CA for the upstreams, ``ssl_insecure`` on, and ``--mode upstream:`` a proxy that
    counts its CONNECTs: the relay's requests go through it, over one kept-alive tunnel."""
    h1, h2 = upstreams
    with connect_proxy() as tunnel:
        extra = ["--set", "ssl_insecure=true", "--set", "llmitm_record=off"]
        extra += ["--set", "listen_host=127.0.0.1"]
        modes = (f"upstream:http://127.0.0.1:{tunnel.port}",)
        before = h1.stats()["handshakes"]
        with llmitm_proxy(tmp_path, config=_config(h1, h2), modes=modes, extra=extra) as proxy:
            # A plain-HTTP request through llmitm as a proxy; the route picks the endpoint.
            via = f"http://127.0.0.1:{proxy.port('upstream')}"
            url = "http://127.0.0.1:9/v1/chat/completions"
            results = asyncio.run(_streams(url, "h1-m", 5, concurrent=False, proxy=via))
        assert results == [(200, True)] * 5
        _tunnels_went_to(tunnel, h1, count=1)
        assert h1.stats()["handshakes"] - before == 1


def _tunnels_went_to(tunnel: ConnectProxy, upstream: TlsUpstream, count: int) -> None:
    assert tunnel.tunnels == [f"127.0.0.1:{upstream.port}"] * count, tunnel.tunnels
    assert tunnel.refused == 0


def _relay_stats(proxy: Proxy) -> dict:
    base = f"http://127.0.0.1:{proxy.port()}"
    return httpx.get(f"{base}/_llmitm/status", timeout=10).json()["relay"]


def test_a_kept_alive_client_reuses_one_relay_connection(
    trusting: Proxy, upstreams: tuple[TlsUpstream, TlsUpstream]
) -> None:
    """A client that keeps its connection to the proxy alive has mitmproxy keep its own to the
    relay: N requests on a failover route open one relay connection, not N (each one a
    loopback connect and a run of mitmproxy's connection hooks added to time to first byte).

    The official SDK's plain calls, and streams read to their end. (The SDK itself drops its
    connection after a stream: it stops reading at ``[DONE]``, before the body's end, on any
    path through the proxy.)"""
    h1, _ = upstreams
    before, requests = _relay_stats(trusting), h1.stats()["requests"]
    with openai.OpenAI(base_url=trusting.base_url(), api_key="sk-test", max_retries=0) as client:
        for _ in range(6):
            answer = client.chat.completions.create(**{**_body("h1-m"), "stream": False})
            assert answer.choices[0].message.content
    sdk = _relay_stats(trusting)
    streams = asyncio.run(_streams(_chat_url(trusting), "h1-m", 6, concurrent=False))
    assert streams == [(200, True)] * 6
    after = _relay_stats(trusting)
    assert h1.stats()["requests"] - requests == 12  # each went through the failover route
    assert sdk["accepted"] - before["accepted"] == 1, (before, sdk)
    assert after["accepted"] - sdk["accepted"] == 1, (sdk, after)
    assert after["registered"] == after["connections"] == 0


def test_an_http2_clients_relay_connections_close_after_their_answer(
    trusting: Proxy, upstreams: tuple[TlsUpstream, TlsUpstream]
) -> None:
    """mitmproxy uses an HTTP/1.1 server connection for one request of an HTTP/2 client (its
    streams could not share it), so each relayed flow of such a client opens a relay
    connection of its own: each is closed after its answer, none is left idle in the relay."""
    before = _relay_stats(trusting)
    url = f"https://127.0.0.1:{trusting.port()}/v1/chat/completions"
    streams = asyncio.run(_streams(url, "h1-m", 4, concurrent=False, http2=True, verify=False))
    assert streams == [(200, True)] * 4
    for _ in range(50):
        after = _relay_stats(trusting)
        if after["kept"] == before["kept"]:
            break
        time.sleep(0.02)
    assert after["accepted"] - before["accepted"] == 4, (before, after)
    assert after["kept"] == before["kept"], (before, after)
