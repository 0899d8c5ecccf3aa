"""The OpenAI-shaped answer for an API call whose upstream failed before its answer began.

mitmproxy's own answer to an unreachable upstream, a reset before the head, bytes that are
not HTTP or a plain body cut short is an HTML ``502 Bad Gateway`` page; the SDKs expect an
OpenAI error object. This module says what llmitm answers instead (pure: a reason in, a
status and body out); :mod:`llmitm.addons.patches.cut_streams` sends it.
"""

from __future__ import annotations

import orjson

from llmitm.wire.errors import ApiError, openai_error_body

GATEWAY_STATUS = 502


def gateway_error(reason: str, *, reached: bool) -> ApiError:
    """The error for an upstream failure: ``reached`` when a connection was made (the
    upstream answered unreadably or broke off), else it could not be reached at all."""
    reason = reason.strip().rstrip(".") or "no reason given"
    if reached:
        message = f"The upstream failed before its answer was complete ({reason})."
        code = "upstream_error"
    else:
        message = f"llmitm could not reach the upstream ({reason})."
        code = "upstream_unreachable"
    return ApiError(message=message, type="server_error", code=code, status=GATEWAY_STATUS)


def gateway_error_body(error: ApiError) -> bytes:
    """The JSON body of ``error`` as the client receives it."""
    return orjson.dumps(openai_error_body(error))
