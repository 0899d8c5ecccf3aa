"""The recording options are parsed once, in configure, into the flow recorder's frozen
settings: what the hooks read is what the options said when they last changed, and a value
llmitm cannot use is refused there and leaves the settings as they were."""

from __future__ import annotations

import dataclasses

import pytest
from mitmproxy import exceptions
from mitmproxy.test import taddons

from llmitm.addons.record import LlmFlowRecorder
from llmitm.addons.record.options import NAMES, RecordSettings
from llmitm.addons.relay import LlmRelay
from llmitm.addons.settings import LlmitmSettings
from llmitm.addons.store import LlmStore
from llmitm.replay.pool import GLOBAL_SCOPE
from llmitm.replay.timing import Timing


def recorder() -> LlmFlowRecorder:
    return LlmFlowRecorder(LlmStore(LlmitmSettings()), LlmRelay())


def test_the_defaults_are_the_options_defaults() -> None:
    addon = recorder()
    with taddons.context(addon):
        assert addon.settings == RecordSettings()
        assert addon.settings.scope == GLOBAL_SCOPE and addon.settings.recording


def test_every_option_lands_in_the_settings() -> None:
    addon = recorder()
    with taddons.context(addon) as tctx:
        tctx.configure(
            addon,
            llmitm_record="replay-or-record",
            llmitm_recordings="recs",
            llmitm_allow_record_in_ci=True,  # CI refuses to record into a folder otherwise
            llmitm_replay_from="client",
            llmitm_match_profile="loose",
            llmitm_match_ignore=["messages.0.content"],
            llmitm_match_host=True,
            llmitm_scope="suite",
            llmitm_replay_timing="scale:2",
            llmitm_replay_cap_ms=1500,
            llmitm_export_timing="exact",
            llmitm_replay_report="report.json",
            llmitm_replay_exhausted="cycle",
            llmitm_strict_drift=True,
            llmitm_miss_status=409,
            llmitm_record_all=True,
        )
        settings = addon.settings
    assert (settings.mode, settings.recordings, settings.replay_from) == (
        "replay-or-record",
        "recs",
        "client",
    )
    assert settings.key_options.profile == "loose" and settings.key_options.match_host
    assert settings.key_options.ignore == ("messages.0.content",)
    assert settings.scope == "suite" and settings.timing == Timing(2.0, 1.5)
    assert (settings.export_timing, settings.report, settings.exhausted) == (
        "exact",
        "report.json",
        "cycle",
    )
    assert settings.strict_drift and settings.miss_status == 409 and settings.record_all
    assert settings.replaying and settings.recording


def test_a_refused_value_leaves_the_settings_as_they_were() -> None:
    addon = recorder()
    with taddons.context(addon) as tctx:
        tctx.configure(addon, llmitm_scope="kept", llmitm_replay_timing="realtime")
        before = addon.settings
        with pytest.raises(exceptions.OptionsError, match="replay timing"):
            tctx.configure(addon, llmitm_replay_timing="sometimes")
        with pytest.raises(exceptions.OptionsError, match="replay timing cap"):
            tctx.configure(addon, llmitm_replay_cap_ms=-1)
        with pytest.raises(exceptions.OptionsError, match="profile"):
            tctx.configure(addon, llmitm_match_profile="fuzzy")
        assert addon.settings == before


def test_the_settings_are_frozen_and_name_every_option() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        RecordSettings().mode = "off"  # type: ignore[misc]
    addon = recorder()
    with taddons.context(addon) as tctx:
        options = set(tctx.options.keys())
    declared = {name for name in options if name.startswith("llmitm_")}
    assert declared == NAMES  # only the recorder in this context: its options, all of them
