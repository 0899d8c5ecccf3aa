"""Call an event hook only on the addons that have it.

mitmproxy's ``AddonManager.trigger_event`` visits every addon of the chain for every event,
and for each one enters a ``safecall`` context manager, makes and awaits an ``invoke_addon``
coroutine and runs a generator over the addon and its children — also for the many addons
that have no method of that name. llmitm adds 39 addons to mitmdump's 36, and a flow raises
a dozen events (each lifecycle event is followed by an ``update``): about 1 ms of the proxy's
CPU per flow went into visiting addons that do nothing, ~5 µs per event of a 200-event stream
(a profile of 64 paced streams, one event per read, where no batching hides a per-flow cost).

:func:`install` replaces ``trigger_event`` with one that skips an addon when neither it nor
its children (``addons``) have the hook, looked up at call time (no cache: an addon added,
removed or changed later is seen at once), and otherwise does exactly what mitmproxy does.
It is pinned by ``mitmproxy < 13``; :func:`install` checks the names it relies on and, when
one is missing, logs once and leaves mitmproxy's own method in place.
"""

from __future__ import annotations

import types
from typing import Any

from llmitm.addons.patches.fallback import degrade

PATCH = "hook dispatch"

try:
    from mitmproxy import exceptions
    from mitmproxy.addonmanager import AddonManager, safecall

    _original = AddonManager.trigger_event
    AddonManager.invoke_addon  # noqa: B018  (checked here rather than at an event)
    MISSING: str | None = None
except (ImportError, AttributeError) as exc:  # renamed or moved in this mitmproxy
    MISSING = str(exc)


def _may_handle(addon: Any, name: str) -> bool:
    """Whether ``invoke_addon`` could find a handler for ``name`` on ``addon``: it has an
    attribute of that name (mitmproxy decides there whether it is callable) or children."""
    return getattr(addon, name, None) is not None or hasattr(addon, "addons")


async def _trigger_event(self: Any, event: Any) -> None:
    name = event.name
    for addon in self.chain:
        if not _may_handle(addon, name):
            continue
        try:
            with safecall():
                await self.invoke_addon(addon, event)
        except exceptions.AddonHalt:
            return


def install() -> bool:
    """Apply once per process; ``False``, with one warning, when this mitmproxy lacks what
    the patch relies on."""
    if MISSING is not None or not isinstance(_original, types.FunctionType):
        degrade(PATCH, f"AddonManager.trigger_event ({MISSING})", "every addon is visited")
        return False
    if AddonManager.trigger_event is not _trigger_event:
        AddonManager.trigger_event = _trigger_event  # type: ignore[method-assign]
    return True
