"""Re-record ``recordings/`` — the committed examples — against the deterministic fake upstream.

    python scripts/record_examples.py [--folder recordings]

Starts the fake upstream (chat-only and Responses-only endpoints on fixed loopback ports, so
re-recording changes as little as possible), then ``llmitm run --rewrite … --record FOLDER
-- python scripts/example_client.py``. The replay tests serve the folder with no upstream.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LLMITM = Path(sys.executable).with_name("llmitm")
CHAT_PORT, RESPONSES_PORT = 48151, 48152
CONFIG = """
[endpoints.chat-only]
kind = "compatible"
base_url = "http://127.0.0.1:{chat}/v1"
apis = ["chat"]

[endpoints.responses-only]
kind = "openai"
base_url = "http://127.0.0.1:{responses}/v1"
apis = ["responses"]

[[routes]]
models = ["over-chat*", "gpt-*"]
endpoints = ["chat-only"]

[[routes]]
models = ["over-responses*"]
endpoints = ["responses-only"]
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", default=str(ROOT / "recordings"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="llmitm-examples-") as scratch:
        tmp = Path(scratch)
        fake = [sys.executable, "-m", "llmitm.testing.fake_upstream"]
        fakes = [
            subprocess.Popen(
                [*fake, "--port", str(port), "--apis", apis], stdout=subprocess.DEVNULL
            )
            for port, apis in ((CHAT_PORT, "chat"), (RESPONSES_PORT, "responses"))
        ]
        try:
            time.sleep(1.0)
            config = tmp / "llmitm.toml"
            config.write_text(CONFIG.format(chat=CHAT_PORT, responses=RESPONSES_PORT))
            return subprocess.run(
                [str(LLMITM), "run", "--config", str(config), "--record", args.folder,
                 "--base-url",
                 "--set", "llmitm_record=rewrite", "--set", "llmitm_store=",
                 "--set", f"confdir={tmp / 'conf'}", "--set", "termlog_verbosity=warn",
                 "--", sys.executable, str(ROOT / "scripts" / "example_client.py"),
                 "--out", str(tmp / "bodies.json")],
                check=False,
            ).returncode  # fmt: skip
        finally:
            for fake in fakes:
                fake.terminate()
                fake.wait()


if __name__ == "__main__":
    sys.exit(main())
