"""The one warning a patch logs when mitmproxy's internals are not what it expects.

Each patch checks its precondition once at start-up; when it fails, :func:`degrade` logs, once
per process, what is missing and what llmitm does instead, and the patch's public fallback
serves from then on. mitmproxy may load the addons more than once in a process (the in-process
master of the pytest plugin starts a master per session), so the set of reported patches is
module-global.
"""

from __future__ import annotations

import logging

from mitmproxy.version import VERSION

logger = logging.getLogger(__name__)

reported: set[str] = set()
"""Names of the patches that have logged their fallback in this process."""


def degrade(patch: str, missing: str, instead: str) -> None:
    """Log once per process that ``patch`` cannot apply because ``missing`` is not in this
    mitmproxy, and that llmitm does ``instead``."""
    if patch in reported:
        return
    reported.add(patch)
    logger.warning("llmitm: %s: mitmproxy %s lacks %s; %s", patch, VERSION, missing, instead)
