"""Models, health and metrics through a real ``llmitm run`` and the fake upstream: the
openai SDK lists and retrieves the models the configuration serves, a model no route takes
is refused with OpenAI's 404 under ``unmatched = "reject"`` (and never reaches the upstream),
``healthz``/``readyz`` answer, and a Prometheus scrape after real calls — chat and Responses,
streamed and not — counts exactly the tokens the upstream reported to the client."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .processes import Proxy, Upstream, fake_upstream, llmitm_proxy

pytestmark = pytest.mark.slow

CONFIG = """
[llmitm]
unmatched = "reject"

[endpoints.fake]
kind = "compatible"
base_url = "{fake}/v1"
apis = ["chat", "responses"]

[[routes]]
name = "aliased"
models = ["gpt-4o"]
endpoints = ["fake"]
model = "small"

[[routes]]
name = "locals"
models = ["local-*", "small"]
endpoints = ["fake"]
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proxy, Upstream]]:
    tmp: Path = tmp_path_factory.mktemp("observability")
    with (
        fake_upstream(tmp) as fake,
        llmitm_proxy(tmp, config=CONFIG.format(fake=fake.url)) as proxy,
    ):
        yield proxy, fake


@pytest.fixture
def client(stack: tuple[Proxy, Upstream]) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack[0].base_url(), api_key="sk-client", max_retries=0)


def own(proxy: Proxy, path: str) -> httpx.Response:
    return httpx.get(f"http://127.0.0.1:{proxy.port()}{path}", timeout=10)


def test_the_sdk_lists_and_retrieves_the_models_the_routes_serve(client: openai.OpenAI) -> None:
    models = list(client.models.list())
    # Exact route patterns and the alias a route sends; the glob local-* lists nothing.
    assert [m.id for m in models] == ["gpt-4o", "small"]
    assert {m.object for m in models} == {"model"} and {m.owned_by for m in models} == {"fake"}
    assert client.models.retrieve("gpt-4o").model_extra["llmitm"]["upstream_model"] == "small"
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("gpt-5")
    assert caught.value.code == "model_not_found" and "local-*" in caught.value.message


def test_a_model_no_route_takes_is_refused_and_never_sent(
    client: openai.OpenAI, stack: tuple[Proxy, Upstream]
) -> None:
    fake = stack[1]
    before = len(httpx.get(f"{fake.url}/_requests", timeout=10).json())
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="gpt-5", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.code == "model_not_found"
    assert "gpt-5" in caught.value.message and "gpt-4o, local-*, small" in caught.value.message
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="gpt-5", input="hi")
    assert len(httpx.get(f"{fake.url}/_requests", timeout=10).json()) == before
    # A routed model still goes through.
    answer = client.chat.completions.create(
        model="local-a", messages=[{"role": "user", "content": "hi"}]
    )
    assert answer.choices[0].message.content


def test_healthz_and_readyz(stack: tuple[Proxy, Upstream]) -> None:
    proxy = stack[0]
    health = own(proxy, "/_llmitm/healthz")
    assert (health.status_code, health.json()) == (200, {"status": "ok"})
    ready = own(proxy, "/_llmitm/readyz")
    assert ready.status_code == 200, ready.text
    checks = ready.json()["checks"]
    assert set(checks) == {"config", "store", "relay", "listening"}
    assert all(check["ok"] for check in checks.values())
    assert checks["config"]["detail"].endswith("llmitm.toml")


