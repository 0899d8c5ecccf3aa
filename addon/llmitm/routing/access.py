"""Who may use llmitm's endpoints and keys: browser origins, the content type of an API
call, and client keys (the proxy's own keys, which a client presents instead of an
endpoint's).

Pure decisions over a request's headers; ``addons/access.py`` carries them out. A refusal is
an :class:`~llmitm.wire.errors.ApiError` in OpenAI's shape.

- A browser says where a request comes from: ``Origin`` (every cross-site ``POST``, also the
  ``text/plain`` one a page may send without a CORS preflight) or ``Sec-Fetch-Site:
  cross-site``. Such a request is refused unless its origin is allowed (``[llmitm]
  allowed_origins``, globs): otherwise any web page could spend the configured keys.
- A create or state call with a body must say it is JSON: a page cannot send
  ``application/json`` cross-site without a preflight, so the type closes the same door.
- With client keys configured, a call must present one (``Authorization: Bearer``,
  ``api-key`` or ``x-api-key``), compared in constant time; a key may be limited to routes.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from ipaddress import ip_address
from typing import Literal, get_args

from llmitm.wire.errors import ApiError

CLIENT_KEY_HEADERS = ("authorization", "api-key", "x-api-key")
"""Where a client presents a client key (the spellings the OpenAI and Azure SDKs use)."""

BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})

ResponsesScope = Literal["credential", "shared"]
"""Whose stored Responses state a request may see: the records its own credential created,
or every record (a single-tenant proxy); :mod:`llmitm.responses_api.scope` applies it."""
RESPONSES_SCOPES: tuple[str, ...] = get_args(ResponsesScope)

Header = Callable[[str], str | None]
"""A request's header by lower-case name (``None``: absent)."""


@dataclass(frozen=True, slots=True)
class ClientKey:
    """One key of the proxy's own, read from the environment variable ``key_env``."""

    name: str
    key_env: str
    key: str = field(repr=False)
    routes: tuple[str, ...] | None = None
    """Route names this key may use (``None``: every route)."""

    def allows(self, route: str) -> bool:
        return self.routes is None or route in self.routes


@dataclass(frozen=True, slots=True)
class Access:
    """``[llmitm] allowed_origins`` and ``[client_keys.NAME]``."""

    allowed_origins: tuple[str, ...] = ()
    client_keys: tuple[ClientKey, ...] = ()


def browser_refusal(access: Access, header: Header) -> ApiError | None:
    """A 403 for a browser request from an origin nobody allowed."""
    origin = header("origin")
    site = (header("sec-fetch-site") or "").strip().lower()
    if origin is None and site != "cross-site":
        return None
    if origin is not None and origin_allowed(access, origin):
        return None
    said = f"origin {origin}" if origin is not None else "a cross-site page"
    return ApiError(
        message=f"llmitm refuses browser requests from {said}: allow the origin with "
        "[llmitm] allowed_origins in llmitm's configuration.",
        type="invalid_request_error",
        code="origin_not_allowed",
        status=403,
    )


def origin_allowed(access: Access, origin: str) -> bool:
    value = origin.strip().rstrip("/").lower()
    return any(fnmatchcase(value, glob.rstrip("/").lower()) for glob in access.allowed_origins)


def content_type_refusal(method: str, header: Header, has_body: bool) -> ApiError | None:
    """A 415 for an API call whose body does not say it is JSON."""
    if method.upper() not in BODY_METHODS or not has_body:
        return None
    media = (header("content-type") or "").partition(";")[0].strip().lower()
    json_suffix = media.startswith("application/") and media.endswith("+json")
    if media == "application/json" or json_suffix:
        return None
    return ApiError(
        message=f"API calls must send a JSON body with content-type application/json "
        f"(got {media or 'none'}).",
        type="invalid_request_error",
        code="unsupported_media_type",
        param="content-type",
        status=415,
    )


def presented_keys(header: Header) -> list[str]:
    """The credentials the client sent, in the order of :data:`CLIENT_KEY_HEADERS`."""
    found = [_credential(name, header(name)) for name in CLIENT_KEY_HEADERS]
    return [value for value in found if value]


def _credential(name: str, value: str | None) -> str | None:
    """The key a credential header carries (``Authorization``: only a bearer token)."""
    if not value:
        return None
    value = value.strip()
    if name == "authorization":
        scheme, _, token = value.partition(" ")
        return token.strip() if scheme.lower() == "bearer" else None
    return value


def client_key_for(access: Access, header: Header) -> ClientKey | None:
    """The configured client key the request presents, if any."""
    for presented in presented_keys(header):
        for key in access.client_keys:
            if hmac.compare_digest(presented.encode(), key.key.encode()):
                return key
    return None


def key_refusal(access: Access, header: Header) -> tuple[ClientKey | None, ApiError | None]:
    """The client key of a request when client keys are configured, or a 401."""
    if not access.client_keys:
        return None, None
    key = client_key_for(access, header)
    if key is not None:
        return key, None
    said = "an invalid" if presented_keys(header) else "no"
    return None, ApiError(
        message=f"llmitm requires a client key and the request presents {said} key: send "
        "one of the proxy's client keys as 'Authorization: Bearer <key>'.",
        type="invalid_request_error",
        code="invalid_api_key",
        status=401,
    )


def without_client_key(headers: Iterable[tuple[str, str]], key: ClientKey) -> list[tuple[str, str]]:
    """``headers`` without the ones that present ``key`` (an endpoint key injected in the
    same header stays)."""
    return [
        (name, value)
        for name, value in headers
        if name.lower() not in CLIENT_KEY_HEADERS or _credential(name.lower(), value) != key.key
    ]


def route_refusal(key: ClientKey | None, route: str) -> ApiError | None:
    """A 403 when ``key`` may not use ``route``."""
    if key is None or key.allows(route):
        return None
    return ApiError(
        message=f"The client key {key.name!r} may not use the route {route!r}.",
        type="invalid_request_error",
        code="route_not_allowed",
        status=403,
    )


def is_loopback(host: str) -> bool:
    """Whether a listen address reaches only this machine ("" is every interface)."""
    if host.lower() == "localhost":
        return True
    try:
        return ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def public_listen_refusal(hosts: Iterable[str], access: Access, allowed: bool) -> str | None:
    """The one-line start-up error when llmitm would listen beyond loopback without client
    keys (``allowed``: the operator said so explicitly)."""
    public = sorted({host or "*" for host in hosts if not is_loopback(host)})
    if not public or access.client_keys or allowed:
        return None
    return (
        f"llmitm: refusing to listen on {', '.join(public)} without client keys: anyone who "
        "can reach it could spend the configured keys. Configure [client_keys.NAME] "
        "(key_env = ...), listen on 127.0.0.1, or set llmitm_public_listen=true."
    )
