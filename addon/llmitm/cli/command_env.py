"""The environment of a command run by ``llmitm run -- COMMAND``: what real clients read to
reach the proxy and to trust its CA, and which ``--mode`` listeners can carry a command at all.

Proxy variables, from the first listener of each kind:

- a ``regular`` or ``upstream`` listener gives ``HTTPS_PROXY``/``https_proxy`` and
  ``HTTP_PROXY``/``http_proxy`` (both spellings: curl reads only the lowercase ``http_proxy``,
  Codex's WebSocket client the uppercase first). Codex uses them for HTTPS and for its
  ``wss://`` transport alike; Node's global ``fetch`` only with ``NODE_USE_ENV_PROXY=1``
  (Node >= 22.21 / 24), set unless the user set it;
- a ``socks5`` listener gives ``ALL_PROXY``/``all_proxy`` (``socks5h://``: the proxy resolves
  names), which curl, git and Python's httpx/requests (with their SOCKS extras) follow, but not
  Node nor Codex's HTTPS client. Inherited ``HTTP(S)_PROXY`` are removed then, since every
  client prefers them over ``ALL_PROXY`` and would go around llmitm;
- a ``reverse`` listener gives ``OPENAI_BASE_URL`` with ``--base-url``.

``NO_PROXY``/``no_proxy`` keep the user's entries and gain ``localhost,127.0.0.1,::1``: loopback
is the machine itself (llmitm's own reverse listener with ``--base-url``, a local model server,
the app's test servers), which Go and browsers never proxy either.

CA variables get a bundle written to llmitm's scratch directory: the file the variable pointed
at (or the file its reader falls back to, else the system's bundle) followed by mitmproxy's CA.
A machine that sets ``SSL_CERT_FILE`` or ``CURL_CA_BUNDLE`` to the system bundle keeps every other
TLS connection working, and interception works too. Variables of other tools (pip, AWS, gRPC, …)
are rewritten the same way only when already set.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from llmitm.transparent.plan import mode_kind

LOOPBACK = ("localhost", "127.0.0.1", "::1")
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy")
SOCKS_VARIABLES = ("ALL_PROXY", "all_proxy")
NO_PROXY_VARIABLES = ("NO_PROXY", "no_proxy")

# The CA variables always set, each with the variables its reader falls back to when it is
# unset (requests: REQUESTS_CA_BUNDLE, then CURL_CA_BUNDLE; Codex: CODEX_CA_CERTIFICATE, then
# SSL_CERT_FILE). ``None``: the reader adds the file to its own roots (Node), so the bundle
# needs no system certificates.
CA_VARIABLES: dict[str, tuple[str, ...] | None] = {
    "SSL_CERT_FILE": (),
    "REQUESTS_CA_BUNDLE": ("CURL_CA_BUNDLE",),
    "CURL_CA_BUNDLE": (),
    "GIT_SSL_CAINFO": (),
    "CODEX_CA_CERTIFICATE": ("SSL_CERT_FILE",),
    "NODE_EXTRA_CA_CERTS": None,
}
# Other tools' CA-file variables: each replaces the tool's roots, so one already set to the
# system bundle would refuse mitmproxy's certificates. Rewritten only when set.
CA_VARIABLES_IF_SET = (
    "PIP_CERT",
    "AWS_CA_BUNDLE",
    "HTTPLIB2_CA_CERTS",
    "NIX_SSL_CERT_FILE",
    "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH",
    "CLOUDSDK_CORE_CUSTOM_CA_CERTS_FILE",
    "DENO_CERT",
    "NPM_CONFIG_CAFILE",
    "npm_config_cafile",
)

# Listener kinds (mitmproxy's mode names) that a proxy variable can point a command at.
PROXY_KINDS = ("regular", "upstream")
# Why each other kind cannot carry a command's traffic, for the one-line refusal.
_NOT_A_CARRIER = {
    "transparent": "it takes connections the OS redirects to it, not a command's",
    "local": "it captures processes through the OS, which llmitm does not set up for a command",
    "wireguard": "it serves WireGuard peers, not a command on this machine",
    "tun": "it serves a TUN interface, not a command's proxy settings",
    "dns": "it answers DNS only",
    "osproxy": "it changes the system's proxy settings, which llmitm does not do for a command",
}


def _names_a_port(spec: str) -> bool:
    head, _, listen_at = spec.rpartition("@")
    port = listen_at.rpartition(":")[2]
    return bool(head) and port.isdigit() and int(port) != 0


def mode_problem(modes: Sequence[str], *, base_url: bool, fixed_port: bool) -> str | None:
    """Why these listeners cannot carry a command (``None``: one can). A reverse listener
    carries it with ``--base-url``, or at a port the user chose (and points the app at)."""
    if base_url:
        return None  # llmitm adds a reverse listener and sets OPENAI_BASE_URL
    for spec in modes:
        kind = mode_kind(spec)
        if kind in (*PROXY_KINDS, "socks5"):
            return None
        if kind == "reverse" and (fixed_port or _names_a_port(spec)):
            return None
    spec = modes[0]
    kind = mode_kind(spec)
    if kind == "reverse":
        why = "llmitm picks its port at random; add --base-url (OPENAI_BASE_URL) or name a port"
    else:
        why = _NOT_A_CARRIER.get(kind, "llmitm knows no variable that points a command at it")
    return (
        f"--mode {spec} cannot carry the command's traffic ({why}); "
        "use --mode regular (the default), socks5, --base-url, or --transparent"
    )


def _url(server: Mapping[str, Any]) -> str | None:
    """``host:port`` of a listener for a URL, loopback for a wildcard; ``None`` for a
    listener with no address (``local`` mode)."""
    addresses = server.get("addresses") or []
    if not addresses:
        return None
    host, port = addresses[0][0], addresses[0][1]
    host = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
    host = f"[{host}]" if ":" in host else host  # an IPv6 literal in a URL
    return f"{host}:{port}"


def _no_proxy(environ: Mapping[str, str]) -> str:
    entries: list[str] = []
    for variable in NO_PROXY_VARIABLES:
        for entry in environ.get(variable, "").split(","):
            if entry.strip() and entry.strip() not in entries:
                entries.append(entry.strip())
    return ",".join(entries + [host for host in LOOPBACK if host not in entries])


def command_environment(
    listening: Mapping[str, Any],
    *,
    base_url: bool,
    environ: Mapping[str, str] | None = None,
    bundles: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The command's whole environment: ``environ`` with the proxy variables of the listeners
    in ``listening`` (the listen file's document) and the CA variables pointing at
    ``bundles`` (variable -> file, from ``write_ca_bundles``; without it, at mitmproxy's CA)."""
    env = dict(environ or {})
    proxy = socks = reverse = None
    for server in listening["servers"]:
        url = _url(server)
        if url is None:
            continue
        if server["type"] in PROXY_KINDS and proxy is None:
            proxy = f"http://{url}"
        elif server["type"] == "socks5" and socks is None:
            socks = f"socks5h://{url}"
        elif server["type"] == "reverse" and reverse is None:
            reverse = f"http://{url}/v1"
    if proxy is not None:
        env.update(dict.fromkeys(PROXY_VARIABLES, proxy))
        env.setdefault("NODE_USE_ENV_PROXY", "1")
    if socks is not None:
        env.update(dict.fromkeys(SOCKS_VARIABLES, socks))
        if proxy is None:
            for variable in PROXY_VARIABLES:
                env.pop(variable, None)
    env.update(dict.fromkeys(NO_PROXY_VARIABLES, _no_proxy(env)))
    if base_url and reverse is not None:
        env["OPENAI_BASE_URL"] = reverse
    if bundles is None:
        bundles = dict.fromkeys(CA_VARIABLES, listening["ca_file"])
    env.update(bundles)
    return env


