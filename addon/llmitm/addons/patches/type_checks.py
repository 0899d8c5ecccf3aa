"""mitmproxy's type checks without the reference cycles that keep a flow's frames alive.

mitmproxy checks every field of every request and response it makes (``MessageData`` runs
``typecheck.check_option_type`` on each field unless Python runs with ``-O``). That function
makes its ``TypeError`` before it knows whether it will raise, and keeps it in a local; for an
optional field holding ``None`` (``trailers``, a streamed message's ``content``, an open
message's ``timestamp_end``) it tries the other member of the union first, which raises. The
raised error's traceback holds the frame whose local holds the error: a cycle, and the frame
holds its callers' frames with all their locals — the message, the flow's layer, the event.
Reference counting never frees them; they wait for a full collection of the garbage
collector, which a busy proxy runs seldom. A wave of 200 concurrent streams left some 2,600
such errors and 11,000 frames to it.

:func:`install` replaces ``check_option_type`` with one that decides first and makes an
error only to raise it, so nothing refers back to the raising frame; what it accepts and the
messages it raises are mitmproxy's, and :func:`install` proves that on a set of probes before
it applies. It is pinned by ``mitmproxy < 13``; when the function is not there or a probe
disagrees, it logs once and leaves mitmproxy's function in place.
"""

from __future__ import annotations

import io
import types
import typing
from collections import abc
from typing import Any, TextIO

from llmitm.addons.patches.fallback import degrade

PATCH = "type checks without reference cycles"

try:
    from mitmproxy.utils import typecheck

    _original = typecheck.check_option_type
    MISSING: str | None = None
except (ImportError, AttributeError) as exc:  # renamed or moved in this mitmproxy
    MISSING = str(exc)

_UNIONS = (typing.Union, types.UnionType)
_STREAM_TYPES = (typing.TextIO, typing.BinaryIO)


def _mismatch(name: str, value: Any, typeinfo: Any) -> str | None:
    """Why ``value`` is not of ``typeinfo`` in mitmproxy's words, or ``None`` when it is.

    Each branch is the one of mitmproxy's function with the same test, in the same order."""
    origin = typing.get_origin(typeinfo)
    if origin in _UNIONS:
        for member in typing.get_args(typeinfo):
            if _mismatch(name, value, member) is None:
                return None
        return _expected(name, value, typeinfo)
    if origin is tuple:
        members = typing.get_args(typeinfo)
        if not isinstance(value, (tuple, list)) or len(members) != len(value):
            return _expected(name, value, typeinfo)
        for i, (item, member) in enumerate(zip(value, members, strict=True)):
            if (why := _mismatch(f"{name}[{i}]", item, member)) is not None:
                return why
        return None
    if origin is abc.Sequence:
        if not isinstance(value, (tuple, list)):
            return _expected(name, value, typeinfo)
        member = typing.get_args(typeinfo)[0]
        for item in value:
            if (why := _mismatch(name, item, member)) is not None:
                return why
        return None
    if origin is typing.IO or typeinfo in _STREAM_TYPES:
        return None if hasattr(value, "read") else _expected(name, value, typeinfo)
    if typeinfo is typing.Any:
        return None
    try:
        if isinstance(value, typeinfo) or (typeinfo is float and isinstance(value, int)):
            return None
    except TypeError as error:  # not a class (a generic alias): mitmproxy raises isinstance's
        return str(error)
    return _expected(name, value, typeinfo)


def _expected(name: str, value: Any, typeinfo: Any) -> str:
    return f"Expected {typeinfo} for {name}, but got {type(value)}."


def check_option_type(name: str, value: Any, typeinfo: Any) -> None:
    """mitmproxy's ``check_option_type``: raises ``TypeError`` when ``value`` is not of
    ``typeinfo``; the error is made only here, so no frame refers to it."""
    why = _mismatch(name, value, typeinfo)
    if why is not None:
        raise TypeError(why)


def _outcome(check: Any, probe: tuple[str, Any, Any]) -> str | None:
    try:
        check(*probe)
    except TypeError as error:
        return str(error)
    return None


def _probes() -> list[tuple[str, Any, Any]]:
    """Values of each kind mitmproxy's function tells apart, in and out of their type."""
    from mitmproxy.http import Headers

    headers = Headers()
    probes: list[tuple[str, Any, Any]] = []
    for typeinfo, good, bad in (
        (bytes | None, b"", "text"),
        (Headers | None, headers, {}),
        (typing.Optional[float], 1, "1"),  # noqa: UP045  (the typing spelling is its own case)
        (float, 1.5, None),
        (str, "a", b"a"),
        (tuple[str, int], ("a", 1), ("a", "b")),
        (typing.Sequence[str], ["a"], [1]),
        (abc.Sequence[str], ("a",), "a"),
        (TextIO, io.StringIO(), 1),
        (typing.IO[bytes], io.BytesIO(), None),
        (dict[str, int], {}, None),
        (int | dict[str, int], 1, {}),
        (Any, object(), None),
    ):
        probes += [("field", good, typeinfo), ("field", bad, typeinfo), ("field", None, typeinfo)]
    probes.append(("pair", ["a", 1, 2], tuple[str, int]))
    return probes


def install() -> bool:
    """Apply once per process; ``False``, with one warning, when this mitmproxy's function is
    missing or a probe tells the two apart."""
    if MISSING is not None or not isinstance(_original, types.FunctionType):
        degrade(PATCH, f"mitmproxy.utils.typecheck ({MISSING})", "its checks stay as they are")
        return False
    if typecheck.check_option_type is check_option_type:
        return True
    for probe in _probes():
        if _outcome(_original, probe) != _outcome(check_option_type, probe):
            degrade(PATCH, f"the checks as read here ({probe!r})", "its checks stay as they are")
            return False
    typecheck.check_option_type = check_option_type
    return True
