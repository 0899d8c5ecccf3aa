"""Run mitmdump with llmitm's addons in this process: ``python -m llmitm.addons.hosts.entry ARGS``.

``llmitm run`` calls :func:`run_mitmdump` directly, or starts this module as a child process
when it wraps a command; either way mitmproxy is only imported here, in the shell layer.

The addons are part of the master from the start, where mitmdump's ``-s`` script loader would
put them (after ``proxyserver``, before ``mapremote``, ``save`` and the rest), rather than
loaded as a script: mitmproxy defers ``--set`` values of options a script registers and, when
one is refused (``--set llmitm_record=bogus``, or the same option twice), logs nothing useful
and keeps running with the default — or hangs. Registered first, every ``--set llmitm_…`` is
checked with mitmproxy's own options and refused in one line before anything listens.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Sequence
from typing import Any

from mitmproxy import addons, master, options
from mitmproxy.addons import dumper, errorcheck, keepserving, readfile
from mitmproxy.tools import cmdline, dump
from mitmproxy.tools.main import run

from llmitm.addons import make_addons
from llmitm.addons.patches.master import with_llmitm


class LlmitmDump(dump.DumpMaster):
    """mitmdump's master with llmitm's addons in the script loader's place."""

    def __init__(
        self,
        opts: options.Options,
        loop: Any = None,
        with_termlog: bool = True,
        with_dumper: bool = True,
    ) -> None:
        # Not DumpMaster.__init__, which adds the default chain without llmitm: its base
        # builds the master, and the lines below are DumpMaster's own with llmitm placed.
        master.Master.__init__(self, opts, event_loop=loop, with_termlog=with_termlog)
        self.addons.add(*with_llmitm(addons.default_addons(), make_addons()))
        if with_dumper:
            self.addons.add(dumper.Dumper())
        self.addons.add(
            keepserving.KeepServing(), readfile.ReadFileStdin(), errorcheck.ErrorCheck()
        )


def _filters(args: Any) -> dict[str, str]:
    """mitmdump's own handling of trailing filter expressions."""
    if not args.filter_args:
        return {}
    expression = " ".join(args.filter_args)
    return {
        "save_stream_filter": expression,
        "readfile_filter": expression,
        "dumper_filter": expression,
    }


def run_mitmdump(argv: Sequence[str]) -> int:
    run(LlmitmDump, cmdline.mitmdump, list(argv), _filters)
    return 0


def mitmdump_help() -> int:
    """mitmdump's own ``--help``, with exit status 0 (mitmproxy's runner turns argparse's
    exit after the help into 1)."""
    with contextlib.suppress(SystemExit):
        run(LlmitmDump, cmdline.mitmdump, ["--help"], _filters)
    return 0


if __name__ == "__main__":
    sys.exit(run_mitmdump(sys.argv[1:]))
