"""The docs against the code: links resolve, cited files exist, the configuration tables list
exactly the keys ``routing/config.py`` reads, the options table exactly the ``llmitm_*``
options the addons declare (with their defaults), and the layout page every package."""

from __future__ import annotations

import re
import subprocess
import unicodedata
from pathlib import Path

import pytest

from llmitm.routing import config as config_module
from tests.docs.doctext import ROOT, doc_pages, links, prose, read_page

_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*$", re.MULTILINE)
_CITED_PATH = re.compile(r"`([\w.-]+(?:/[\w.-]+)+/?)`")
_MARKDOWN_NAME = re.compile(r"[\w.-]+\.md\b")


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    text = heading.replace("`", "").strip().lower()
    text = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(h) for h in _HEADING.findall(prose(path.read_text(encoding="utf-8")))}


def tracked_files() -> list[str]:
    done = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    return done.stdout.split()


def test_github_slugs_as_the_pages_use_them() -> None:
    assert slug("What `llmitm run -- COMMAND` sets") == "what-llmitm-run----command-sets"
    assert slug("`[endpoints.NAME]`") == "endpointsname"
    assert slug("Failover, retries and health") == "failover-retries-and-health"


@pytest.mark.parametrize("path", doc_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path: Path) -> None:
    broken = []
    for target in links(path.read_text(encoding="utf-8")):
        if re.match(r"^[a-z]+:", target):
            continue  # https:, mailto:
        file_part, _, fragment = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
            broken.append(f"{target}: no heading #{fragment} in {linked.name}")
    assert broken == []


def test_every_docs_page_is_linked_from_the_readme() -> None:
    readme_links = {t.partition("#")[0] for t in links((ROOT / "README.md").read_text())}
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert pages - readme_links == set()


