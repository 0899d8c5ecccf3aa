"""The house rules of llmitm's layout, checked statically over ``addon/llmitm`` with ``ast``.

- mitmproxy is imported only under ``addons/`` (the shell); a database driver only under
  ``store/``.
- The sans-IO packages (:data:`SANS_IO`) do no file or socket I/O: they import no socket,
  TLS, HTTP-client, subprocess or file-tree module, and call no ``open()``, no ``os`` file
  function and no ``pathlib``-style file method (:data:`FILE_METHODS`). ``asyncio`` itself is
  allowed (events, tasks and sleeps are no I/O); its connection and server calls are not.
- Under ``addons/``, only ``addons/patches/`` touches a mitmproxy name that starts with ``_``:
  an import of a private module or name, or an attribute access of a private name that llmitm
  does not define itself (or that mitmproxy defines too, on anything but ``self``/``cls``).
- llmitm's modules import each other without cycles, counting every import: one inside a
  function or under ``TYPE_CHECKING`` avoids a cycle at run time but not in the layering.

Each rule is also run against a small module that breaks it, so a rule that stopped seeing
anything would fail here rather than pass quietly.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import llmitm

PACKAGE = Path(llmitm.__file__).parent

SANS_IO = ("wire", "translate", "routing", "exchange", "responses_api", "replay", "websocket")
"""The packages below the shells: given bytes and objects, they return bytes and objects."""

KNOWN_IO = {
    # load_config reads the routing file; reading it belongs in the shell (the caller passes
    # the text), and this entry goes when it does.
    "llmitm.routing.config",
}
"""Modules of :data:`SANS_IO` known to do file I/O today, each to be removed when fixed."""

KNOWN_CYCLES: set[frozenset[str]] = set()
"""Import cycles known today, each to be removed when fixed."""

PRIVATE_IDENTIFIER = re.compile(r"(?<!\w)_\w+")

DATABASE_DRIVERS = {"sqlite3", "aiosqlite", "psycopg", "psycopg2", "asyncpg", "sqlalchemy"}

IO_MODULES = {
    "socket",
    "ssl",
    "selectors",
    "subprocess",
    "shutil",
    "tempfile",
    "glob",
    "mmap",
    "fcntl",
    "http.client",
    "http.server",
    "urllib.request",
    "httpx",
    "httpcore",
    "aiohttp",
    "requests",
    "aiofiles",
}
"""Modules whose only use is I/O (``urllib.parse`` and ``http.HTTPStatus`` are not)."""

OS_FILE_FUNCTIONS = {
    "open",
    "read",
    "write",
    "remove",
    "unlink",
    "rename",
    "replace",
    "mkdir",
    "makedirs",
    "rmdir",
    "removedirs",
    "listdir",
    "scandir",
    "walk",
    "stat",
    "lstat",
    "chmod",
    "fsync",
    "truncate",
    "exists",
    "isfile",
    "isdir",
    "getsize",
    "getmtime",
}
"""``os.X`` and ``os.path.X`` calls that touch the file system."""

FILE_METHODS = {
    "read_text",
    "read_bytes",
    "write_text",
    "write_bytes",
    "mkdir",
    "unlink",
    "rmdir",
    "touch",
    "iterdir",
    "glob",
    "rglob",
    "exists",
    "is_file",
    "is_dir",
    "stat",
    "chmod",
    "rename",
    "open_connection",
    "open_unix_connection",
    "start_server",
    "start_unix_server",
    "create_connection",
    "create_server",
    "create_datagram_endpoint",
    "sock_connect",
    "sock_recv",
    "sock_sendall",
}
"""Method names that read or write files or open sockets (``Path``'s and the event loop's).
``.open()`` is too common a name (a sealed box opens too) to count by itself: it counts on the
file modules of :data:`FILE_OPENERS` and on anything whose expression names a path."""

FILE_OPENERS = {"io", "gzip", "bz2", "lzma", "codecs", "tarfile", "zipfile", "Path"}


@dataclass(frozen=True, slots=True)
class Module:
    name: str
    path: Path
    tree: ast.Module


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _modules() -> tuple[Module, ...]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        found.append(Module(_module_name(path), path, ast.parse(path.read_text(), str(path))))
    return tuple(found)


def _parse(name: str, source: str) -> Module:
    return Module(name, Path(name.replace(".", "/") + ".py"), ast.parse(source))


def _in(module: Module, package: str) -> bool:
    return module.name == package or module.name.startswith(package + ".")


def _imports(tree: ast.AST) -> Iterator[tuple[ast.stmt, str, list[str]]]:
    """(node, absolute module, imported names) of every import in ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node, alias.name, []
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node, node.module, [alias.name for alias in node.names]


