"""Who may use llmitm: browser origins, JSON bodies and client keys on API calls, llmitm's
own endpoints only on its own address, and no listener beyond loopback without client keys.

``LlmAccess`` comes first: an LLM API call (or a ``/_llmitm/`` call) from a browser origin
nobody allowed, with a body that is not JSON, or — with client keys configured — without a
valid client key is answered here in OpenAI's shape (403, 415, 401), before anything could
inject an endpoint key. The decisions are :mod:`llmitm.routing.access`'s. The client key
that was presented is noted on the flow by name; ``LlmAccessStrip``, after the router,
takes it off a flow that still goes upstream, so a client key never leaves the proxy
(an endpoint key the router injected stays).

Option ``llmitm_public_listen``: listen beyond loopback without client keys after all.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Set
from ipaddress import ip_address

import orjson
from mitmproxy import ctx, exceptions, http
from mitmproxy.addonmanager import Loader
from mitmproxy.proxy import mode_specs

from llmitm.addons.settings import LlmitmSettings
from llmitm.routing.access import (
    ClientKey,
    browser_refusal,
    client_key_for,
    content_type_refusal,
    key_refusal,
    public_listen_refusal,
    without_client_key,
)
from llmitm.wire.errors import ApiError, openai_error_body
from llmitm.wire.paths import is_llm_call

logger = logging.getLogger(__name__)

CLIENT_KEY = "llmitm_client_key"
"""``flow.metadata`` key: the name of the client key the request presented."""
REFUSED_KEY = "llmitm_refused"
"""``flow.metadata`` key: the error code of a refusal answered here (the recorder keeps such a
flow although it is answered before the recorder sees it)."""
OWN_PREFIX = "/_llmitm/"
_LISTEN_OPTIONS = {"mode", "listen_host", "llmitm_public_listen", "llmitm_config"}
_NO_LISTENER = (mode_specs.LocalMode, mode_specs.OsProxyMode)


def _answer(flow: http.HTTPFlow, error: ApiError) -> None:
    flow.response = http.Response.make(
        error.status,
        orjson.dumps(openai_error_body(error)),
        {"content-type": "application/json", "x-should-retry": "false"},
    )


def addressed_to_llmitm(flow: http.HTTPFlow) -> bool:
    """Whether the request names llmitm's own listener rather than a host it proxies to:
    any request to a reverse listener (mitmproxy has replaced its Host by the target's, so
    there is no other name to look at), a regular listener only for its own address."""
    mode = flow.client_conn.proxy_mode
    if isinstance(mode, mode_specs.ReverseMode):
        return True
    if isinstance(mode, mode_specs.RegularMode):
        sockname = flow.client_conn.sockname
        return (
            bool(sockname) and flow.request.port == sockname[1] and _is_address(flow.request.host)
        )
    return False


def _is_address(host: str) -> bool:
    host = host.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        ip_address(host)
    except ValueError:
        return False
    return True


class LlmAccess:
    """Refuses what may not use llmitm, before anything else sees it."""

    name = "llmitm_access"

    def __init__(self, settings: LlmitmSettings) -> None:
        self.settings = settings
        self._running = False
        self._check_pending = False

    def load(self, loader: Loader) -> None:
        loader.add_option(
            "llmitm_public_listen",
            bool,
            False,
            "Listen beyond loopback without client keys ([client_keys.NAME]): anyone who can "
            "reach the proxy may then spend the configured endpoint keys.",
        )

    def configure(self, updated: Set[str]) -> None:
        if not updated & _LISTEN_OPTIONS:
            return
        if self._running:
            refusal = self._listen_refusal()
            if refusal is not None:
                raise exceptions.OptionsError(refusal)
            return
        # mitmdump configures every addon with the defaults first and applies the command
        # line after: the listen address is known once start-up awaits for the first time,
        # which is also before any server listens and before mitmdump checks for errors.
        if self._check_pending:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._check_at_start_up()
            return
        self._check_pending = True
        loop.call_soon(self._check_at_start_up)

    def _check_at_start_up(self) -> None:
        self._check_pending = False
        refusal = self._listen_refusal()
        if refusal is not None:
            logger.error(refusal)  # at start-up an error log makes mitmdump exit 1

    def _listen_refusal(self) -> str | None:
        hosts = []
        for spec in ctx.options.mode:
            try:
                mode = mode_specs.ProxyMode.parse(spec)
            except ValueError:
                continue  # mitmproxy's own check says what is wrong with it
            if not isinstance(mode, _NO_LISTENER):
                hosts.append(mode.listen_host(ctx.options.listen_host))
        return public_listen_refusal(
            hosts, self.settings.config.access, ctx.options.llmitm_public_listen
        )

    def running(self) -> None:
        self._running = True

    def request(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error or not flow.live:
            return
        request = flow.request
        path = request.path.partition("?")[0]
        access = self.settings.config.access
        header = request.headers.get
        if is_llm_call(path) or path.startswith(OWN_PREFIX):
            error = browser_refusal(access, header)
            if error is None and is_llm_call(path):
                error = content_type_refusal(request.method, header, bool(request.raw_content))
            key: ClientKey | None = None
            if error is None:
                key, error = key_refusal(access, header)
            if error is not None:
                logger.info("llmitm: refused %s %s: %s", request.method, path, error.code)
                _answer(flow, error)
                flow.metadata[REFUSED_KEY] = error.code
                return
        else:
            # Not llmitm's to guard (the egress policy decides), but a client key it carries
            # must not leave the proxy either.
            key = client_key_for(access, header)
        if key is not None:
            flow.metadata[CLIENT_KEY] = key.name


def client_key_of(flow: http.HTTPFlow, settings: LlmitmSettings) -> ClientKey | None:
    """The client key the flow presented (``None``: none configured)."""
    name = flow.metadata.get(CLIENT_KEY)
    if name is None:
        return None
    return next((k for k in settings.config.access.client_keys if k.name == name), None)


class LlmAccessStrip:
    """After the router: a client key never goes upstream."""

    name = "llmitm_access_strip"

    def __init__(self, settings: LlmitmSettings) -> None:
        self.settings = settings

    def request(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error:
            return
        key = client_key_of(flow, self.settings)
        if key is None:
            return
        headers = flow.request.headers
        kept = without_client_key(headers.items(multi=True), key)
        if len(kept) != len(headers.fields):
            headers.clear()
            for name, value in kept:
                headers.add(name, value)
