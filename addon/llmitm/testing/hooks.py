"""The hooks the llmitm pytest plugin adds to pytest (registered with ``add_hookspecs``).

Implement them in a ``conftest.py`` or a plugin, as any pytest hook.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from llmitm.replay.model import Interaction


@pytest.hookspec
def pytest_llmitm_before_record(interaction: Interaction) -> Interaction | None:
    """Filter or edit what the plugin records, as VCR's ``before_record_request`` and
    ``before_record_response`` do.

    Called once per finished API call in a recording mode, after llmitm redacted its
    credentials, before it is kept for the recordings folder. Return the interaction
    (changed in place or not) to keep it, or ``None`` to record nothing for that call. With
    several implementations each gets what the one before returned; the first ``None``
    stops. ``interaction.scope`` is the test's scope (its node id, or the marker's
    ``scope``); ``interaction.legs`` holds ``client_req``, ``upstream_req``,
    ``upstream_resp`` and ``client_resp`` messages.

    Runs in the proxy's thread, not the test's. An exception drops that recording (it is
    logged): llmitm never writes what a broken filter was meant to change. Editing a request
    leg's body changes the recording's match key when the folder is read back; to make a
    field not count, use ``match_ignore`` instead.
    """
    return None