def _top(module: str) -> str:
    return module.split(".")[0]


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _where(module: Module, node: ast.AST) -> str:
    return f"{module.name}:{getattr(node, 'lineno', '?')}"


def _in_order(found: Iterable[str]) -> list[str]:
    """Violations by module and line (``ast.walk`` visits breadth-first)."""

    def key(text: str) -> tuple[str, int]:
        name, _, rest = text.partition(":")
        return name, int(rest.split(" ", 1)[0])

    return sorted(found, key=key)


# --- the rules, each a function from modules to violations --------------------------------


def mitmproxy_outside_addons(modules: tuple[Module, ...]) -> list[str]:
    return [
        f"{_where(m, node)} imports {name}"
        for m in modules
        if not _in(m, "llmitm.addons")
        for node, name, _ in _imports(m.tree)
        if _top(name) == "mitmproxy"
    ]


def database_outside_store(modules: tuple[Module, ...]) -> list[str]:
    return [
        f"{_where(m, node)} imports {name}"
        for m in modules
        if not _in(m, "llmitm.store")
        for node, name, _ in _imports(m.tree)
        if _top(name) in DATABASE_DRIVERS
    ]


BACKEND_MODULES = ("llmitm.store.sqlite", "llmitm.store.postgres", "llmitm.store.migrations")
"""The store's backends (each with its ``_…`` modules) and SQLite's schema steps: code above
``store/`` talks to the ``Store`` interface and ``store.open.store_for`` only."""


def backend_outside_store(modules: tuple[Module, ...]) -> list[str]:
    found = []
    for module in modules:
        if _in(module, "llmitm.store"):
            continue
        for node, name, names in _imports(module.tree):
            candidates = [name, *(f"{name}.{n}" for n in names)]
            hit = next((c for c in candidates if _is_backend(c)), None)
            if hit is not None:
                found.append(f"{_where(module, node)} imports {hit}")
    return found


def _is_backend(name: str) -> bool:
    return _backend_of(name, BACKEND_MODULES) is not None


def _backend_of(name: str, backends: tuple[str, ...]) -> str | None:
    return next((b for b in backends if name == b or name.startswith((b + ".", b + "_"))), None)


BACKENDS = ("llmitm.store.sqlite", "llmitm.store.postgres")
"""The store's backends, each with its ``_…`` modules."""


def backend_in_other_backend(modules: tuple[Module, ...]) -> list[str]:
    """A backend's modules import no other backend's: what both use lives in a neutral
    module of the store (``api``, ``content_chunks``, ``recording_rows``, …)."""
    found = []
    for module in modules:
        own = _backend_of(module.name, BACKENDS)
        if own is None:
            continue
        for node, name, names in _imports(module.tree):
            for candidate in (name, *(f"{name}.{n}" for n in names)):
                other = _backend_of(candidate, BACKENDS)
                if other is not None and other != own:
                    found.append(f"{_where(module, node)} imports {candidate}")
                    break
    return found


def _io_in(module: Module) -> Iterator[str]:
    for node, name, names in _imports(module.tree):
        dotted = {name, *(f"{name}.{n}" for n in names)}
        hit = next(
            (io for io in IO_MODULES if any(d == io or d.startswith(io + ".") for d in dotted)),
            None,
        )
        if hit is not None:
            yield f"{_where(module, node)} imports {hit}"
    for node in ast.walk(module.tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id == "open":
            yield f"{_where(module, node)} calls open()"
        elif isinstance(func, ast.Attribute):
            owner = ast.unparse(func.value)
            if owner in ("os", "os.path") and func.attr in OS_FILE_FUNCTIONS:
                yield f"{_where(module, node)} calls {owner}.{func.attr}()"
            elif func.attr in FILE_METHODS or (
                func.attr == "open"
                and (owner.split("(")[0] in FILE_OPENERS or "path" in owner.lower())
            ):
                yield f"{_where(module, node)} calls .{func.attr}()"


def io_in_sans_io(modules: tuple[Module, ...], known: set[str]) -> list[str]:
    return _in_order(
        found
        for m in modules
        if any(_in(m, f"llmitm.{package}") for package in SANS_IO) and m.name not in known
        for found in _io_in(m)
    )


def _defined_private(trees: list[ast.AST]) -> set[str]:
    """Private names a body of code defines: functions, classes, assigned names and attributes."""
    names: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Assign) and "__slots__" in map(ast.unparse, node.targets):
                names |= {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant)}
    return {name for name in names if _private(name)}


