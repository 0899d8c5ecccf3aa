"""The package's layering, read from the source: imports between llmitm's top-level
packages run one way, down. (Which modules may import mitmproxy, a database driver or do
I/O is ``test_house_rules``'s.)

Read with ``ast``, not by importing, so a lazy import inside a function counts too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import llmitm

PACKAGE = Path(llmitm.__file__).parent

LAYERS: dict[str, int] = {
    # the root exception, the version, helpers with no llmitm imports
    "errors": 0,
    "__init__": 0,
    "file_modes": 0,
    # the OpenAI wire formats
    "wire": 1,
    # translators, routing decisions and the WebSocket framing, each on wire alone
    "translate": 2,
    "routing": 2,
    "websocket": 2,
    # one exchange (request, response, stream) and the console's views of one
    "exchange": 3,
    "view": 3,
    # what the proxy reports of its calls: metrics, readiness, trace spans
    "observe": 3,
    # record/replay, then the local Responses API (which fingerprints like replay does)
    "replay": 4,
    "responses_api": 5,
    # what does I/O: the store, the loopback relay, the network namespace
    "store": 6,
    "relay": 6,
    "transparent": 6,
    # the mitmproxy shell
    "addons": 7,
    # the commands, and the pytest plugin with the fake upstream
    "cli": 8,
    "testing": 8,
}
"""Each top-level module or package of llmitm and its layer: a module may import from its
own package and from lower layers only (two packages on one layer know nothing of each
other)."""

KNOWN_UPWARD: set[tuple[str, str]] = set()
"""Imports known to run up the layers today, each to be removed when fixed."""


def _modules() -> Iterator[tuple[tuple[str, ...], ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        yield parts, ast.parse(path.read_text(encoding="utf-8"), str(path))


def _imports(parts: tuple[str, ...], tree: ast.Module) -> Iterator[str]:
    """Every absolute module name ``tree`` imports (relative imports resolved)."""
    package = list(parts[:-1])  # a package's __init__ and its modules resolve alike
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ["llmitm", *package[: len(package) - node.level + 1]]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            yield module
            if module == "llmitm" or (node.level and not node.module):
                yield from (f"{module}.{alias.name}" for alias in node.names)


def _top(parts: tuple[str, ...]) -> str:
    """The top-level module or package a module belongs to."""
    return parts[0]


MODULES = list(_modules())


def test_the_walk_sees_the_package() -> None:
    tops = {_top(parts) for parts, _ in MODULES}
    assert {"wire", "translate", "addons", "errors"} <= tops


def test_every_top_level_module_has_a_layer() -> None:
    unknown = {_top(parts) for parts, _ in MODULES} - LAYERS.keys()
    assert not unknown, f"give {sorted(unknown)} a layer in LAYERS"


def test_imports_run_down_the_layers() -> None:
    upward = []
    for parts, tree in MODULES:
        source = _top(parts)
        for module in _imports(parts, tree):
            names = module.split(".")
            if names[0] != "llmitm":
                continue
            target = names[1] if len(names) > 1 else "__init__"
            if target == "__version__":
                target = "__init__"
            if target == source or target not in LAYERS or source not in LAYERS:
                continue
            if LAYERS[target] >= LAYERS[source]:
                upward.append((f"llmitm/{'/'.join(parts)}.py", module))
    assert sorted(set(upward) - KNOWN_UPWARD) == []
    assert set(upward) >= KNOWN_UPWARD, "a known upward import is gone: drop it"
