"""The package's layering, read from the source: imports run one way (down), mitmproxy is
imported only by the addons, a database driver only by the store, and the sans-IO packages
touch no file, socket or process.

Read with ``ast``, not by importing, so a lazy import inside a function counts too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import llmitm

PACKAGE = Path(llmitm.__file__).parent

LAYERS: dict[str, int] = {
    # the root exception, the version, helpers with no llmitm imports
    "errors": 0,
    "__init__": 0,
    "file_modes": 0,
    "command_env": 0,
    # the OpenAI wire formats
    "wire": 1,
    # translators, routing decisions and the WebSocket framing, each on wire alone
    "translate": 2,
    "routing": 2,
    "websocket": 2,
    # one exchange (request, response, stream) and the console's views of one
    "exchange": 3,
    "view": 3,
    # record/replay, then the local Responses API (which fingerprints like replay does)
    "replay": 4,
    "responses_api": 5,
    # what does I/O: the store, the loopback relay, the network namespace
    "store": 6,
    "relay": 6,
    "transparent": 6,
    # the mitmproxy shell
    "addons": 7,
    "testing": 7,
    # commands
    "usage_report": 8,
    "run": 8,
    "rec_cli": 9,
    "cli": 10,
    "pytest_plugin": 10,
}
"""Each top-level module or package of llmitm and its layer: a module may import from its
own package and from lower layers only (two packages on one layer know nothing of each
other)."""

SANS_IO = ("wire", "translate", "routing", "exchange", "replay", "responses_api", "view")
IO_MODULES = frozenset(
    {"socket", "subprocess", "shutil", "tempfile", "sqlite3", "aiosqlite", "httpx", "h11"}
)
IO_METHODS = frozenset(
    {"read_bytes", "read_text", "write_bytes", "write_text", "unlink", "mkdir", "iterdir"}
)
DATABASE_DRIVERS = frozenset({"sqlite3", "aiosqlite", "apsw", "psycopg", "psycopg2", "asyncpg"})

READS_A_FILE = {("routing", "config.py", "read_text")}
"""Where a sans-IO package reads a file on purpose: the configuration file is read and
parsed in one call (``load_config``) that every front end shares."""


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
                upward.append(f"llmitm/{'/'.join(parts)}.py imports {module}")
    assert upward == []


def test_only_the_addons_import_mitmproxy() -> None:
    found = [
        f"llmitm/{'/'.join(parts)}.py imports {module}"
        for parts, tree in MODULES
        if parts[0] != "addons"
        for module in _imports(parts, tree)
        if module.split(".")[0] == "mitmproxy"
    ]
    assert found == []


def test_only_the_store_imports_a_database_driver() -> None:
    found = [
        f"llmitm/{'/'.join(parts)}.py imports {module}"
        for parts, tree in MODULES
        if parts[0] != "store"
        for module in _imports(parts, tree)
        if module.split(".")[0] in DATABASE_DRIVERS
    ]
    assert found == []


@pytest.mark.parametrize("package", SANS_IO)
def test_the_sans_io_packages_touch_no_file_socket_or_process(package: str) -> None:
    found = []
    for parts, tree in MODULES:
        if parts[0] != package:
            continue
        where = f"llmitm/{'/'.join(parts)}.py"
        for module in _imports(parts, tree):
            if module.split(".")[0] in IO_MODULES | {"mitmproxy"}:
                found.append(f"{where} imports {module}")
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if isinstance(func, ast.Name) and func.id == "open":
                found.append(f"{where}:{node.lineno} calls open()")
            elif (
                isinstance(func, ast.Attribute)
                and func.attr in IO_METHODS
                and (package, parts[-1] + ".py", func.attr) not in READS_A_FILE
            ):
                found.append(f"{where}:{node.lineno} calls .{func.attr}()")
    assert found == []
