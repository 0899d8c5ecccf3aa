"""The CI guard of record/replay: where a CI job may not record.

A CI run is meant to *replay* the recordings a developer committed. The harm a recording mode
does there is to the committed folder: ``once`` and ``replay-or-record`` answer a miss from
the live upstream (so the test passes on an answer nobody reviewed, with CI's credentials)
and, like ``record`` and ``rewrite``, write the folder at shutdown — a CI job that commits,
caches or uploads its workspace then ships recordings no developer made. So with ``CI`` set
(``true``, ``1`` or ``yes``, as CI services set it), a recording mode *with a recordings
folder* (``llmitm_recordings``) refuses to start unless ``llmitm_allow_record_in_ci`` says
this job records on purpose.

Recording into the local store only — llmitm's default, ``llmitm_record=record`` with no
folder — stays allowed: the store is this machine's debugging history, never committed, and
refusing it would stop llmitm from working as a plain (inspecting, translating) proxy in any
CI job, this project's own end-to-end suite included.
"""

from __future__ import annotations

from collections.abc import Mapping

CI_VALUES = frozenset({"true", "1", "yes"})


def in_ci(environ: Mapping[str, str]) -> bool:
    """Whether the environment says this is a CI run (``CI=true``, ``CI=1``, ``CI=yes``)."""
    return environ.get("CI", "").strip().lower() in CI_VALUES


def record_refusal(
    mode: str, recording: bool, folder: str, allowed: bool, environ: Mapping[str, str]
) -> str | None:
    """Why this configuration may not start (``None``: it may). ``recording``: whether
    ``mode`` records."""
    if not recording or not folder or allowed or not in_ci(environ):
        return None
    return (
        f"llmitm_record={mode} would record into the recordings folder {folder} in CI "
        f"(CI={environ.get('CI', '')}): CI should replay what was committed. Use "
        "--set llmitm_record=replay, or --set llmitm_allow_record_in_ci=true if this job "
        "records on purpose."
    )
