"""Reading the docs as a test sees them: fenced blocks, the commands and expected output of
``console`` blocks, the files that named blocks define, the markers that say how (or whether)
a block runs, and relative links.

The conventions, also stated in ``docs/README.md``:

- A ```` ```console ```` block is run: each ``$ `` line (with ``\\`` continuations) is a
  command, the lines up to the next ``$ `` are output it must print, in order, each within
  one line (``…`` matches anything within a line).
- A ``toml``/``python``/``yaml`` block whose first line is ``# NAME`` defines the file ``NAME``
  in the folder the page's commands run in.
- ``<!-- proxy: ARGS -->`` right before a console block: ``llmitm run ARGS`` listens on
  ``$LLMITM_PORT`` while the block runs.
- ``<!-- not run: REASON -->`` right before a block: not run, for the reason given. Every
  shell block that is not a console block must carry it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHELL_LANGUAGES = {"sh", "bash", "shell", "console"}
_FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_MARKER = re.compile(r"<!--\s*(proxy|not run):\s*(.*?)\s*-->\s*$")
_FILE_NAME = re.compile(r"^#\s+([\w./-]+\.(?:toml|py|yml|yaml|json))\s*$")
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


@dataclass(frozen=True)
class Command:
    text: str
    expected: tuple[str, ...]


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    language: str
    body: str
    marker: tuple[str, str] | None = None  # ("proxy" | "not run", its argument)

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def not_run(self) -> bool:
        return bool(self.marker and self.marker[0] == "not run")

    @property
    def proxy_args(self) -> str | None:
        return self.marker[1] if self.marker and self.marker[0] == "proxy" else None

    @property
    def file_name(self) -> str | None:
        first = self.body.split("\n", 1)[0]
        match = _FILE_NAME.match(first)
        return match.group(1) if match and self.language != "console" else None

    def commands(self) -> list[Command]:
        """The ``$ `` commands of a console block, each with the output shown after it."""
        commands: list[Command] = []
        text: list[str] = []
        expected: list[str] = []
        continued = False
        for line in self.body.splitlines():
            if continued:
                text.append(line)
                continued = line.endswith("\\")
            elif line.startswith("$ "):
                if text:
                    commands.append(Command("\n".join(text), tuple(expected)))
                text, expected = [line[2:]], []
                continued = line.endswith("\\")
            elif text and line.strip():
                expected.append(line)
        if text:
            commands.append(Command("\n".join(text), tuple(expected)))
        return commands


@dataclass
class Page:
    path: Path
    text: str
    blocks: list[Block] = field(default_factory=list)


def doc_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def read_page(path: Path) -> Page:
    text = path.read_text(encoding="utf-8")
    page = Page(path, text)
    for match in _FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = _MARKER.search(before)
        page.blocks.append(
            Block(
                page=path,
                line=text.count("\n", 0, match.start()) + 1,
                language=match.group(1),
                body=match.group(2),
                marker=(marker.group(1), marker.group(2)) if marker else None,
            )
        )
    return page


def prose(text: str) -> str:
    """The page without its fenced blocks (links and citations live in the prose)."""
    return _FENCE.sub("", text)


def links(text: str) -> list[str]:
    return _LINK.findall(prose(text))


def output_matches(expected: tuple[str, ...], output: str) -> str | None:
    """``None`` when every expected line occurs in a line of ``output``, in order; else the
    first expected line that did not. (Within a line, not as the whole line: around a wrapped
    command the proxy's own lines share the command's terminal and may run into its text.)"""
    lines = output.splitlines()
    position = 0
    for want in expected:
        pattern = re.compile(".*".join(re.escape(part) for part in want.strip().split("…")))
        while position < len(lines) and not pattern.search(lines[position]):
            position += 1
        if position == len(lines):
            return want
        position += 1
    return None
