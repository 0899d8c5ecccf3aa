"""Read an option without copying a value that cannot change.

mitmproxy's ``ctx.options.name`` hands out a deep copy of the value, twice for an option at
its default (``_Option.current`` copies what ``_Option.default`` already copied), so that no
caller can change a list or dict in place. Its HTTP layer reads ``store_streamed_bodies`` for
every chunk of a streamed body: two ``copy.deepcopy`` calls of ``False`` per event, about
1–2 µs of a paced stream's per-event cost.

:func:`install` replaces ``_Option.current`` with one that returns a value of an immutable
type (``bool``, ``int``, ``float``, ``str``, ``bytes``, ``None``) as it is — what
``deepcopy`` returns for those anyway — and deep-copies everything else as before. It is
pinned by ``mitmproxy < 13``; when ``_Option`` is not as expected it logs once and leaves
mitmproxy's method in place.
"""

from __future__ import annotations

import copy
import types
from typing import Any

from llmitm.addons.patches.fallback import degrade

PATCH = "option reads"

_IMMUTABLE = frozenset({bool, int, float, str, bytes, type(None)})

try:
    from mitmproxy.optmanager import _Option, unset

    _original = _Option.current
    if not {"value", "_default"} <= set(_Option.__slots__):
        raise AttributeError("_Option.value/_default")
    MISSING: str | None = None
except (ImportError, AttributeError) as exc:  # renamed or moved in this mitmproxy
    MISSING = str(exc)


def _current(self: Any) -> Any:
    value = self._default if self.value is unset else self.value
    if type(value) in _IMMUTABLE:
        return value
    return copy.deepcopy(value)


def install() -> bool:
    """Apply once per process; ``False``, with one warning, when this mitmproxy's options are
    not what the patch relies on."""
    if MISSING is not None or not isinstance(_original, types.FunctionType):
        degrade(PATCH, f"mitmproxy.optmanager._Option ({MISSING})", "every read copies")
        return False
    if _Option.current is not _current:
        _Option.current = _current  # type: ignore[method-assign]
    return True
