"""The router's relayed path: what a failover route's flow becomes before the relay takes it.

Every candidate endpoint's request is prepared up front (so a request no endpoint can take
gets its 400 at once), the client's headers are cut to what the relay carries, and one
:class:`~llmitm.relay.failover.FailoverJob` is built to try the endpoints in the order
``Routing.choose`` gives. The flow's state starts as the first candidate's; the translator
addon adopts the winner's once the job knows it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from llmitm.addons.state import FlowState, Routed
from llmitm.exchange.request import (
    Header,
    PreparedRequest,
    prepare_candidates,
    relayable_headers,
)
from llmitm.relay.client import HOP_BY_HOP, UpstreamRequest
from llmitm.relay.failover import FailoverJob
from llmitm.relay.server import MAX_HEAD_BYTES, RelayServer
from llmitm.routing.access import without_client_key
from llmitm.routing.affinity import owner_required
from llmitm.routing.config import Config
from llmitm.routing.engine import Routing
from llmitm.routing.plan import Plan
from llmitm.routing.wait import SlotTaker

_RELAY_HEAD_SLACK = 8192
"""Room in the relay's head limit for the request line and the headers llmitm adds."""


def relayed_headers(client_headers: Iterable[Header], client_key: str | None) -> list[Header]:
    """The client's headers the relay may carry to any endpoint (never the proxy's own key),
    or a 431 when they would not fit in its head."""
    headers = relayable_headers(
        client_headers, hop_by_hop=HOP_BY_HOP, head_limit=MAX_HEAD_BYTES, slack=_RELAY_HEAD_SLACK
    )
    if client_key is not None:
        headers = without_client_key(headers, client_key)
    return headers


def hand_over(
    routed: Routed,
    api: str,
    prepare: Callable[[str], tuple[Plan, PreparedRequest]],
    headers: list[Header],
    routing: Routing,
    config: Config,
    relay: RelayServer,
    take: SlotTaker | None = None,
) -> tuple[FailoverJob, FlowState]:
    """The failover job for ``routed``'s candidates, and the flow's state until it answers
    (``take``: how it takes slots, when a fleet shares them)."""
    candidates = prepare_candidates(routed.route.endpoints, prepare, headers)
    requests = {
        name: UpstreamRequest("POST", c.plan.url, c.headers, c.prepared.content)
        for name, c in candidates.items()
    }
    for name, c in candidates.items():
        routed.candidates[name] = (c.plan, c.prepared.context, c.prepared.strip_usage)
    owner = routing.owner(
        routed.previous_response_id, time.monotonic(), remembered=routed.previous_owner
    )
    upstream_apis = {name: c.plan.upstream_api for name, c in candidates.items()}
    first = next(iter(candidates.values()))
    plan, prepared = first.plan, first.prepared
    job = FailoverJob(
        routing=routing,
        route=routed.route,
        model=routed.model,
        prepare=requests.get,
        client=relay.client,
        connect_timeout=config.routing.connect_timeout,
        previous_response_id=routed.previous_response_id,
        fingerprint=routed.fingerprint,
        owner_required=owner_required(owner, api, upstream_apis),
        stream=prepared.stream,
        take=take,
    )
    routed.job = job
    routed.relayed = True
    state = FlowState(
        plan, prepared.context, prepared.stream, strip_usage=prepared.strip_usage, routed=routed
    )
    return job, state
