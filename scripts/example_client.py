"""The app behind ``recordings/``: a few calls through llmitm with the openai SDK.

Run by ``scripts/record_examples.py`` (recording against the fake upstream) and by the replay
tests (against the recordings, with no upstream at all). Writes each answer's raw body, in
call order, to the JSON file named by ``--out``; exits non-zero if a call fails.

    OPENAI_BASE_URL=http://127.0.0.1:PORT/v1 python scripts/example_client.py --out FILE
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import openai
import orjson

MESSAGES = [{"role": "user", "content": "Say hello."}]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    client = openai.OpenAI(api_key="sk-example-" + "0" * 24, max_retries=0)
    bodies: list[str] = []

    def keep(raw) -> None:  # a raw response: its body as the client got it
        bodies.append(raw.http_response.read().decode())

    try:
        # plain chat, passthrough (scope "chat")
        scope = {"x-llmitm-scope": "examples/chat"}
        keep(client.chat.completions.with_raw_response.create(
            model="gpt-4.1-mini", messages=MESSAGES, extra_headers=scope))  # fmt: skip
        keep(client.chat.completions.with_raw_response.create(
            model="gpt-4.1-mini", messages=MESSAGES, stream=True, extra_headers=scope))  # fmt: skip
        # a Responses client over a chat-only backend, with a tool call (scope "tools")
        scope = {"x-llmitm-scope": "examples/tools"}
        tool = {
            "type": "function",
            "name": "lookup",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        }
        keep(client.responses.with_raw_response.create(
            model="over-chat-mini", input="Look up llmitm.", tools=[tool], stream=True,
            extra_headers=scope))  # fmt: skip
        # a chat client over a Responses-only backend, with reasoning (scope "reasoning")
        scope = {"x-llmitm-scope": "examples/reasoning", "x-fake-scenario": "reasoning"}
        keep(client.chat.completions.with_raw_response.create(
            model="over-responses-mini", messages=MESSAGES, stream=True,
            extra_headers=scope))  # fmt: skip
    except openai.APIError as exc:
        print(f"example_client: {exc}", file=sys.stderr)
        return 1
    finally:
        Path(args.out).write_bytes(orjson.dumps(bodies))
    return 0


if __name__ == "__main__":
    sys.exit(main())
