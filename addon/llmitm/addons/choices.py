"""Enforce the ``choices`` of llmitm's options.

mitmproxy keeps an option's choices for its help text and UIs but never checks a value
against them (only command-line flags of its own options are checked, by argparse), so
``--set llmitm_record=bogus`` would otherwise run silently with a mode nobody asked for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set

from mitmproxy import ctx, exceptions


def check_choices(updated: Set[str], choices: Mapping[str, Sequence[str]]) -> None:
    """Raise :class:`~mitmproxy.exceptions.OptionsError` naming the option, what it may be
    and what it was given, for the first updated option outside its choices."""
    for name in sorted(updated & choices.keys()):
        value = getattr(ctx.options, name)
        allowed = choices[name]
        if value not in allowed:
            shown = ", ".join(repr(choice) for choice in allowed)
            raise exceptions.OptionsError(f"{name} must be one of {shown}, not {value!r}")
