"""The pytest plugin's settings, run by pytester in an inner pytest process: every
``--llmitm-*`` option has help text and an ``llmitm_*`` ini setting, the command line wins
over the ini and the ``llmitm`` marker over both, and a suite that uses the plugin gets no
third-party warnings in its summary. No call goes anywhere: only the settings the proxy
started with are looked at."""

from __future__ import annotations

import os

import pytest

from llmitm.testing.pytest_plugin import MODES, OPTIONS

pytest_plugins = ["pytester"]

# The inner tests report what the plugin gave them; the outer test reads it from stdout.
SUITE = """
import pytest


def test_session(llmitm):
    print(f"@ session mode={llmitm.mode} scope={llmitm.scope} "
          f"ignore={','.join(llmitm.proxy.settings.match_ignore) or '-'} "
          f"folder={llmitm.proxy.folder.name}")


@pytest.mark.llmitm(record_mode="off", scope="shared-answers", match_ignore=["model"])
def test_marked(llmitm):
    print(f"@ marked mode={llmitm.mode} scope={llmitm.scope} "
          f"ignore={','.join(llmitm.proxy.settings.match_ignore)} url={llmitm.base_url}")


@pytest.mark.llmitm(record_mode="once")
class TestClass:
    @pytest.mark.llmitm(record_mode="off")
    def test_own(self, llmitm):
        print(f"@ own mode={llmitm.mode}")

    def test_inherits(self, llmitm):
        print(f"@ inherits mode={llmitm.mode}")
"""


@pytest.fixture
def inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    for name in list(os.environ):
        if name.startswith(("OPENAI_", "HTTPS_PROXY", "https_proxy", "PYTEST_ADDOPTS")):
            monkeypatch.delenv(name)
    monkeypatch.delenv("CI", raising=False)
    return pytester


def reports(result: pytest.RunResult) -> dict[str, str]:
    """``@ name rest`` lines of the inner run, by name."""
    found = {}
    for line in result.stdout.lines:
        at = line.find("@ ")
        if at >= 0:
            name, _, rest = line[at + 2 :].partition(" ")
            found[name] = rest
    return found


def test_help_shows_every_option_and_ini_setting_with_its_text(inner: pytest.Pytester) -> None:
    result = inner.runpytest("--help", "-p", "no:asyncio")  # in this process: nothing starts
    assert result.ret == 0
    text = " ".join(result.stdout.str().split())  # help wraps lines anywhere
    assert "llmitm record and replay:" in result.stdout.str()
    for option in OPTIONS:
        words = " ".join(option.help.split()[:6])
        # Once beside the flag, once beside the ini name.
        assert f"{option.flag}" in text and text.count(words) >= 2, option.flag
        assert f"{option.ini} (" in text, option.ini
    assert f"One of: {', '.join(MODES)}" in text


def test_markers_lists_the_llmitm_marker(inner: pytest.Pytester) -> None:
    result = inner.runpytest("--markers", "-p", "no:asyncio")
    result.stdout.fnmatch_lines(["@pytest.mark.llmitm(record_mode=None, scope=None, *"])


@pytest.mark.slow  # starts llmitm's in-process proxy in an inner pytest process
def test_ini_settings_are_used_and_the_command_line_wins(inner: pytest.Pytester) -> None:
    inner.makepyfile(test_suite=SUITE)
    inner.makeini(
        """
        [pytest]
        llmitm_record_mode = off
        llmitm_recordings = from-ini
        llmitm_match_ignore =
            messages.0.content
            tools.*.description
        """
    )
    from_ini = inner.runpytest_subprocess("-s", "-k", "test_session", timeout=120)
    from_ini.assert_outcomes(passed=1)
    assert reports(from_ini)["session"] == (
        "mode=off scope=test_suite.py::test_session "
        "ignore=messages.0.content,tools.*.description folder=from-ini"
    )

    given = inner.runpytest_subprocess(
        "-s", "-k", "test_session", "--llmitm-record-mode=once",
        "--llmitm-recordings=from-cli", "--llmitm-match-ignore=model", timeout=120,
    )  # fmt: skip
    given.assert_outcomes(passed=1)
    assert reports(given)["session"] == (
        "mode=once scope=test_suite.py::test_session ignore=model folder=from-cli"
    )


@pytest.mark.slow
def test_marker_wins_over_command_line_and_ini(inner: pytest.Pytester) -> None:
    inner.makepyfile(test_suite=SUITE)
    inner.makeini("[pytest]\nllmitm_record_mode = record\n")
    result = inner.runpytest_subprocess("-s", "--llmitm-record-mode=rewrite", timeout=180)
    result.assert_outcomes(passed=4)
    seen = reports(result)
    assert seen["session"].startswith("mode=rewrite ")
    marked = seen["marked"]
    assert marked.startswith("mode=off scope=shared-answers ignore=model url=http://127.0.0.1:")
    assert marked.endswith("/llmitm-scope/shared-answers/v1")
    assert seen["own"] == "mode=off"  # the test's marker over its class's
    assert seen["inherits"] == "mode=once"


@pytest.mark.slow
def test_bad_settings_are_one_clear_line(inner: pytest.Pytester) -> None:
    inner.makepyfile(
        test_suite="""
        import pytest

        @pytest.mark.llmitm(record_mode="sometimes")
        def test_bad_mode(llmitm):
            pass

        @pytest.mark.llmitm(recordmode="off")
        def test_typo(llmitm):
            pass
        """
    )
    result = inner.runpytest_subprocess(timeout=120)
    result.assert_outcomes(errors=2)
    output = result.stdout.str()
    assert "llmitm marker: record_mode='sometimes'; expected one of replay, once" in output
    assert "llmitm marker: unknown argument(s) recordmode; it takes record_mode" in output
    assert "Traceback" not in output

    inner.makeini("[pytest]\nllmitm_record_mode = sometimes\n")
    refused = inner.runpytest_subprocess(timeout=120)
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    assert "llmitm_record_mode = 'sometimes' in the ini file" in refused.stderr.str()


NO_CALLS = """
def test_uses_the_proxy(llmitm):
    assert llmitm.proxy.server is not None
"""


@pytest.mark.slow
def test_a_suite_using_the_plugin_shows_no_warnings_summary(inner: pytest.Pytester) -> None:
    inner.makepyfile(test_suite=NO_CALLS)
    result = inner.runpytest_subprocess("-W", "default", "--llmitm-record-mode=off", timeout=120)
    result.assert_outcomes(passed=1)
    assert "warnings summary" not in result.stdout.str()

    # The same import without the plugin's filter: the warnings it keeps out are real.
    inner.makepyfile(
        test_suite="""
        def test_imports_mitmproxy_itself():
            import mitmproxy.addons  # pulls in ldap3, which warns about pyasn1 names
        """
    )
    control = inner.runpytest_subprocess("-W", "default", "-p", "no:llmitm", timeout=120)
    control.assert_outcomes(passed=1)
    assert "warnings summary" in control.stdout.str()
    assert "tagMap is deprecated" in control.stdout.str()
