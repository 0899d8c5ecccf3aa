"""Which mitmproxy front end runs llmitm, and where mitmdump writes its lines.

The console addon draws a live view only under mitmdump; under mitmproxy's console UI or mitmweb
it stays out of the way. mitmproxy names its front end nowhere in the public API, so
:func:`front_end` tells them apart by the master's class (the console UI, whose module is
loaded exactly when it runs) and by the ``view`` addon that both UIs hold. If that module no
longer has ``ConsoleMaster``, the class name along the master's MRO is the fallback, with one
warning.

:func:`redirect_output` points the ``termlog`` and ``dumper`` addons' output files (attributes
of mitmproxy's own addons, not API) at another stream and returns how to undo it; an addon
without the attribute is left as it is.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from llmitm.addons.patches.fallback import degrade

PATCH = "front-end detection"

CONSOLE_MODULE = "mitmproxy.tools.console.master"

OUTPUTS = (("termlog", "logger", "file"), ("dumper", None, "outfp"))
"""(addon, child object or None, attribute) of each file mitmdump writes its lines to."""


def _console_master_class() -> type | None:
    # Only ever loaded, never imported here: importing it would load urwid into every mitmdump.
    module = sys.modules.get(CONSOLE_MODULE)
    if module is None:
        return None
    found = getattr(module, "ConsoleMaster", None)
    if not isinstance(found, type):
        degrade(PATCH, f"{CONSOLE_MODULE}.ConsoleMaster", "the UI is told by class name")
        return None
    return found


def is_console_ui(master: Any) -> bool:
    """Whether ``master`` is mitmproxy's console UI."""
    console = _console_master_class()
    if console is not None:
        return isinstance(master, console)
    return any(cls.__name__ == "ConsoleMaster" for cls in type(master).__mro__)


def front_end(master: Any) -> str | None:
    """``"console"``, ``"web"``, or ``None`` for mitmdump (and anything without a UI)."""
    if is_console_ui(master):
        return "console"
    if master.addons.get("view") is not None:
        return "web"
    return None


def redirect_output(master: Any, target: TextIO) -> list[tuple[Any, str, Any]]:
    """Send mitmdump's log and flow lines to ``target``; the (owner, attribute, old value)
    triples to set back when done."""
    restore: list[tuple[Any, str, Any]] = []
    for addon_name, child, attribute in OUTPUTS:
        addon = master.addons.get(addon_name)
        owner = getattr(addon, child, None) if child else addon
        if owner is not None and hasattr(owner, attribute):
            restore.append((owner, attribute, getattr(owner, attribute)))
            setattr(owner, attribute, target)
    return restore
