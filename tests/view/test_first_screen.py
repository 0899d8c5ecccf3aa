"""The first screen from plain facts: where llmitm listens and in which mode, what the
configuration routes, where calls are recorded, the CA, and the line that points an SDK, an app
or a command at it — a line a reader (or a test) can copy as it is."""

from __future__ import annotations

import shlex

from hypothesis import given
from hypothesis import strategies as st

from llmitm.view.first_screen import Listener, ScreenFacts, first_screen, listener_address

CA = "/home/u/.mitmproxy/mitmproxy-ca-cert.pem"
STORE = "/home/u/.local/share/llmitm/llmitm.db"
REGULAR = Listener("regular", "regular", "127.0.0.1:8080")
REVERSE = Listener("reverse", "reverse:https://api.openai.com@8081", "127.0.0.1:8081")


def facts(**changes: object) -> ScreenFacts:
    base: dict[str, object] = {
        "version": "9.9",
        "listeners": (REGULAR,),
        "config": None,
        "store": STORE,
        "ca_file": CA,
    }
    return ScreenFacts(**{**base, **changes})  # type: ignore[arg-type]


def field(lines: list[str], label: str) -> str | None:
    """The text after ``label`` on its line, ``None`` when no line has it."""
    for line in lines:
        head, _, rest = line.strip().partition(" ")
        if head == label:
            return rest.strip()
    return None


def test_the_defaults_say_where_what_is_recorded_and_how_to_point_a_client() -> None:
    lines = first_screen(facts())
    assert lines[0] == "llmitm 9.9 listening at 127.0.0.1:8080 (HTTP(S) proxy)"
    assert field(
        lines,
        "config",
    ).startswith("none: OpenAI and Azure traffic passes through")
    assert field(lines, "store") == f"{STORE}; recording every call"
    assert field(lines, "CA") == CA
    assert field(lines, "sdk") == f"HTTPS_PROXY=http://127.0.0.1:8080 SSL_CERT_FILE={CA}"
    assert field(lines, "app") == "proxy http://127.0.0.1:8080, trusting the CA above"
    assert field(lines, "command") == "llmitm run -- <cmd> sets them for one command"


def test_the_sdk_line_is_shell_assignments_an_environment_can_take() -> None:
    sdk = field(first_screen(facts()), "sdk")
    assert sdk is not None
    assigned = dict(word.split("=", 1) for word in shlex.split(sdk))
    assert assigned == {"HTTPS_PROXY": "http://127.0.0.1:8080", "SSL_CERT_FILE": CA}


def test_a_reverse_listener_gives_a_base_url_and_names_its_target() -> None:
    lines = first_screen(facts(listeners=(REVERSE,)))
    assert lines[0].endswith("127.0.0.1:8081 (reverse proxy to https://api.openai.com)")
    assert field(lines, "sdk") == "OPENAI_BASE_URL=http://127.0.0.1:8081/v1"
    assert field(lines, "app") is None  # nothing to set as a proxy


def test_reverse_and_regular_together_give_the_base_url_and_the_proxy() -> None:
    lines = first_screen(facts(listeners=(REGULAR, REVERSE)))
    assert "127.0.0.1:8080 (HTTP(S) proxy), 127.0.0.1:8081 (reverse" in lines[0]
    assert field(lines, "sdk") == "OPENAI_BASE_URL=http://127.0.0.1:8081/v1"
    assert field(lines, "app") == "proxy http://127.0.0.1:8080, trusting the CA above"


def test_socks5_alone_gives_all_proxy() -> None:
    lines = first_screen(facts(listeners=(Listener("socks5", "socks5", "127.0.0.1:1080"),)))
    assert field(lines, "sdk") == f"ALL_PROXY=socks5h://127.0.0.1:1080 SSL_CERT_FILE={CA}"
    assert lines[0].endswith("(SOCKS5 proxy)")


def test_a_configuration_lists_its_endpoints_and_routes_by_name() -> None:
    lines = first_screen(
        facts(config="llmitm.toml", endpoints=("local", "azure"), routes=("coding",))
    )
    assert field(lines, "config") == "llmitm.toml: 2 endpoints (local, azure), 1 route (coding)"
    empty = first_screen(facts(config="empty.toml"))
    assert field(empty, "config") == "empty.toml: 0 endpoints, 0 routes"


def test_what_the_recording_mode_does_is_spelled_out() -> None:
    assert field(first_screen(facts(record_mode="off")), "store") == f"{STORE}; recording off"
    assert field(first_screen(facts(store=None)), "store") == "none: nothing is recorded"
    assert field(first_screen(facts(store=None, record_mode="off")), "store") == "none"
    replay = first_screen(facts(record_mode="replay", recordings="tests/recordings"))
    assert field(replay, "store") == (
        f"{STORE}; replaying only, never going upstream (folder tests/recordings)"
    )


def test_a_wrapped_command_is_said_to_run_with_the_variables() -> None:
    lines = first_screen(facts(wrapped=True))
    assert field(lines, "command") == "running now, with the proxy and CA variables set"


def test_a_listener_without_an_address_is_named_by_its_mode() -> None:
    lines = first_screen(facts(listeners=(Listener("local", "local", None),)))
    assert lines[0] == "llmitm 9.9 listening at local capture"
    assert field(lines, "sdk") is None


def test_the_sdk_line_skips_a_listener_without_an_address() -> None:
    unbound = Listener("regular", "regular", None)
    lines = first_screen(facts(listeners=(unbound, REGULAR)))
    assert field(lines, "sdk") == f"HTTPS_PROXY=http://127.0.0.1:8080 SSL_CERT_FILE={CA}"
    assert field(lines, "app") == "proxy http://127.0.0.1:8080, trusting the CA above"


def test_listener_addresses_are_what_a_client_dials() -> None:
    assert listener_address([("0.0.0.0", 8080)]) == "127.0.0.1:8080"
    assert listener_address([("::", 8080, 0, 0)]) == "127.0.0.1:8080"
    assert listener_address([("::1", 8080, 0, 0)]) == "[::1]:8080"
    assert listener_address([("192.168.1.5", 80), ("::1", 80)]) == "192.168.1.5:80"
    assert listener_address([]) is None


KINDS = ("regular", "upstream", "reverse", "socks5", "transparent", "local", "dns", "wireguard")
listeners = st.builds(
    Listener,
    kind=st.sampled_from(KINDS),
    spec=st.sampled_from(["regular", "reverse:http://127.0.0.1:9", "upstream:http://p:3128"]),
    address=st.one_of(st.none(), st.builds("127.0.0.1:{}".format, st.integers(1, 65535))),
)


@given(st.lists(listeners, max_size=4), st.booleans(), st.booleans())
def test_every_screen_is_a_few_single_lines_and_points_a_client_when_one_can(
    servers: list[Listener], wrapped: bool, configured: bool
) -> None:
    screen = facts(
        listeners=tuple(servers),
        wrapped=wrapped,
        config="c.toml" if configured else None,
        routes=("r",) if configured else (),
    )
    lines = first_screen(screen)
    assert 5 <= len(lines) <= 8
    assert all("\n" not in line for line in lines)
    assert lines[0].startswith("llmitm 9.9 listening at ")
    carriers = [s for s in servers if s.address and s.kind in ("regular", "upstream", "reverse")]
    socks = [s for s in servers if s.address and s.kind == "socks5"]
    assert (field(lines, "sdk") is not None) == bool(carriers or socks)
    for server in servers:
        if server.address:
            assert server.address in lines[0]
