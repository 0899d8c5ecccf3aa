"""Run mitmdump with llmitm's addons in this process: ``python -m llmitm.addons.entry ARGS``.

``llmitm run`` calls :func:`run_mitmdump` directly, or starts this module as a child process
when it wraps a command; either way mitmproxy is only imported here, in the shell layer.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from mitmproxy.tools.main import mitmdump


def run_mitmdump(argv: Sequence[str]) -> int:
    return mitmdump(list(argv)) or 0


if __name__ == "__main__":
    sys.exit(run_mitmdump(sys.argv[1:]))
