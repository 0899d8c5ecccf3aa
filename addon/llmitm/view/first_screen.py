"""The first screen: the few lines llmitm prints once it listens, saying what it is doing and
how to point a client at it.

Plain facts in (:class:`ScreenFacts`, gathered by ``addons.first_screen``), lines out
(:func:`first_screen`). The ``sdk`` line is meant to be copied (and is parsed by a test): it is
``OPENAI_BASE_URL=…`` when a reverse listener can carry OpenAI calls, else ``HTTPS_PROXY=…
SSL_CERT_FILE=…`` for a regular or upstream listener, else ``ALL_PROXY=…`` for SOCKS5.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

PROXY_KINDS = ("regular", "upstream")
# mitmproxy's mode names, as a reader calls them.
_KIND_NAMES = {
    "regular": "HTTP(S) proxy",
    "upstream": "HTTP(S) proxy to an upstream proxy",
    "reverse": "reverse proxy",
    "socks5": "SOCKS5 proxy",
    "transparent": "transparent proxy",
    "local": "local capture",
    "wireguard": "WireGuard server",
    "tun": "TUN interface",
    "dns": "DNS server",
}
# Recording modes (the llmitm_record option) and what each does with a call.
_RECORD_MODES = {
    "off": "recording off",
    "record": "recording every call",
    "rewrite": "recording every call (each scope wiped first)",
    "once": "replaying what is recorded, recording the rest",
    "replay-or-record": "replaying what is recorded, recording the rest",
    "replay": "replaying only, never going upstream",
}


@dataclass(frozen=True, slots=True)
class Listener:
    kind: str
    """mitmproxy's mode name: ``regular``, ``reverse``, ``socks5``, …"""
    spec: str
    """The full mode spec, e.g. ``reverse:https://api.openai.com``."""
    address: str | None
    """``host:port`` a client connects to (loopback for a wildcard); ``None``: no address."""


@dataclass(frozen=True, slots=True)
class ScreenFacts:
    version: str
    listeners: tuple[Listener, ...]
    config: str | None
    """The configuration file, ``None`` for the embedded defaults."""
    endpoints: tuple[str, ...] = ()
    routes: tuple[str, ...] = ()
    store: str | None = None
    """The SQLite store, ``None`` when there is none."""
    record_mode: str = "record"
    recordings: str = ""
    """A recordings folder (``--record``/``--replay DIR``), empty when none."""
    ca_file: str = ""
    wrapped: bool = False
    """A command runs under this proxy (``llmitm run -- CMD``), which gets its variables."""


def listener_address(addresses: Sequence[Sequence[object]]) -> str | None:
    """``host:port`` of a listener's first address for a URL, loopback for a wildcard."""
    if not addresses:
        return None
    host, port = str(addresses[0][0]), addresses[0][1]
    host = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
    host = f"[{host}]" if ":" in host else host  # an IPv6 literal in a URL
    return f"{host}:{port}"


def first_screen(facts: ScreenFacts) -> list[str]:
    """The lines to print, in order; none is longer than it must be."""
    lines = [_listening(facts)]
    lines.append(_field("config", _config(facts)))
    lines.append(_field("store", _store(facts)))
    if facts.ca_file:
        lines.append(_field("CA", facts.ca_file))
    lines += _pointers(facts)
    return lines


def _field(label: str, text: str) -> str:
    return f"  {label:<8} {text}"


def _listening(facts: ScreenFacts) -> str:
    described = [
        f"{listener.address} ({_mode(listener)})" if listener.address else _mode(listener)
        for listener in facts.listeners
    ]
    where = ", ".join(described) if described else "nothing"
    return f"llmitm {facts.version} listening at {where}"


def _mode(listener: Listener) -> str:
    name = _KIND_NAMES.get(listener.kind, listener.kind)
    if listener.kind not in ("reverse", "upstream"):
        return name
    target = listener.spec.partition(":")[2]
    if "@" in target:  # ``reverse:URL@port``: the listen address, said already
        target = target.rpartition("@")[0]
    return f"{name} to {target}" if target else name


def _config(facts: ScreenFacts) -> str:
    if facts.config is None:
        return "none: OpenAI and Azure traffic passes through unchanged (--config FILE routes)"
    return (
        f"{facts.config}: {_counted(facts.endpoints, 'endpoint')}, "
        f"{_counted(facts.routes, 'route')}"
    )


def _counted(names: Sequence[str], noun: str) -> str:
    plural = noun if len(names) == 1 else noun + "s"
    listed = f" ({', '.join(names)})" if names else ""
    return f"{len(names)} {plural}{listed}"


def _store(facts: ScreenFacts) -> str:
    mode = _RECORD_MODES.get(facts.record_mode, facts.record_mode)
    if facts.recordings:
        return f"{facts.store or 'no store'}; {mode} (folder {facts.recordings})"
    if facts.store is None:
        recording = "" if facts.record_mode == "off" else ": nothing is recorded"
        return f"none{recording}"
    return f"{facts.store}; {mode}"


def _pointers(facts: ScreenFacts) -> list[str]:
    """One line each for an SDK, a proxy-aware app and a wrapped command."""
    reverse = _first(facts, ("reverse",))
    proxy = _first(facts, PROXY_KINDS)
    socks = _first(facts, ("socks5",))
    lines: list[str] = []
    if reverse is not None:
        lines.append(_field("sdk", f"OPENAI_BASE_URL=http://{reverse.address}/v1"))
    elif proxy is not None:
        lines.append(
            _field("sdk", f"HTTPS_PROXY=http://{proxy.address} SSL_CERT_FILE={facts.ca_file}")
        )
    elif socks is not None:
        lines.append(
            _field("sdk", f"ALL_PROXY=socks5h://{socks.address} SSL_CERT_FILE={facts.ca_file}")
        )
    if proxy is not None:
        lines.append(_field("app", f"proxy http://{proxy.address}, trusting the CA above"))
    if facts.wrapped:
        lines.append(_field("command", "running now, with the proxy and CA variables set"))
    else:
        lines.append(_field("command", "llmitm run -- <cmd> sets them for one command"))
    return lines


def _first(facts: ScreenFacts, kinds: Sequence[str]) -> Listener | None:
    """The first listener of one of ``kinds`` that a client can dial."""
    return next(
        (listener for listener in facts.listeners if listener.kind in kinds and listener.address),
        None,
    )
