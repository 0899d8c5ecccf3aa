"""How deeply a JSON value nests, against the one limit llmitm holds every body to.

Three tools llmitm runs on request bodies stop at different depths: ``orjson.loads`` takes
1024 levels, ``orjson.dumps`` refuses 255 and ``copy.deepcopy`` (and any other recursive walk)
runs out of Python stack near 500. A body deeper than :data:`MAX_DEPTH` is refused before any
of them sees it, so a body that passes can be parsed, copied, translated (which wraps a few
levels around what it copies) and serialised again. No real request comes near it: the
deepest JSON Schemas clients send for tool parameters nest a dozen levels or so.

Pure functions over parsed JSON values; no I/O.
"""

from __future__ import annotations

from typing import Any

MAX_DEPTH = 128
"""The deepest nesting of objects and arrays a request body may have (the body is level 1)."""


def exceeds(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``value`` nests objects and arrays more than ``limit`` levels deep.

    Iterative, so a value of any depth is measured without using the Python stack; strings
    and numbers are never looked into, so the cost is the number of containers."""
    if not isinstance(value, dict | list):
        return False
    # Level by level: a list of the next level's containers, no (container, depth) tuple
    # per container (an agent's body has tens of thousands of them, every turn).
    level: list[Any] = [value]
    depth = 1
    while level:
        if depth > limit:
            return True
        below: list[Any] = []
        add = below.append
        for container in level:
            for child in container.values() if isinstance(container, dict) else container:
                if isinstance(child, dict | list):
                    add(child)
        level = below
        depth += 1
    return False


def deep_path(value: Any, limit: int = MAX_DEPTH) -> str | None:
    """Where ``value`` first nests deeper than ``limit`` levels, in OpenAI's ``param``
    spelling (``tools[0].parameters.properties``), truncated to its first few steps; ``None``
    when it does not. Slower than :func:`exceeds`: run it only to explain a refusal."""
    if not isinstance(value, dict | list):
        return None
    stack: list[tuple[Any, int, tuple[str | int, ...]]] = [(value, 1, ())]
    while stack:
        container, depth, path = stack.pop()
        if depth > limit:
            return _spell(path)
        items = container.items() if isinstance(container, dict) else enumerate(container)
        for key, child in items:
            if isinstance(child, dict | list):
                stack.append((child, depth + 1, (*path, key)))
    return None


_SHOWN_STEPS = 4


def _spell(path: tuple[str | int, ...]) -> str:
    text = ""
    for step in path[:_SHOWN_STEPS]:
        text += f"[{step}]" if isinstance(step, int) else (f".{step}" if text else step)
    return text + ("..." if len(path) > _SHOWN_STEPS else "")
