"""``llmitm run`` is quiet by default: the mitmdump arguments it builds hide mitmproxy's
connection and flow lines, ``-v`` brings mitmdump's default log back and ``-vv`` its debug log,
and an option the user sets wins. Checked by mitmdump's own command-line handling (its parser
and the step that applies ``-q``/``-v``) over the options llmitm's addons register."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from mitmproxy import options
from mitmproxy.addons import default_addons, dumper, termlog
from mitmproxy.test import taddons
from mitmproxy.tools import cmdline
from mitmproxy.tools.main import process_options

from llmitm.addons import make_addons
from llmitm.addons.quiet import MITMPROXY_LOGGER, LlmQuiet
from llmitm.cli.run_args import mitmdump_argv, parse_run_args


def as_mitmdump_reads(run_argv: list[str]) -> options.Options:
    """The options mitmdump ends up with for ``llmitm run RUN_ARGV``'s arguments."""
    with taddons.context() as tctx:
        # mitmdump's own addons (taddons holds a few already), which register its options.
        present = {type(addon) for addon in tctx.master.addons.chain}
        mitmdump = [a for a in default_addons() if type(a) not in present]
        tctx.master.addons.add(*mitmdump, dumper.Dumper(), termlog.TermLog(), *make_addons())
        opts = tctx.options
        parser = cmdline.mitmdump(opts)
        args = parser.parse_args(mitmdump_argv(parse_run_args(run_argv)))
        opts.set(*args.setoptions)
        process_options(parser, opts, args)
        return opts


@pytest.fixture(autouse=True)
def mitmproxy_logger_restored() -> Iterator[None]:
    logger = logging.getLogger(MITMPROXY_LOGGER)
    level = logger.level
    yield
    logger.setLevel(level)


@pytest.mark.parametrize("command", [[], ["--", "true"]])
def test_by_default_mitmproxys_connection_and_flow_lines_are_hidden(command: list[str]) -> None:
    opts = as_mitmdump_reads(command)
    assert opts.llmitm_quiet is True
    assert opts.flow_detail == 0
    assert opts.termlog_verbosity == "info"  # llmitm's own info lines stay
    assert opts.llmitm_wrapped is bool(command)


def test_verbose_keeps_mitmdumps_default_log() -> None:
    for flag in ("-v", "--verbose"):
        opts = as_mitmdump_reads([flag])
        assert opts.llmitm_quiet is False
        assert opts.flow_detail == 1
        assert opts.termlog_verbosity == "info"


def test_very_verbose_is_mitmdumps_own_verbose() -> None:
    for argv in (["-vv"], ["-v", "-v"]):
        opts = as_mitmdump_reads(argv)
        assert opts.termlog_verbosity == "debug"
        assert opts.flow_detail == 2


@pytest.mark.parametrize(
    "user", [["--flow-detail", "3"], ["--set", "flow_detail=3"], ["--set=flow_detail=3"]]
)
def test_a_flow_detail_the_user_sets_wins(user: list[str]) -> None:
    argv = mitmdump_argv(parse_run_args(user))
    assert argv.count("flow_detail=0") == 0
    assert as_mitmdump_reads(user).flow_detail == 3


def test_mitmdumps_quiet_still_quietens_everything() -> None:
    opts = as_mitmdump_reads(["-q"])
    assert opts.termlog_verbosity == "error"
    assert opts.flow_detail == 0


@pytest.fixture
def root_at_debug() -> Iterator[None]:
    """The root logger at debug level, as mitmdump sets it."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.DEBUG)
    yield
    root.setLevel(level)


@pytest.mark.usefixtures("root_at_debug")
def test_llmitm_quiet_raises_the_mitmproxy_loggers_level_only() -> None:
    quiet = LlmQuiet()
    with taddons.context(quiet) as tctx:
        tctx.configure(quiet, llmitm_quiet=True)
        assert not logging.getLogger("mitmproxy.proxy.server").isEnabledFor(logging.INFO)
        assert logging.getLogger("mitmproxy.proxy.server").isEnabledFor(logging.WARNING)
        assert logging.getLogger("llmitm.addons.egress").isEnabledFor(logging.INFO)
        tctx.configure(quiet, llmitm_quiet=False)
        assert logging.getLogger("mitmproxy.proxy.server").isEnabledFor(logging.INFO)