@pytest.mark.parametrize("path", doc_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_cites_a_file_that_is_not_in_the_repo(path: Path) -> None:
    text = prose(path.read_text(encoding="utf-8"))
    files = tracked_files()
    names = {Path(f).name for f in files}
    missing = []
    for cited in _CITED_PATH.findall(text):
        bare = cited.rstrip("/")
        if "." not in Path(bare).name and not cited.endswith("/"):
            continue  # a media type, a mode, a URL path: not a file
        roots = (ROOT, ROOT / "addon" / "llmitm", ROOT / "addon")
        if bare.startswith(("/v1", "/openai", "/_llmitm")) or "_blobs" in bare:
            continue
        if bare.endswith("/") or "." not in Path(bare).name:
            exists = any((root / bare).is_dir() for root in roots)
        else:
            exists = any((root / bare).exists() for root in roots)
        if not exists and not (cited.endswith("/") and bare in {"recordings", "exported"}):
            missing.append(cited)
    missing += [name for name in _MARKDOWN_NAME.findall(text) if name not in names]
    assert missing == []


def _table_keys(page: str, heading: str) -> set[str]:
    """The first-column names of the table under ``heading`` (up to the next heading)."""
    section = page.split(heading + "\n", 1)[1]
    section = re.split(r"^#{1,6} ", section, maxsplit=1, flags=re.MULTILINE)[0]
    return set(re.findall(r"^\| `([\w.]+)` \|", section, flags=re.MULTILINE))


CONFIGURATION = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")


def test_the_configuration_tables_list_every_key_the_file_reader_takes() -> None:
    assert _table_keys(CONFIGURATION, "### `[llmitm]`") == set(
        config_module.Settings.__dataclass_fields__
    )
    assert _table_keys(CONFIGURATION, "### `[endpoints.NAME]`") == config_module._ENDPOINT_KEYS
    assert _table_keys(CONFIGURATION, "### `[[routes]]`") == config_module._ROUTE_KEYS
    assert _table_keys(CONFIGURATION, "### `[routing]`") == set(
        config_module.RoutingSettings.__dataclass_fields__
    )
    assert _table_keys(CONFIGURATION, "### `[client_keys.NAME]`") == {"key_env", "routes"}


def test_the_routing_defaults_shown_are_the_codes() -> None:
    section = CONFIGURATION.split("### `[routing]`\n", 1)[1].split("### ", 1)[0]
    shown = dict(re.findall(r"^\| `(\w+)` \| `([\d.]+)` \|", section, flags=re.MULTILINE))
    defaults = config_module.RoutingSettings()
    assert {k: float(v) for k, v in shown.items()} == {
        k: float(getattr(defaults, k)) for k in config_module.RoutingSettings.__dataclass_fields__
    }


def declared_options() -> dict[str, object]:
    from mitmproxy.test import taddons

    from llmitm.addons import make_addons

    with taddons.context() as tctx:
        for addon in make_addons():
            tctx.master.addons.add(addon)
        return {
            name: option.default
            for name, option in tctx.options._options.items()
            if name.startswith("llmitm_")
        }


def _shown_default(value: object) -> str:
    if value is None:
        return "(none)"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if value == "":
        return '`""`'
    return f"`{value}`"


def test_the_options_table_is_every_declared_option_with_its_default() -> None:
    section = CONFIGURATION.split("## Options\n", 1)[1]
    shown = dict(re.findall(r"^\| `(llmitm_\w+)` \| ([^|]+?) \|", section, flags=re.MULTILINE))
    declared = {name: _shown_default(default) for name, default in declared_options().items()}
    assert shown == declared


def test_every_option_a_page_names_exists() -> None:
    declared = set(declared_options())
    # As options appear: set (``llmitm_x=…``) or in a table's first column. Metric names and
    # flow metadata share the prefix but are neither.
    named = {
        name
        for path in doc_pages()
        for name in re.findall(
            r"\b(llmitm_[a-z_]+)(?:=(?!\")|` \|)", path.read_text(encoding="utf-8")
        )
    }
    assert named - declared == set()
    assert len(named) > 20  # the pattern finds the options the pages set


def test_the_command_line_page_lists_every_option_of_llmitm_run() -> None:
    from llmitm.cli.run_args import RUN_OPTIONS

    page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    section = page.split("### Its options\n", 1)[1].split("\n\n```", 1)[0]
    shown = set(re.findall(r"`(-{1,2}[a-z-]+)(?: [A-Z]+)?`", section))
    declared = {flag for flags, _metavar, _help in RUN_OPTIONS for flag in flags}
    assert declared | {"-h", "--help"} <= shown
    assert shown - declared <= {"-h", "--help", "-vv", "--options", "--set"}


def test_the_record_replay_page_names_every_pytest_option() -> None:
    """Read from the plugin's own ``pytest_addoption``, handed a parser that keeps names."""
    from llmitm.testing import pytest_plugin

    class Group:
        def __init__(self) -> None:
            self.names: list[str] = []

        def addoption(self, *names: str, **_: object) -> None:
            self.names += names

    group = Group()

    class Parser:
        def getgroup(self, *_: object, **__: object) -> Group:
            return group

        def addini(self, *_: object, **__: object) -> None:
            pass

    pytest_plugin.pytest_addoption(Parser())  # type: ignore[arg-type]
    page = (ROOT / "docs" / "record-replay.md").read_text(encoding="utf-8")
    assert group.names
    assert [name for name in group.names if f"`{name}" not in page] == []


def test_the_layout_page_lists_every_package() -> None:
    page = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `(addon/llmitm/[\w/]+)/` \|", page, flags=re.MULTILINE))
    packages = {
        str(init.parent.relative_to(ROOT))
        for init in (ROOT / "addon" / "llmitm").glob("**/__init__.py")
        if init.parent != ROOT / "addon" / "llmitm"
    }
    assert listed == packages


def test_the_readme_test_command_is_what_ci_runs() -> None:
    readme = read_page(ROOT / "README.md")
    development = readme.text.split("## Development", 1)[1]
    assert "make test" in development
    assert "make test" in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
