"""What llmitm's hosts (:mod:`llmitm.addons.hosts`) assume about how a mitmproxy master is built.

:func:`with_llmitm` puts llmitm's addons into mitmproxy's default chain where mitmdump's ``-s``
script loader would load them: right after ``ScriptLoader``, so they see a flow before
``mapremote``, ``save`` and the dumper, as they do under ``mitmdump -s``. When this mitmproxy
has no ``ScriptLoader`` in its defaults, they go after the whole chain instead (one warning):
every hook still runs, later than those addons' own.

:func:`uninstall_log_handlers` removes the root-logger handler a master installs to relay
records to its addons, which the master's own ``done`` removes but a master that died in
start-up never reaches; it finds the handler through the public logging API rather than the
master's private attribute, so nothing is left to fall back from.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from llmitm.addons.patches.fallback import degrade

try:
    from mitmproxy.addons.script import ScriptLoader
except (ImportError, AttributeError):  # moved or renamed in this mitmproxy
    ScriptLoader = None  # type: ignore[assignment,misc]

try:
    from mitmproxy.log import MitmLogHandler
except (ImportError, AttributeError):
    MitmLogHandler = None  # type: ignore[assignment,misc]

PATCH = "addon order"


def with_llmitm(chain: Sequence[Any], ours: Sequence[Any]) -> list[Any]:
    """``chain`` (mitmproxy's default addons) with ``ours`` in the script loader's place."""
    chain = list(chain)
    after = next(
        (
            i + 1
            for i, addon in enumerate(chain)
            if ScriptLoader and isinstance(addon, ScriptLoader)
        ),
        None,
    )
    if after is None:
        degrade(
            PATCH,
            "a ScriptLoader among its default addons",
            "llmitm's addons run after all of mitmproxy's (mapremote, save and the dumper see "
            "a flow before llmitm changes it)",
        )
        return [*chain, *ours]
    chain[after:after] = ours
    return chain


def uninstall_log_handlers(master: Any) -> int:
    """Remove the logging handlers ``master`` installed on the root logger; how many."""
    if MitmLogHandler is None:
        return 0
    root = logging.getLogger()
    mine = [
        handler
        for handler in root.handlers
        if isinstance(handler, MitmLogHandler) and getattr(handler, "master", None) is master
    ]
    for handler in mine:
        root.removeHandler(handler)
    return len(mine)
