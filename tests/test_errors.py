"""Every exception llmitm defines sits in one tree under LlmitmError, as llmitm.errors draws it."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import pytest

import llmitm
from llmitm import errors
from llmitm.errors import InputError, LlmitmError, TransportError, UserError

INDEPENDENT = {"llmitm.testing.fake_upstream"}
"""Modules that stand in for someone else and share nothing with llmitm on purpose: the fake
upstream plays OpenAI and a local backend to test llmitm against."""


def _defined_exceptions() -> dict[str, type[BaseException]]:
    """Each exception class defined in a module of the package, by name (walks every module,
    so a class added anywhere is seen)."""
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(llmitm.__path__, "llmitm."):
        if info.name.endswith(".__main__") or info.name in INDEPENDENT:
            continue  # a __main__ runs its command when imported
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == module.__name__
            ):
                assert name not in found, f"two exception classes named {name}"
                found[name] = value
    return found


def _drawn_tree() -> dict[str, str | None]:
    """The tree in the module docstring, as each class name to its parent's name."""
    doc = errors.__doc__ or ""
    block = doc.split("::", 1)[1]
    parents: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []
    for line in block.splitlines():
        match = re.match(r"^(?P<lead>[ │├└─]*)(?P<name>\w+)\s*$", line)
        if not match or not line.strip():
            continue
        depth = len(match["lead"])
        while stack and stack[-1][0] >= depth:
            stack.pop()
        parents[match["name"]] = stack[-1][1] if stack else None
        stack.append((depth, match["name"]))
    return parents


EXCEPTIONS = _defined_exceptions()


def test_the_package_defines_the_exceptions_it_is_known_to() -> None:
    # a walk that found nothing would make every other test here vacuous
    assert {"LlmitmError", "ConfigError", "TranslationError", "UpstreamStall"} <= set(EXCEPTIONS)


@pytest.mark.parametrize("name", sorted(EXCEPTIONS))
def test_every_exception_derives_from_the_root(name: str) -> None:
    assert issubclass(EXCEPTIONS[name], LlmitmError)


def test_the_drawn_tree_is_the_classes() -> None:
    actual: dict[str, str | None] = {}
    for name, cls in EXCEPTIONS.items():
        # the parent is the first base that is one of llmitm's own
        own = [base for base in cls.__bases__ if base in EXCEPTIONS.values()]
        actual[name] = own[0].__name__ if own else None
    assert _drawn_tree() == actual


@pytest.mark.parametrize(
    ("name", "builtin"),
    [
        ("ConfigError", ValueError),
        ("UnreadableInput", ValueError),
        ("RecError", ValueError),
        ("RequestError", ValueError),
        ("FolderError", ValueError),
        ("RunUsageError", ValueError),
        ("UsageError", ValueError),
        ("PlanError", ValueError),
        ("ReplayCut", ConnectionError),
        ("SchemaTooNew", RuntimeError),
        ("InProcessError", RuntimeError),
        ("NamespaceError", RuntimeError),
    ],
)
def test_errors_keep_the_builtin_base_their_callers_catch(
    name: str, builtin: type[BaseException]
) -> None:
    assert issubclass(EXCEPTIONS[name], builtin)


def test_a_raised_error_is_caught_by_its_branch_and_by_the_old_base() -> None:
    from llmitm.routing.config import ConfigError
    from llmitm.translate.errors import TranslationError

    with pytest.raises(UserError, match="bad key"):
        raise ConfigError("bad key")
    with pytest.raises(ValueError, match="bad key"):
        raise ConfigError("bad key")
    with pytest.raises(InputError) as caught:
        raise TranslationError("no such part", param="input")
    assert caught.value.param == "input"
    assert not issubclass(TranslationError, TransportError)