def test_a_scrape_counts_the_tokens_the_upstream_reported(client: openai.OpenAI) -> None:
    model = "local-metrics"
    messages: list = [{"role": "user", "content": "Say hello."}]
    reported: dict[tuple[str, str], int] = defaultdict(int)

    def add(api: str, prompt: int, completion: int) -> None:
        reported[api, "input"] += prompt
        reported[api, "output"] += completion

    chat = client.chat.completions.create(model=model, messages=messages)
    assert chat.usage is not None
    add("chat", chat.usage.prompt_tokens, chat.usage.completion_tokens)
    stream = client.chat.completions.create(
        model=model, messages=messages, stream=True, stream_options={"include_usage": True}
    )
    usage = [chunk.usage for chunk in stream if chunk.usage is not None]
    add("chat", usage[-1].prompt_tokens, usage[-1].completion_tokens)
    response = client.responses.create(model=model, input="Say hello.")
    assert response.usage is not None
    add("responses", response.usage.input_tokens, response.usage.output_tokens)
    with client.responses.stream(model=model, input="Say hello.") as events:
        final = events.get_final_response()
    assert final.usage is not None
    add("responses", final.usage.input_tokens, final.usage.output_tokens)

    scrape = own_text(client)
    families = {f.name: f for f in text_string_to_metric_families(scrape)}
    measured: dict[tuple[str, str], float] = defaultdict(float)
    for sample in families["gen_ai_client_token_usage"].samples:
        labels = sample.labels
        if sample.name.endswith("_sum") and labels["gen_ai_request_model"] == model:
            assert labels["llmitm_endpoint"] == "fake"
            assert labels["gen_ai_operation_name"] == "chat"
            assert labels["gen_ai_provider_name"] == "compatible"
            measured[labels["openai_api_type"], labels["gen_ai_token_type"]] += sample.value
    assert measured == reported and all(reported.values())

    def count(family: str, **want: str) -> float:
        return sum(
            s.value
            for s in families[family].samples
            if s.name.endswith("_count")
            and s.labels.get("gen_ai_request_model") == model
            and all(s.labels.get(k) == v for k, v in want.items())
        )

    assert count("gen_ai_client_operation_duration_seconds", error_type="") == 4
    assert count("gen_ai_client_operation_time_to_first_chunk_seconds", openai_api_type="chat") == 1
    assert count("gen_ai_client_operation_time_to_first_chunk_seconds") == 2
    calls: dict[tuple[str, str], float] = defaultdict(float)
    for s in families["llmitm_calls"].samples:
        if s.name == "llmitm_calls_total":
            calls[s.labels["gen_ai_request_model"], s.labels["error_type"]] += s.value
    assert calls[model, ""] == 4
    # The two calls the reject test refused (it runs first) count as llmitm's own 404s.
    assert calls["gpt-5", "404"] == 2
    healthy = families["llmitm_endpoint_healthy"].samples
    assert [(s.labels["llmitm_endpoint"], s.value) for s in healthy] == [("fake", 1.0)]
    assert families["llmitm_replay_misses"].samples[0].value == 0


def own_text(client: openai.OpenAI) -> str:
    base = str(client.base_url).removesuffix("/").removesuffix("/v1")
    response = httpx.get(f"{base}/_llmitm/metrics", timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")
    return response.text


def test_a_replay_still_answers_an_unmatched_model_it_recorded(tmp_path: Path) -> None:
    """Recorded while unmatched models passed to the reverse target; replayed under
    ``unmatched = "reject"``: the recording answers, and the upstream hears nothing."""
    db = f"llmitm_store={tmp_path / 'calls.db'}"
    messages: list = [{"role": "user", "content": "Say hello."}]
    with fake_upstream(tmp_path) as fake:
        config = CONFIG.format(fake=fake.url)
        passing = config.replace('unmatched = "reject"', 'unmatched = "pass"')
        modes = [f"reverse:{fake.url}"]
        with llmitm_proxy(tmp_path / "rec", config=passing, modes=modes, extra=["--set", db]) as p:
            sdk = openai.OpenAI(base_url=p.base_url(), api_key="sk-client", max_retries=0)
            recorded = sdk.chat.completions.create(model="unrouted", messages=messages)
        sent = len(httpx.get(f"{fake.url}/_requests", timeout=10).json())
        replay = ["--set", db, "--set", "llmitm_record=replay"]
        with llmitm_proxy(tmp_path / "rep", config=config, modes=modes, extra=replay) as p:
            sdk = openai.OpenAI(base_url=p.base_url(), api_key="sk-client", max_retries=0)
            replayed = sdk.chat.completions.create(model="unrouted", messages=messages)
            # What no recording answers is the recorder's miss (replay never dials), not a 404.
            with pytest.raises(openai.BadRequestError, match="replay miss"):
                sdk.chat.completions.create(model="unrouted", messages=[*messages, *messages])
        assert len(httpx.get(f"{fake.url}/_requests", timeout=10).json()) == sent
    assert replayed.choices[0].message.content == recorded.choices[0].message.content
