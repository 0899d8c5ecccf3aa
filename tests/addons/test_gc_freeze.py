"""The start-up objects leave the collector's full passes once the proxy runs (once), and
stay in them with the option off."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from mitmproxy.test import taddons

from llmitm.addons.gc_freeze import LlmGcFreeze


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # the rest of the test session collects as usual


def test_running_freezes_what_lives_then_once() -> None:
    addon = LlmGcFreeze()
    with taddons.context(addon):
        assert gc.get_freeze_count() == 0
        addon.running()
        frozen = gc.get_freeze_count()
        assert frozen > 1000
        addon.running()
        assert gc.get_freeze_count() == frozen


def test_the_option_off_freezes_nothing() -> None:
    addon = LlmGcFreeze()
    with taddons.context(addon) as tctx:
        tctx.configure(addon, llmitm_gc_freeze=False)
        addon.running()
        assert gc.get_freeze_count() == 0
