"""The units of work tests/conftest.py hands to pytest-xdist workers: the modules that use
llama.cpp's server are the ones it lists (one more would start a second server on another
worker, competing for the two cores), and every module named there exists."""

from __future__ import annotations

import pytest

from tests.conftest import LLAMA_FIXTURE, LLAMA_MODULES, LLAMA_UNIT, ROOT, SHARDS, work_unit


def test_every_module_using_llama_server_is_in_the_llama_unit(
    request: pytest.FixtureRequest,
) -> None:
    # The tests collected with this one: under xdist every worker collects the whole suite.
    using = {
        item.nodeid.split("::", 1)[0]
        for item in request.session.items
        if LLAMA_FIXTURE in getattr(item, "fixturenames", ())
    }
    assert using <= LLAMA_MODULES, f"add to LLAMA_MODULES: {sorted(using - LLAMA_MODULES)}"


def test_every_module_the_units_name_exists() -> None:
    assert [m for m in [*LLAMA_MODULES, *SHARDS] if not (ROOT / m).is_file()] == []


def test_a_module_is_one_unit_and_the_llama_modules_one_together() -> None:
    assert work_unit("tests/wire/test_sse.py::test_a[x]") == "tests/wire/test_sse.py"
    assert {work_unit(f"{m}::test_x") for m in LLAMA_MODULES} == {LLAMA_UNIT}
    for module, shards in SHARDS.items():
        units = {work_unit(f"{module}::test_{i}") for i in range(50)}
        assert len(units) == shards and all(u.startswith(f"{module}#") for u in units)
