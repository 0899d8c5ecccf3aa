"""The recording addons' options, declared once, and the settings they are parsed into.

:func:`add_options` declares every ``llmitm_record…``/``llmitm_replay…`` option for the flow
recorder's ``load``; its ``configure`` parses them into one frozen :class:`RecordSettings`
(:func:`read_settings`), which every hook reads instead of the options.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from mitmproxy.addonmanager import Loader

from llmitm.replay import folder as folder_format
from llmitm.replay.keys import PROFILES, KeyOptions
from llmitm.replay.pool import GLOBAL_SCOPE, ON_EXHAUSTED, OnExhausted
from llmitm.replay.timing import Timing, parse_timing

MODES = ("off", "record", "rewrite", "once", "replay-or-record", "replay")
REPLAYING = frozenset({"once", "replay-or-record", "replay"})
RECORDING = frozenset({"record", "rewrite", "once", "replay-or-record"})
REPLAY_FROM = ("upstream", "client")

CHOICES: dict[str, Sequence[str]] = {
    "llmitm_record": MODES,
    "llmitm_replay_from": REPLAY_FROM,
    "llmitm_match_profile": tuple(PROFILES),
    "llmitm_export_timing": folder_format.TIMINGS,
    "llmitm_replay_exhausted": ON_EXHAUSTED,
}
NAMES = frozenset(
    {
        "llmitm_record",
        "llmitm_recordings",
        "llmitm_replay_from",
        "llmitm_match_profile",
        "llmitm_match_ignore",
        "llmitm_scope",
        "llmitm_replay_timing",
        "llmitm_replay_cap_ms",
        "llmitm_export_timing",
        "llmitm_replay_report",
        "llmitm_replay_exhausted",
        "llmitm_strict_drift",
        "llmitm_match_host",
        "llmitm_miss_status",
        "llmitm_miss_advice",
        "llmitm_record_all",
        "llmitm_allow_record_in_ci",
    }
)
"""Every option the recording addons read."""
MODE_OPTIONS = frozenset({"llmitm_record", "llmitm_recordings", "llmitm_allow_record_in_ci"})
"""The options the CI guard weighs (:func:`llmitm.replay.ci_guard.record_refusal`)."""


@dataclass(frozen=True, slots=True)
class RecordSettings:
    """The recording options, parsed."""

    mode: str = "record"
    """The mode in force: ``llmitm_record``, or ``off`` while the CI guard refuses it."""
    recordings: str = ""
    replay_from: str = "upstream"
    key_options: KeyOptions = field(default_factory=KeyOptions)
    scope: str = GLOBAL_SCOPE
    """The scope of a request that names none."""
    timing: Timing = field(default_factory=Timing)
    export_timing: str = "coarse"
    report: str = ""
    exhausted: OnExhausted = "error"
    strict_drift: bool = False
    miss_status: int = 400
    miss_advice: str = ""
    """What a miss tells the user to do (empty: llmitm's own commands and options)."""
    record_all: bool = False

    @property
    def replaying(self) -> bool:
        return self.mode in REPLAYING

    @property
    def recording(self) -> bool:
        return self.mode in RECORDING


def read_settings(options: Any, mode: str) -> RecordSettings:
    """The settings ``options`` hold, with ``mode`` in force (the caller weighs the CI guard).
    Raises :class:`ValueError` with a message for the user on a value llmitm cannot use."""
    timing = parse_timing(options.llmitm_replay_timing, options.llmitm_replay_cap_ms)
    key_options = KeyOptions(
        profile=options.llmitm_match_profile,
        ignore=tuple(options.llmitm_match_ignore),
        match_host=options.llmitm_match_host,
    )
    if not 400 <= options.llmitm_miss_status <= 599:
        raise ValueError(
            f"llmitm_miss_status must be an HTTP error status (400-599), not "
            f"{options.llmitm_miss_status}"
        )
    return RecordSettings(
        mode=mode,
        recordings=options.llmitm_recordings,
        replay_from=options.llmitm_replay_from,
        key_options=key_options,
        scope=options.llmitm_scope or GLOBAL_SCOPE,
        timing=timing,
        export_timing=options.llmitm_export_timing,
        report=options.llmitm_replay_report,
        exhausted=cast(OnExhausted, options.llmitm_replay_exhausted),
        strict_drift=bool(options.llmitm_strict_drift),
        miss_status=options.llmitm_miss_status,
        miss_advice=options.llmitm_miss_advice,
        record_all=bool(options.llmitm_record_all),
    )


def add_options(loader: Loader) -> None:
    """Declare the recording options (the flow recorder's ``load``)."""
    loader.add_option(
        "llmitm_record",
        str,
        "record",
        "Record and replay LLM API flows: off, record (into the store), rewrite (wipe "
        "each scope first), once, replay-or-record, replay (never forwards).",
        choices=list(MODES),
    )
    loader.add_option(
        "llmitm_recordings",
        str,
        "",
        "A recordings folder: replay reads it (instead of the store); recording modes "
        "write it at shutdown.",
    )
    loader.add_option(
        "llmitm_replay_from",
        str,
        "upstream",
        "Replay the recorded upstream response through today's translator (upstream) "
        "or the recorded client response byte for byte (client).",
        choices=list(REPLAY_FROM),
    )
    loader.add_option(
        "llmitm_match_profile",
        str,
        "default",
        "Which request fields match keys ignore: default, strict, loose.",
        choices=list(PROFILES),
    )
    loader.add_option(
        "llmitm_match_ignore",
        Sequence[str],
        [],
        "Dotted body paths match keys ignore (e.g. messages.0.content, tools.*.description).",
    )
    loader.add_option(
        "llmitm_scope",
        str,
        GLOBAL_SCOPE,
        "Scope of requests without an x-llmitm-scope / x-test-id header.",
    )
    loader.add_option(
        "llmitm_replay_timing",
        str,
        "instant",
        "Replay pacing: instant (CI), realtime (recorded time to first byte and gaps), or "
        "scale:F (F times the recorded times). Paced answers stream through the relay.",
    )
    loader.add_option(
        "llmitm_replay_cap_ms",
        int,
        0,
        "Longest single wait of a paced replay, in milliseconds (0: no cap).",
    )
    loader.add_option(
        "llmitm_export_timing",
        str,
        "coarse",
        "Chunk offsets in a recordings folder written at shutdown: coarse (10 ms: "
        "re-recording churns less), exact, or none.",
        choices=list(folder_format.TIMINGS),
    )
    loader.add_option(
        "llmitm_replay_report",
        str,
        "",
        "Write a JSON report of replay hits, misses, unused recordings and drift here at shutdown.",
    )
    loader.add_option(
        "llmitm_replay_exhausted",
        str,
        "error",
        "A request whose recordings were all used: error (a miss), repeat_last (the last "
        "one again) or cycle (all of them again, in order).",
        choices=list(ON_EXHAUSTED),
    )
    loader.add_option(
        "llmitm_strict_drift",
        bool,
        False,
        "Refuse a replay hit (400) whose upstream request llmitm builds differently today "
        "than when it was recorded, instead of only warning.",
    )
    loader.add_option(
        "llmitm_match_host",
        bool,
        False,
        "Count the request's host in match keys.",
    )
    loader.add_option(
        "llmitm_miss_status",
        int,
        400,
        "HTTP status of a strict replay miss (400-599; SDKs retry a 5xx, but the miss "
        "says x-should-retry: false).",
    )
    loader.add_option(
        "llmitm_miss_advice",
        str,
        "",
        "What a strict replay miss tells the user to do, in its answer and its log line "
        "(default: llmitm's own commands and --set options).",
    )
    loader.add_option(
        "llmitm_record_all",
        bool,
        False,
        "Record (and replay) every flow through the proxy, not only LLM API calls (chat, "
        "Responses and Azure calls, Responses state calls).",
    )
    loader.add_option(
        "llmitm_allow_record_in_ci",
        bool,
        False,
        "Let a recording mode write llmitm_recordings when CI=true (refused otherwise).",
    )