@cache
def _mitmproxy_private() -> frozenset[str]:
    """Every private-looking identifier in the installed mitmproxy's source: a superset of
    what it defines, read as text (parsing all of mitmproxy would take seconds)."""
    spec = importlib.util.find_spec("mitmproxy")
    assert spec is not None and spec.submodule_search_locations
    names: set[str] = set()
    for location in spec.submodule_search_locations:
        for path in Path(location).rglob("*.py"):
            names.update(PRIVATE_IDENTIFIER.findall(path.read_text(encoding="utf-8")))
    return frozenset(name for name in names if _private(name))


def private_mitmproxy_names(
    modules: tuple[Module, ...], ours: set[str], theirs: frozenset[str]
) -> list[str]:
    """Under addons/ outside patches/: private mitmproxy imports and attribute accesses."""
    found = []
    for m in modules:
        if not _in(m, "llmitm.addons") or _in(m, "llmitm.addons.patches"):
            continue
        for node, name, names in _imports(m.tree):
            if _top(name) == "mitmproxy" and (
                any(_private(part) for part in name.split(".")) or any(map(_private, names))
            ):
                found.append(f"{_where(m, node)} imports a private name from {name}")
        for node, owner, attr in _attribute_uses(m.tree):
            on_self = isinstance(owner, ast.Name) and owner.id in ("self", "cls")
            if _private(attr) and (attr not in ours or (attr in theirs and not on_self)):
                found.append(f"{_where(m, node)} touches {ast.unparse(node)}")
    return _in_order(found)


