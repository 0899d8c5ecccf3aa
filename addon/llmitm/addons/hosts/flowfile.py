"""Recorded interactions as a mitmproxy flow file (``mitmweb --rfile FILE`` opens it).

The client's request and the response it got become one ``HTTPFlow`` each, with the
recorded timing; llmitm's facts (scope, key, plan, upstream URL) go into ``flow.metadata``
and a comment. Lives in ``addons/`` because it is the one export that needs mitmproxy.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from urllib.parse import urlsplit

from mitmproxy import connection, http, io

from llmitm.file_modes import open_for_writing
from llmitm.replay.model import Interaction


def _flow(interaction: Interaction) -> http.HTTPFlow | None:
    request = interaction.legs.get("client_req")
    response = interaction.legs.get("client_resp") or interaction.legs.get("upstream_resp")
    if request is None:
        return None
    start = max(interaction.started_us, 0) / 1e6
    parts = urlsplit(request.url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    client = connection.Client(
        peername=("127.0.0.1", 0), sockname=("127.0.0.1", 0), timestamp_start=start
    )
    server = connection.Server(address=(parts.hostname or "", port))
    flow = http.HTTPFlow(client, server)
    headers = [(k.encode(), v.encode()) for k, v in request.headers]
    flow.request = http.Request.make(request.method, request.url, request.body(), headers)
    flow.request.timestamp_start = flow.request.timestamp_end = start
    if response is not None:
        headers = [(k.encode(), v.encode()) for k, v in response.headers]
        flow.response = http.Response.make(response.status, response.body(), headers)
        flow.response.timestamp_start = start + (interaction.ttfb_us or 0) / 1e6
        flow.response.timestamp_end = start + (interaction.duration_us or 0) / 1e6
    upstream = interaction.legs.get("upstream_req")
    flow.metadata["llmitm"] = {
        "id": interaction.id,
        "scope": interaction.scope,
        "key": interaction.key,
        "plan": interaction.plan,
        "truncated": interaction.truncated,
        "upstream_url": upstream.url if upstream else None,
    }
    flow.comment = f"llmitm {interaction.id} scope={interaction.scope} key={interaction.key}"
    flow.live = False
    return flow


def write_flows(path: Path, interactions: Iterable[Interaction], *, private: bool = True) -> int:
    """Write ``interactions`` to ``path`` (created owner-only unless ``private`` is false);
    return how many flows were written."""
    count = 0
    with open_for_writing(path, private=private) as out:
        writer = io.FlowWriter(out)
        for interaction in interactions:
            flow = _flow(interaction)
            if flow is not None:
                writer.add(flow)
                count += 1
    return count
