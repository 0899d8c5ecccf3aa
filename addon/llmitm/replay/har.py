"""HAR 1.2 export of recorded interactions (opens in browsers' dev tools and HAR viewers).

Each interaction is one entry: the request and response the *client* saw (redacted, as
recorded), ``timings.wait`` the recorded time to first byte. llmitm extras go in ``_llmitm``
fields (HAR's custom-field convention): scope, key, plan, truncation, the stream's pieces
as ``{"t_ms", "size"}`` and the upstream request's URL. Pure: interactions in, a dict out.
"""

from __future__ import annotations

from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from llmitm import __version__
from llmitm.replay.model import Interaction, Message


def _headers(message: Message | None) -> list[dict[str, str]]:
    return [{"name": k, "value": v} for k, v in (message.headers if message else [])]


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


def entry(interaction: Interaction) -> dict[str, Any]:
    request = interaction.legs.get("client_req") or Message()
    response = interaction.legs.get("client_resp") or interaction.legs.get("upstream_resp")
    body = request.body()
    answer = response.body() if response else b""
    started = datetime.fromtimestamp(max(interaction.started_us, 0) / 1e6, UTC)
    wait = (interaction.ttfb_us or 0) / 1000
    total = (interaction.duration_us or interaction.ttfb_us or 0) / 1000
    upstream = interaction.legs.get("upstream_req")
    return {
        "startedDateTime": started.isoformat().replace("+00:00", "Z"),
        "time": total,
        "request": {
            "method": request.method or interaction.method,
            "url": request.url,
            "httpVersion": "HTTP/1.1",
            "cookies": [],
            "headers": _headers(request),
            "queryString": [
                {"name": k, "value": v} for k, v in parse_qsl(urlsplit(request.url).query)
            ],
            "postData": {
                "mimeType": request.header("content-type", "application/json"),
                "text": body.decode("utf-8", "replace"),
            },
            "headersSize": -1,
            "bodySize": len(body),
        },
        "response": {
            "status": response.status if response else 0,
            "statusText": _reason(response.status) if response else "",
            "httpVersion": "HTTP/1.1",
            "cookies": [],
            "headers": _headers(response),
            "content": {
                "size": len(answer),
                "mimeType": response.header("content-type", "") if response else "",
                "text": answer.decode("utf-8", "replace"),
            },
            "redirectURL": "",
            "headersSize": -1,
            "bodySize": len(answer),
        },
        "cache": {},
        "timings": {"send": 0, "wait": wait, "receive": max(total - wait, 0)},
        "_llmitm": {
            "id": interaction.id,
            "scope": interaction.scope,
            "key": interaction.key,
            "route": interaction.route,
            "plan": interaction.plan,
            "endpoint": interaction.endpoint,
            "truncated": interaction.truncated,
            "upstream_url": upstream.url if upstream else None,
            "chunks": [
                {"t_ms": round(t / 1000, 3), "size": len(d)} for t, d in response.chunks or ()
            ]
            if response
            else [],
        },
    }


def to_har(interactions: list[Interaction]) -> dict[str, Any]:
    return {
        "log": {
            "version": "1.2",
            "creator": {"name": "llmitm", "version": __version__},
            "pages": [],
            "entries": [entry(i) for i in interactions],
        }
    }