def _attribute_uses(tree: ast.AST) -> Iterator[tuple[ast.expr, ast.expr, str]]:
    """(node, owner, name) of ``owner.name`` and of ``getattr``/``setattr``/``hasattr``/
    ``delattr`` with a literal name."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            yield node, node.value, node.attr
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            yield node, node.args[0], node.args[1].value


def import_graph(modules: tuple[Module, ...]) -> dict[str, set[str]]:
    """Which llmitm module imports which (``from pkg import sub`` names sub), wherever the
    import stands: one inside a function or under ``TYPE_CHECKING`` is a dependency too."""
    known = {m.name for m in modules}
    graph: dict[str, set[str]] = {m.name: set() for m in modules}
    for m in modules:
        package = m.name if m.path.name == "__init__.py" else m.name.rpartition(".")[0]
        for node in ast.walk(m.tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                subs = [f"{base}.{alias.name}" for alias in node.names]
                targets = [sub if sub in known else base for sub in subs]
            else:
                continue
            graph[m.name] |= {t for t in targets if t in known and t != m.name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


# --- the tests: the tree keeps each rule -----------------------------------------------------


def test_mitmproxy_is_imported_only_by_the_addons() -> None:
    assert mitmproxy_outside_addons(_modules()) == []


def test_database_drivers_are_imported_only_by_the_store() -> None:
    assert database_outside_store(_modules()) == []


def test_no_code_above_the_store_knows_its_backend() -> None:
    assert backend_outside_store(_modules()) == []


def test_no_store_backend_imports_another() -> None:
    assert backend_in_other_backend(_modules()) == []


def test_the_sans_io_packages_do_no_file_or_socket_io() -> None:
    assert io_in_sans_io(_modules(), KNOWN_IO) == []


def test_the_known_exceptions_still_break_the_rules() -> None:
    # An entry whose module moved or was fixed must go, so the lists cannot grow stale.
    by_name = {m.name: m for m in _modules()}
    for name in KNOWN_IO:
        assert name in by_name and list(_io_in(by_name[name])), f"{name}: drop it from KNOWN_IO"
    found = set(cycles(import_graph(_modules())))
    assert found >= KNOWN_CYCLES, "a known cycle is gone: drop it from KNOWN_CYCLES"


def test_only_the_patches_touch_private_mitmproxy_names() -> None:
    modules = _modules()
    ours = _defined_private([m.tree for m in modules])
    assert private_mitmproxy_names(modules, ours, _mitmproxy_private()) == []


def test_llmitm_imports_itself_without_cycles() -> None:
    found = set(cycles(import_graph(_modules())))
    assert found - KNOWN_CYCLES == set()


# --- and each rule sees what it forbids ------------------------------------------------------


def test_the_rules_catch_modules_that_break_them() -> None:
    shell = _parse("llmitm.view.leak", "from mitmproxy import http\nimport aiosqlite\n")
    assert mitmproxy_outside_addons((shell,)) == ["llmitm.view.leak:1 imports mitmproxy"]
    assert database_outside_store((shell,)) == ["llmitm.view.leak:2 imports aiosqlite"]
    store = _parse("llmitm.store.ok", "import aiosqlite\n")
    addon = _parse("llmitm.addons.ok", "from mitmproxy import http\n")
    assert database_outside_store((store,)) == mitmproxy_outside_addons((addon,)) == []
    cli = _parse("llmitm.cli.leak", "from llmitm.store.postgres_usage import usage_rows\n")
    assert backend_outside_store((cli,)) == [
        "llmitm.cli.leak:1 imports llmitm.store.postgres_usage"
    ]
    neutral = _parse("llmitm.cli.ok", "from llmitm.store import store_for\n")
    assert backend_outside_store((neutral, store)) == []
    pg = _parse("llmitm.store.postgres_x", "from llmitm.store.sqlite_content import TABLE\n")
    pg_ok = _parse("llmitm.store.postgres_y", "from llmitm.store import postgres_content\n")
    assert backend_in_other_backend((pg, pg_ok)) == [
        "llmitm.store.postgres_x:1 imports llmitm.store.sqlite_content"
    ]

    core = _parse(
        "llmitm.translate.leak",
        "import socket\nfrom urllib import request\nfrom urllib.parse import urlsplit\n"
        "def f(p):\n    open(p)\n    p.write_text('x')\n    os.path.exists(p)\n"
        "    items.remove(1)\n    asyncio.sleep(0)\n",
    )
    assert io_in_sans_io((core,), set()) == [
        "llmitm.translate.leak:1 imports socket",
        "llmitm.translate.leak:2 imports urllib.request",
        "llmitm.translate.leak:5 calls open()",
        "llmitm.translate.leak:6 calls .write_text()",
        "llmitm.translate.leak:7 calls os.path.exists()",
    ]
    assert io_in_sans_io((core,), {"llmitm.translate.leak"}) == []


def test_the_private_name_rule_sees_imports_and_attributes() -> None:
    source = (
        "from mitmproxy.proxy.layers.http._events import ResponseData\n"
        "from mitmproxy.proxy.layers.http import _events\n"
        "def f(master, proxy):\n"
        "    master._legacy_log_events.uninstall()\n"
        "    proxy._ready.set()\n"
        "    self._mine = 1\n"
        "    getattr(master, '_legacy_log_events')\n"
    )
    modules = (_parse("llmitm.addons.leak", source), _parse("llmitm.addons.patches.ok", source))
    ours = {"_mine", "_ready"}
    theirs = frozenset({"_legacy_log_events", "_ready"})
    assert private_mitmproxy_names(modules, ours, theirs) == [
        "llmitm.addons.leak:1 imports a private name from mitmproxy.proxy.layers.http._events",
        "llmitm.addons.leak:2 imports a private name from mitmproxy.proxy.layers.http",
        "llmitm.addons.leak:4 touches master._legacy_log_events",
        # llmitm has a _ready too, but mitmproxy's objects also do: only self's is ours
        "llmitm.addons.leak:5 touches proxy._ready",
        "llmitm.addons.leak:7 touches getattr(master, '_legacy_log_events')",
    ]
    # The mitmproxy installed here has the names the old code used.
    assert {"_legacy_log_events", "_termlog_addon"} <= _mitmproxy_private()


def test_the_cycle_rule_finds_cycles_through_any_import() -> None:
    modules = (
        _parse("llmitm.a", "from llmitm import b\n"),
        _parse("llmitm.b", "from llmitm.c import x\n"),
        _parse("llmitm.c", "def later():\n    import llmitm.a\n"),
        _parse(
            "llmitm.d", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import llmitm.e\n"
        ),
        _parse("llmitm.e", "from llmitm.d import y\n"),
        _parse("llmitm.f", "import llmitm.a\n"),
    )
    found = set(cycles(import_graph(modules)))
    assert found == {
        frozenset({"llmitm.a", "llmitm.b", "llmitm.c"}),
        frozenset({"llmitm.d", "llmitm.e"}),
    }
