"""``llmitm translate``: the console script end to end, and its exit codes on bad input."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from llmitm.cli import main
from tests.helpers.oracle import sdk_chat_stream, sdk_responses_stream

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "azure-responses-stream.sse"


def run_cli(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    """The installed console script, as a user runs it."""
    script = Path(sys.executable).with_name("llmitm")
    return subprocess.run(
        [str(script), *args], input=stdin, capture_output=True, timeout=60, check=False
    )


def test_demo_example_translates_to_chat_chunks_the_sdk_accepts() -> None:
    """The README's first command: the Azure-style example stream becomes chat chunks."""
    result = run_cli("translate", "--to", "chat", str(EXAMPLE))
    assert result.returncode == 0, result.stderr
    final, _chunks = sdk_chat_stream(result.stdout)
    message = final.choices[0].message
    assert message.content is not None
    assert message.content.startswith("<think>\n**Checking the weather request**")
    assert message.content.endswith("</think>\n\nLet me check both cities for you.")
    calls = [
        (c.id, c.function.name, orjson.loads(c.function.arguments)) for c in message.tool_calls
    ]
    assert calls == [
        ("call_Qm3xT8vLw2NcRf6YbHj9KpDs", "get_weather", {"city": "Copenhagen"}),
        ("call_Zr5nW1qAe7VuLc4GxTy2MoBf", "get_weather", {"city": "Oslo"}),
    ]
    assert final.choices[0].finish_reason == "tool_calls"
    assert final.usage is not None
    assert (final.usage.prompt_tokens, final.usage.completion_tokens) == (212, 96)
    assert final.usage.prompt_tokens_details.cached_tokens == 128
    assert final.usage.completion_tokens_details.reasoning_tokens == 64
    assert result.stdout.endswith(b"data: [DONE]\n\n")


@pytest.mark.parametrize("mode", ["reasoning_content", "reasoning", "drop"])
def test_reasoning_mode_flag_keeps_reasoning_out_of_content(mode: str) -> None:
    result = run_cli("translate", "--to", "chat", "--reasoning", mode, str(EXAMPLE))
    assert result.returncode == 0, result.stderr
    assert b"<think>" not in result.stdout
    assert (b'"reasoning_content"' in result.stdout) == (mode == "reasoning_content")


def test_stdin_and_round_trip_back_to_responses() -> None:
    """chat stream from stdin → Responses stream the SDK's ResponseStreamState accepts."""
    chat = run_cli("translate", "--to", "chat", "--reasoning", "reasoning_content", str(EXAMPLE))
    back = run_cli("translate", "--to", "responses", "--fixed-ids", "-", stdin=chat.stdout)
    assert back.returncode == 0, back.stderr
    _events, response = sdk_responses_stream(back.stdout)
    assert response is not None
    assert [item.type for item in response.output] == [
        "reasoning",
        "message",
        "function_call",
        "function_call",
    ]
    assert response.output_text == "Let me check both cities for you."
    assert response.usage is not None and response.usage.output_tokens == 96


def test_fixed_ids_make_output_reproducible() -> None:
    chat = run_cli("translate", "--to", "chat", str(EXAMPLE)).stdout
    first = run_cli("translate", "--to", "responses", "--fixed-ids", "-", stdin=chat)
    second = run_cli("translate", "--to", "responses", "--fixed-ids", "-", stdin=chat)
    assert first.stdout == second.stdout
    assert b"resp_0001" in first.stdout


def test_request_bodies_translate_both_ways() -> None:
    chat_request = {
        "model": "gpt-5",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
        ],
        "max_completion_tokens": 50,
        "stream": True,
    }
    result = run_cli("translate", "--to", "responses", "-", stdin=orjson.dumps(chat_request))
    assert result.returncode == 0, result.stderr
    responses_request = orjson.loads(result.stdout)
    assert responses_request["instructions"] == "Be brief."
    assert responses_request["max_output_tokens"] == 50
    back = run_cli("translate", "--to", "chat", "-", stdin=result.stdout)
    assert back.returncode == 0, back.stderr
    chat_again = orjson.loads(back.stdout)
    assert chat_again["messages"][0] == {"role": "system", "content": "Be brief."}
    assert chat_again["messages"][1]["role"] == "user"
    assert chat_again["stream_options"] == {"include_usage": True}


def test_non_streamed_body_is_detected_and_translated() -> None:
    completion = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
    result = run_cli("translate", "--to", "responses", "-", stdin=orjson.dumps(completion))
    assert result.returncode == 0, result.stderr
    response = orjson.loads(result.stdout)
    assert response["object"] == "response"
    assert response["status"] == "completed"
    assert response["usage"]["input_tokens"] == 3


@pytest.mark.parametrize(
    ("stdin", "reason"),
    [
        (b"", "empty"),
        (b"{not json", "not valid JSON"),
        (b"hello world\n", "neither JSON nor a server-sent event stream"),
        (b'{"foo": 1}', "neither a request"),
        (b'{"model": "m", "messages": [], "n": 3}', "n"),
    ],
)
def test_unreadable_input_exits_2_with_one_line(stdin: bytes, reason: str) -> None:
    result = run_cli("translate", "--to", "responses", "-", stdin=stdin)
    assert result.returncode == 2
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("llmitm translate: cannot translate: ")
    assert reason in lines[0]
    assert result.stdout == b""


def test_already_in_target_api_is_refused() -> None:
    result = run_cli("translate", "--to", "chat", "-", stdin=b'{"model":"m","messages":[]}')
    assert result.returncode == 2
    assert b"already a chat request" in result.stderr


def test_missing_file_exits_2(tmp_path: Path) -> None:
    assert main(["translate", "--to", "chat", str(tmp_path / "nope.sse")]) == 2


def test_the_example_configuration_is_valid() -> None:
    from llmitm.routing.config import load_config

    config = load_config(ROOT / "examples" / "llmitm.toml", environ={})
    assert set(config.endpoints) == {"ollama", "llamacpp"}
    assert config.endpoints["llamacpp"].normalises("responses")  # compatible: by default


def test_rec_show_timeline_draws_the_committed_recordings_stream() -> None:
    folder = str(ROOT / "recordings")
    rows = orjson.loads(run_cli("rec", "ls", "--folder", folder, "--json").stdout)
    streamed = next(row["id"] for row in rows if row["plan"] == "chat→responses")
    shown = run_cli("rec", "show", streamed, "--folder", folder, "--timeline")
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout.decode()
    assert "TTFT" in text and "first token" in text and "content" in text
    assert "response.output_text.delta" in text or "chat.completion.chunk" in text


def test_python_m_llmitm_cli_is_the_same_command_line() -> None:
    """``python -m llmitm.cli`` keeps working now that the command line is a package."""
    import llmitm

    via_module = subprocess.run(
        [sys.executable, "-m", "llmitm.cli", "--version"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert via_module.returncode == 0, via_module.stderr
    assert (
        via_module.stdout
        == run_cli("--version").stdout
        == f"llmitm {llmitm.__version__}\n".encode()
    )
