"""The start-up heap is frozen out of the cyclic collector once the proxy runs."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from llmitm.addons import collector, make_addons
from llmitm.addons.collector import LlmCollector


@pytest.fixture
def unfrozen(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    gc.unfreeze()
    monkeypatch.setattr(collector, "_frozen", False)
    yield
    gc.unfreeze()  # the test process goes on collecting what it made


def test_running_freezes_what_start_up_made(unfrozen: None) -> None:
    held = [[index] for index in range(1000)]  # tracked containers made before running
    assert gc.get_freeze_count() == 0
    LlmCollector().running()
    assert gc.get_freeze_count() >= len(held)
    # A later object is collected as before: a cycle made after the freeze is freed.
    cycle: list[object] = []
    cycle.append(cycle)
    del cycle
    assert gc.collect() >= 1


def test_a_second_proxy_in_the_same_process_freezes_nothing_more(unfrozen: None) -> None:
    LlmCollector().running()
    frozen = gc.get_freeze_count()
    later = [[index] for index in range(1000)]  # a later proxy's objects
    LlmCollector().running()
    assert gc.get_freeze_count() == frozen
    assert later


def test_it_runs_after_every_other_addon_that_starts_something_but_the_listen_file() -> None:
    names = [type(addon).__name__ for addon in make_addons()]
    assert names.index("LlmCollector") == len(names) - 2
    assert names[-1] == "ListenFile"
