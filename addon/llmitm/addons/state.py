"""What llmitm keeps on a flow (``flow.metadata["llmitm"]``) between its hooks.

mitmproxy deep-copies ``flow.metadata`` into a saved flow (``-w``, ``save_stream_file``,
mitmweb's export) and its file format takes only plain data, so a copy of :class:`FlowState`
is its facts as a plain dict: the live object stays with the live flow, and saving works.
Readers use :func:`flow_state`, which ignores such a dict (a flow loaded from a file).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from llmitm.routing.plan import Plan
from llmitm.translate.context import TranslationContext
from llmitm.wire.ids import Mint

if TYPE_CHECKING:
    from llmitm.addons.fleet_slots import SlotPin
    from llmitm.relay.client import UpstreamRequest
    from llmitm.relay.failover import FailoverJob
    from llmitm.routing.config import Route
    from llmitm.routing.limits import Lease

METADATA_KEY = "llmitm"
SOCKET_KEY = "llmitm_socket"
"""Set (to the socket's token) on a WebSocket upgrade llmitm serves itself: the socket is no
call (its calls are)."""
RESPONSES_CREATE_KEY = "llmitm_responses_create"
"""A Responses create call's state facts (``responses_api.CreateCall``), set before routing."""


@dataclass(slots=True)
class Routed:
    """How the router sent one flow, and the per-flow facts (also in the response headers
    ``x-llmitm-endpoint``, ``x-llmitm-attempts``, ``x-llmitm-overhead-ms``)."""

    route: Route
    model: str
    """The model as the route sends it: health, caps and affinity key on it."""
    fingerprint: str | None = None
    previous_response_id: str | None = None
    previous_owner: str | None = None
    """The endpoint the store remembers minting ``previous_response_id`` (survives restarts)."""
    slot_pin: SlotPin | None = None
    """A fleet's new conversation: its pin goes to the shared table with its slot's take."""
    overhead: float = 0.0
    """Seconds llmitm spent on this flow before the answer's head (not upstream time)."""
    lease: Lease | None = None
    """The direct path's concurrency slot (the relay's job holds its own)."""
    relayed: bool = False
    """The flow went through the relay's failover job (which reports its own outcomes)."""
    job: FailoverJob | None = None
    """That job, until the flow ends (then dropped, with ``candidates``, to keep flows that
    mitmweb holds small)."""
    candidates: dict[str, tuple[Plan, TranslationContext, bool]] = field(default_factory=dict)
    """Per endpoint of a relayed flow: its plan, translation context and whether the
    upstream's usage chunk must be stripped."""
    endpoint: str | None = None
    """The endpoint that answered (``None``: llmitm answered with an error itself)."""
    upstream_request: UpstreamRequest | None = None
    """A relayed flow: what the answering endpoint was sent (the flow's own request points
    at the relay)."""
    attempts: int = 1

    def release(self) -> None:
        if self.lease is not None:
            self.lease.release()

    def forget(self) -> None:
        """The flow has ended: keep the facts, drop the job and the prepared requests."""
        self.job = None
        self.candidates = {}


@dataclass(slots=True)
class FlowState:
    plan: Plan
    context: TranslationContext
    client_stream: bool
    streamed: bool = False
    upstream_cut: str | None = None
    """Why the upstream's stream ended early, when it did."""
    head_timeout: str | None = None
    """Why llmitm stopped waiting for the upstream's head (``first_byte_timeout``), if it did."""
    strip_usage: bool = False
    """llmitm asked the chat upstream for a usage chunk the client did not ask for."""
    routed: Routed | None = None
    accounted: bool = False
    """Its usage went to the store (once: a flow may meet both ``response`` and ``error``)."""

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        return {
            "endpoint": self.plan.endpoint.name,
            "plan": self.plan.label,
            "client_stream": self.client_stream,
            "streamed": self.streamed,
            "upstream_cut": self.upstream_cut,
            "head_timeout": self.head_timeout,
        }


def flow_state(flow: Any) -> FlowState | None:
    """The live flow's :class:`FlowState`, if llmitm routed it."""
    state = flow.metadata.get(METADATA_KEY)
    return state if isinstance(state, FlowState) else None


# Beside the flow, not in its metadata (which mitmproxy serialises when it saves flows).
_MINTS: weakref.WeakKeyDictionary[Any, Mint] = weakref.WeakKeyDictionary()


def set_mint(flow: Any, mint: Mint) -> None:
    """Make ``mint`` the source of every id and clock reading of this flow's translation (the
    recorder keeps what it handed out; a replay hands out the recorded values again)."""
    _MINTS[flow] = mint


def flow_mint(flow: Any) -> Mint | None:
    return _MINTS.get(flow)