def system_bundle() -> str | None:
    """The CA file OpenSSL uses when nothing overrides it (not the one ``SSL_CERT_FILE``
    names), else certifi's (mitmproxy's own dependency)."""
    default = ssl.get_default_verify_paths().openssl_cafile
    if default and Path(default).is_file():
        return default
    try:
        import certifi
    except ImportError:  # pragma: no cover - mitmproxy depends on certifi
        return None
    return certifi.where()


def bundle_sources(environ: Mapping[str, str], system: str | None) -> dict[str, str | None]:
    """For each CA variable the command gets, the file its bundle starts from: the one the
    client would have read (the variable, or what its reader falls back to), else ``system``;
    ``None``: mitmproxy's CA alone."""
    sources: dict[str, str | None] = {}
    for variable, fallbacks in CA_VARIABLES.items():
        chain = (variable, *(fallbacks or ()))
        chosen = next((environ[name] for name in chain if environ.get(name)), None)
        sources[variable] = chosen if chosen or fallbacks is None else system
    for variable in CA_VARIABLES_IF_SET:
        if environ.get(variable):
            sources[variable] = environ[variable]
    return sources


def write_ca_bundles(
    ca_file: str, environ: Mapping[str, str], directory: Path
) -> tuple[dict[str, str], list[str]]:
    """Write one bundle per distinct source into ``directory``; return variable -> file and
    the warnings to show (a source that cannot be read is replaced by the system's bundle)."""
    ca = Path(ca_file).read_bytes()
    system = system_bundle()
    sources = bundle_sources(environ, system)
    written: dict[str | None, Path] = {}
    warnings: list[str] = []
    for variable, source in sources.items():
        if source in written:
            continue
        try:
            base = Path(source).read_bytes() if source else b""
        except OSError as exc:
            named = "/".join(name for name in sources if environ.get(name) == source)
            warnings.append(
                f"{named}={source} cannot be read ({exc.strerror}): the command trusts the "
                "system's CAs and mitmproxy's there instead"
            )
            base = Path(system).read_bytes() if system else b""
        written[source] = directory / f"ca-{variable}.pem"
        written[source].write_bytes(_joined(base, ca))
    return {variable: str(written[source]) for variable, source in sources.items()}, warnings


def _joined(base: bytes, ca: bytes) -> bytes:
    if ca.strip() and ca.strip() in base:
        return base  # already trusted (llmitm run inside llmitm run)
    if base and not base.endswith(b"\n"):
        base += b"\n"
    return base + ca
