"""Record every LLM API flow, and replay recordings — ``llmitm_record`` and friends.

Only LLM API calls (:func:`llmitm.wire.paths.is_llm_call`) are recorded; other traffic through
the proxy is forwarded unrecorded unless ``llmitm_record_all`` is on.

Two addons around the router and the translator, sharing one :class:`Capture` per flow
(kept beside the flow, so mitmproxy can still save flows):

``LlmRecorder`` (before the router) sees the client's request as sent: strips the scope
header, redacts, computes the match key and — in a replaying mode — looks it up. A hit
served *verbatim* is answered right here; a hit served *from upstream* waits for the router's
plan. A strict miss is answered with a 400 that names key, scope and closest recording. It
also keeps the upstream's response head and, for a non-streamed body, the body before the
translator replaces it.

``LlmRecordTap`` (after the translator) answers from-upstream hits with today's translation
of the recorded upstream response, notes the upstream request the router built (for a
failover flow, what the answering endpoint was sent), hooks the stream (one note per chunk:
its time and the bytes in and out, nothing else on the hot path) and, when the flow ends —
finished, aborted by the client or cut by the upstream — builds the interaction, redacts it
and hands it to the store's writer queue (never awaited).

Each recorded or replayed flow gets a :class:`~llmitm.wire.ids.Mint`: recording keeps the
ids, times and sealed reasoning the translation was handed; a replay through today's
translator hands them out again, so it re-makes the recorded answer byte for byte.

Modes: ``off``, ``record`` (default, into the store), ``rewrite`` (wipe each scope on its
first request, then record), ``once`` (replay a scope that has recordings, record one that
has none), ``replay-or-record`` (replay hits, record misses), ``replay`` (hits only; a miss is
a 400 and nothing ever goes upstream, also after every recording was used). Replay reads
``llmitm_recordings`` (a folder) when set, else the store; a recording mode with a folder
writes the folder at shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from mitmproxy import ctx, exceptions, http
from mitmproxy.addonmanager import Loader
from mitmproxy.proxy.server_hooks import ServerConnectionHookData

from llmitm.addons.choices import check_choices
from llmitm.addons.relay import LlmRelay
from llmitm.addons.state import (
    METADATA_KEY,
    SOCKET_KEY,
    FlowState,
    flow_mint,
    flow_state,
    set_mint,
)
from llmitm.addons.status import STATUS_PATH
from llmitm.addons.store import LlmStore
from llmitm.addons.streams import flow_stream
from llmitm.addons.tap_compactor import TapCompactor
from llmitm.relay.client import UpstreamRequest
from llmitm.relay.replay_job import ReplayJob
from llmitm.relay.server import RelayServer
from llmitm.replay import folder as folder_format
from llmitm.replay.ci_guard import record_refusal
from llmitm.replay.fingerprint import credential, fingerprint
from llmitm.replay.keys import PROFILES, KeyOptions, MatchKey, match_key
from llmitm.replay.model import Chunk, Interaction, Message, new_id
from llmitm.replay.pool import (
    GLOBAL_SCOPE,
    ON_EXHAUSTED,
    SCOPE_HEADERS,
    Hit,
    Miss,
    ReplayPool,
    canonical_diff,
    split_scope_path,
)
from llmitm.replay.redact import (
    may_hold_secret,
    redact_body,
    redact_chunks,
    redact_headers,
    redact_url,
)
from llmitm.replay.rekey import rekey
from llmitm.replay.serve import Answer, drift_error, from_upstream, miss_error, verbatim
from llmitm.replay.tap import StreamTap, pieces
from llmitm.replay.timing import Timing, parse_timing
from llmitm.store import SqliteStore
from llmitm.store import folder as folder_files
from llmitm.store.recordings import DeleteScope, RecordingWrite, ReplayMissRecord
from llmitm.wire.ids import Mint
from llmitm.wire.paths import is_llm_call

logger = logging.getLogger(__name__)

MODES = ("off", "record", "rewrite", "once", "replay-or-record", "replay")
REPLAYING = frozenset({"once", "replay-or-record", "replay"})
RECORDING = frozenset({"record", "rewrite", "once", "replay-or-record"})
REPLAY_FROM = ("upstream", "client")


def _now_us() -> int:
    return time.time_ns() // 1000


def _fields(headers: http.Headers) -> list[tuple[str, str]]:
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers.fields]


@dataclass(slots=True)
class Capture:
    """What the recorder learns about one flow between its hooks."""

    scope: str
    key: MatchKey
    client_req: Message
    started_us: int
    record: bool = False
    hit: Hit | None = None
    forwarded: bool = False
    upstream_req: Message | None = None
    upstream_status: int = 0
    upstream_headers: list[tuple[str, str]] = field(default_factory=list)
    upstream_body: bytes | None = None
    tap: StreamTap | None = None
    done: bool = False
    served: bool = False
    request_clean: bool = False
    """The client's request body held nothing to redact (a translated answer echoes it)."""
    credential: str | None = None
    """The fingerprint of the credential the client sent."""
    recorded: str | None = None
    """The id of the interaction recorded from this flow, once it is."""


# Per-flow state lives beside the flow, not in flow.metadata: mitmproxy serialises metadata
# when it saves flows (-w, save_stream_file, mitmweb), and a Capture is not serialisable.
# Weak keys: a flow that ends in any way takes its capture with it.
_CAPTURES: weakref.WeakKeyDictionary[http.HTTPFlow, Capture] = weakref.WeakKeyDictionary()


def replay_hit(flow: http.HTTPFlow) -> bool:
    """Whether the recorder answers ``flow`` from a recording (some hits are served by
    :class:`LlmRecordTap`, after the router)."""
    capture = _CAPTURES.get(flow)
    return capture is not None and capture.hit is not None


def recording_id(flow: http.HTTPFlow) -> str | None:
    """The id of the interaction recorded from ``flow`` (``None``: not recorded, or not yet:
    it is recorded in :class:`LlmRecordTap`'s ``response`` or ``error`` hook)."""
    capture = _CAPTURES.get(flow)
    return None if capture is None else capture.recorded


@dataclass(slots=True)
class ReplayReport:
    """What a replay run did, written as JSON at shutdown (``llmitm_replay_report``)."""

    mode: str = "off"
    source: str = ""
    loaded: int = 0
    hits: int = 0
    misses: list[dict[str, Any]] = field(default_factory=list)
    drift: list[dict[str, Any]] = field(default_factory=list)
    strict_drift: bool = False
    """Drift was refused (``llmitm_strict_drift``): it fails a replayed command like a miss."""
    recorded: int = 0

    def to_json(self, unused: list[Interaction]) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "source": self.source,
            "loaded": self.loaded,
            "hits": self.hits,
            "misses": self.misses,
            "unused": [
                {"id": i.id, "scope": i.scope, "key": i.key, "route": i.route, "model": i.model}
                for i in unused
            ],
            "drift": self.drift,
            "strict_drift": self.strict_drift,
            "recorded": self.recorded,
        }


class LlmRecorder:
    """Options ``llmitm_record``, ``llmitm_recordings``, ``llmitm_replay_from``,
    ``llmitm_match_profile``, ``llmitm_match_ignore``, ``llmitm_scope``,
    ``llmitm_replay_report``; the front half of recording and replay."""

    name = "llmitm_recorder"

    def __init__(self, store: LlmStore, relay: LlmRelay) -> None:
        self.store = store
        self.shared_relay = relay
        self.mode = "record"
        self.record_all = False
        self.key_options = KeyOptions()
        self.pool = ReplayPool()
        self.report = ReplayReport()
        self.session = new_id()
        self.recorded: list[Interaction] = []
        self._wiped: set[str] = set()
        self._loading: asyncio.Task[None] | None = None
        self.timing = Timing()
        self.relay: RelayServer | None = None
        self.fingerprint_key: bytes | None = None
        """Makes ``Interaction.credential`` (replay.fingerprint); from the store."""
        self._started = False
        self.before_record: Callable[[Interaction], Interaction | None] | None = None
        """Sees each finished, redacted interaction before it is kept; returns it (edited or
        not) or ``None`` to keep nothing (the pytest plugin's ``pytest_llmitm_before_record``)."""

    # --- options -------------------------------------------------------------------------

    def load(self, loader: Loader) -> None:
        loader.add_option(
            "llmitm_record",
            str,
            "record",
            "Record and replay LLM API flows: off, record (into the store), rewrite (wipe "
            "each scope first), once, replay-or-record, replay (never forwards).",
            choices=list(MODES),
        )
        loader.add_option(
            "llmitm_recordings",
            str,
            "",
            "A recordings folder: replay reads it (instead of the store); recording modes "
            "write it at shutdown.",
        )
        loader.add_option(
            "llmitm_replay_from",
            str,
            "upstream",
            "Replay the recorded upstream response through today's translator (upstream) "
            "or the recorded client response byte for byte (client).",
            choices=list(REPLAY_FROM),
        )
        loader.add_option(
            "llmitm_match_profile",
            str,
            "default",
            "Which request fields match keys ignore: default, strict, loose.",
            choices=list(PROFILES),
        )
        loader.add_option(
            "llmitm_match_ignore",
            Sequence[str],
            [],
            "Dotted body paths match keys ignore (e.g. messages.0.content, tools.*.description).",
        )
        loader.add_option(
            "llmitm_scope",
            str,
            GLOBAL_SCOPE,
            "Scope of requests without an x-llmitm-scope / x-test-id header.",
        )
        loader.add_option(
            "llmitm_replay_timing",
            str,
            "instant",
            "Replay pacing: instant (CI), realtime (recorded time to first byte and gaps), or "
            "scale:F (F times the recorded times). Paced answers stream through the relay.",
        )
        loader.add_option(
            "llmitm_replay_cap_ms",
            int,
            0,
            "Longest single wait of a paced replay, in milliseconds (0: no cap).",
        )
        loader.add_option(
            "llmitm_export_timing",
            str,
            "coarse",
            "Chunk offsets in a recordings folder written at shutdown: coarse (10 ms: "
            "re-recording churns less), exact, or none.",
            choices=list(folder_format.TIMINGS),
        )
        loader.add_option(
            "llmitm_replay_report",
            str,
            "",
            "Write a JSON report of replay hits, misses, unused recordings and drift here at "
            "shutdown.",
        )
        loader.add_option(
            "llmitm_replay_exhausted",
            str,
            "error",
            "A request whose recordings were all used: error (a miss), repeat_last (the last "
            "one again) or cycle (all of them again, in order).",
            choices=list(ON_EXHAUSTED),
        )
        loader.add_option(
            "llmitm_strict_drift",
            bool,
            False,
            "Refuse a replay hit (400) whose upstream request llmitm builds differently today "
            "than when it was recorded, instead of only warning.",
        )
        loader.add_option(
            "llmitm_match_host",
            bool,
            False,
            "Count the request's host in match keys.",
        )
        loader.add_option(
            "llmitm_miss_status",
            int,
            400,
            "HTTP status of a strict replay miss (400-599; SDKs retry a 5xx, but the miss "
            "says x-should-retry: false).",
        )
        loader.add_option(
            "llmitm_miss_advice",
            str,
            "",
            "What a strict replay miss tells the user to do, in its answer and its log line "
            "(default: llmitm's own commands and --set options).",
        )
        loader.add_option(
            "llmitm_record_all",
            bool,
            False,
            "Record (and replay) every flow through the proxy, not only LLM API calls (chat, "
            "Responses and Azure calls, Responses state calls).",
        )
        loader.add_option(
            "llmitm_allow_record_in_ci",
            bool,
            False,
            "Let a recording mode write llmitm_recordings when CI=true (refused otherwise).",
        )

    def configure(self, updated: set[str]) -> None:
        check_choices(
            updated,
            {
                "llmitm_record": MODES,
                "llmitm_replay_from": REPLAY_FROM,
                "llmitm_match_profile": tuple(PROFILES),
                "llmitm_export_timing": folder_format.TIMINGS,
                "llmitm_replay_exhausted": ON_EXHAUSTED,
            },
        )
        if updated & {"llmitm_record", "llmitm_recordings", "llmitm_allow_record_in_ci"}:
            mode = ctx.options.llmitm_record
            refusal = record_refusal(
                mode,
                mode in RECORDING,
                ctx.options.llmitm_recordings,
                ctx.options.llmitm_allow_record_in_ci,
                os.environ,
            )
            if refusal is not None and self._started:
                raise exceptions.OptionsError(refusal)
            if refusal is not None:
                # At start-up an OptionsError from a script addon comes with a traceback; an
                # error log makes mitmdump exit 1 with the message alone. Record nothing
                # meanwhile.
                logger.error("llmitm: %s", refusal)
                updated = updated - {"llmitm_record"}
                self.mode = "off"
        if "llmitm_record" in updated:
            self.mode = ctx.options.llmitm_record
            if self.mode == "replay" and ctx.options.upstream_cert:
                # Sniffing the upstream's certificate would connect upstream.
                ctx.options.update(upstream_cert=False)
        if "llmitm_record_all" in updated:
            self.record_all = bool(ctx.options.llmitm_record_all)
        if updated & {"llmitm_replay_timing", "llmitm_replay_cap_ms"}:
            try:
                self.timing = parse_timing(
                    ctx.options.llmitm_replay_timing, ctx.options.llmitm_replay_cap_ms
                )
            except ValueError as exc:
                raise exceptions.OptionsError(str(exc)) from None
        if updated & {"llmitm_match_profile", "llmitm_match_ignore", "llmitm_match_host"}:
            try:
                self.key_options = KeyOptions(
                    profile=ctx.options.llmitm_match_profile,
                    ignore=tuple(ctx.options.llmitm_match_ignore),
                    match_host=ctx.options.llmitm_match_host,
                )
            except ValueError as exc:
                raise exceptions.OptionsError(str(exc)) from None
        if "llmitm_miss_status" in updated and not 400 <= ctx.options.llmitm_miss_status <= 599:
            raise exceptions.OptionsError(
                f"llmitm_miss_status must be an HTTP error status (400-599), not "
                f"{ctx.options.llmitm_miss_status}"
            )

    # --- lifecycle -----------------------------------------------------------------------

    def running(self) -> None:
        self.report.mode = self.mode
        self.report.strict_drift = bool(ctx.options.llmitm_strict_drift)
        self._started = True

    def start_loading(self) -> asyncio.Task[None] | None:
        """Load the replay pools (run by :class:`LlmRecordingsLoad`, once the store is open;
        mitmproxy awaits the task before any flow)."""
        if self.mode == "off" or self._loading is not None:
            return None
        self._loading = asyncio.get_running_loop().create_task(
            self._load(), name="llmitm recordings load"
        )
        return self._loading

    async def _load(self) -> None:
        if self.mode in RECORDING:
            self.fingerprint_key = await self._fingerprint_key()
        if self.mode in REPLAYING:
            await self._load_recordings()

    async def _fingerprint_key(self) -> bytes | None:
        try:
            store = await self.store.ready()
            return await store.fingerprint_key() if isinstance(store, SqliteStore) else None
        except Exception:  # a fingerprint is a nicety: recording goes on without it
            logger.warning("llmitm: no credential fingerprints (cannot read their key)")
            return None

    async def _load_recordings(self) -> None:
        # Paced answers and recorded truncations stream through a loopback relay: mitmproxy
        # sends a response an addon makes in one piece (mitmproxy-notes.md finding 1).
        self.relay = await self.shared_relay.ready()
        folder = ctx.options.llmitm_recordings
        interactions: list[Interaction] = []
        try:
            if folder:
                path = Path(folder).expanduser()
                if path.exists() or self.mode == "replay":
                    interactions = folder_files.read_folder(path)
                self.report.source = str(path)
            else:
                store = await self.store.ready()
                if isinstance(store, SqliteStore):
                    interactions = await store.load_recordings()
                    self.report.source = str(store.path)
                else:
                    logger.warning("llmitm: replay mode without a store or llmitm_recordings")
        except Exception as exc:
            # A replay that cannot read its recordings must not pretend: stop start-up.
            logger.error("llmitm: cannot load recordings: %s", exc)
            return
        rekey(interactions, self.key_options)
        self.pool = ReplayPool.build(interactions)
        self.report.loaded = len(interactions)
        logger.info("llmitm: %s mode, %d recording(s) loaded", self.mode, len(interactions))

    def done(self) -> None:
        self._write_report()
        self._write_folder()

    def _write_report(self) -> None:
        path = ctx.options.llmitm_replay_report
        if not path:
            return
        document = self.report.to_json(self.pool.unused() if self.mode in REPLAYING else [])
        target = Path(path)
        partial = target.with_suffix(target.suffix + ".partial")
        partial.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))
        partial.replace(target)

    def _write_folder(self) -> None:
        folder = ctx.options.llmitm_recordings
        if not folder or self.mode not in RECORDING or not self.recorded:
            return
        path = Path(folder).expanduser()
        existing: list[Interaction] = []
        if (path / folder_format.MANIFEST).is_file():
            try:
                existing = folder_files.read_folder(path)
            except folder_format.FolderError as exc:
                logger.error("llmitm: not writing %s: %s", path, exc)
                return
        kept = [i for i in existing if i.scope not in self._wiped]
        # Files carry positions, not times: keep the folder's order, then this run's.
        for order, interaction in enumerate(kept):
            interaction.started_us = order
        base = len(kept)
        fresh = sorted(self.recorded, key=lambda i: (i.started_us, i.id))
        for order, interaction in enumerate(fresh):
            interaction.started_us = base + order
        written = folder_files.write_folder(
            path,
            [*kept, *fresh],
            {"profile": self.key_options.profile, "ignore": list(self.key_options.ignore)},
            timing=ctx.options.llmitm_export_timing,
        )
        logger.info("llmitm: wrote %d recording(s) to %s", len(written), path)

    # --- hooks ---------------------------------------------------------------------------

    def request(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error or not flow.live or flow.metadata.get(SOCKET_KEY):
            return  # a socket llmitm serves is recorded as the calls made over it
        request = flow.request
        scope = ctx.options.llmitm_scope or GLOBAL_SCOPE
        in_path, path = split_scope_path(request.path)
        if in_path is not None:
            scope, request.path = in_path, path  # never forwarded upstream
        for name in SCOPE_HEADERS:
            value = request.headers.pop(name, None)
            if value:
                scope = value
        mode = self.mode
        if mode == "off":
            return
        if not (self.record_all or is_llm_call(request.path)):
            # Telemetry, trace uploads and the like: proxied, never recorded or replayed.
            if mode == "replay" and request.path != STATUS_PATH:  # the router answers that
                _answer(flow, *_no_network(request.pretty_url), "offline")
            return
        try:
            capture = self._capture(flow, scope)
        except Exception:  # recording must never cost the client its answer
            logger.exception("llmitm: cannot record %s", request.pretty_url)
            return
        _CAPTURES[flow] = capture
        if mode in REPLAYING:
            outcome = self.pool.take(scope, capture.key, ctx.options.llmitm_replay_exhausted)
            if isinstance(outcome, Hit):
                self.report.hits += 1
                capture.hit = outcome
                # Today's translator re-makes the answer with the recorded ids and times.
                set_mint(flow, Mint(outcome.interaction.minted))
                if ctx.options.llmitm_replay_from == "client" or (
                    "upstream_resp" not in outcome.interaction.legs
                ):
                    capture.served = True
                    self.deliver(flow, outcome.interaction, verbatim(outcome.interaction), True)
                return  # else LlmRecordTap answers once the router has planned the flow
            if mode == "replay" or (mode == "once" and self.pool.has_scope(scope)):
                self._miss(flow, outcome)
                return
        if mode == "rewrite" and scope not in self._wiped:
            self._wiped.add(scope)
            self.store.submit(DeleteScope(scope))
        capture.record = True
        set_mint(flow, Mint())
        # The stream callable should see the body as sent, not gzip (the router does the
        # same for the flows it plans).
        request.headers["accept-encoding"] = "identity"

    def server_connect(self, data: ServerConnectionHookData) -> None:
        # Replay opens no socket (the backstop of the answers in ``request``): whatever got
        # this far — a raw TCP or UDP stream, a tunnel ignore_hosts passes through unseen, a
        # flow nothing answered — is refused; only llmitm's own relay, which paces hits, is
        # dialled.
        address = data.server.address
        if self.mode != "replay" or address is None:
            return
        relay = self.shared_relay.listening()
        if relay is not None and (address[0], address[1]) == ("127.0.0.1", relay.port):
            return
        target = f"{address[0]}:{address[1]}"
        logger.info("llmitm: replay: not connecting to %s", target)
        data.server.error = (
            f"llmitm is in replay mode and never goes upstream: not connecting to {target}"
        )

    def _capture(self, flow: http.HTTPFlow, scope: str) -> Capture:
        request = flow.request
        raw = request.get_content(strict=False) or b""
        content = redact_body(raw)
        key = match_key(
            request.method,
            request.path,
            _fields(request.headers),
            content,
            self.key_options,
            request.pretty_host,
        )
        client_req = Message(
            headers=redact_headers(_fields(request.headers)),
            content=content,
            method=request.method,
            url=redact_url(request.pretty_url),
        )
        capture = Capture(scope, key, client_req, _now_us())
        capture.request_clean = content is raw  # redact_body hands back a clean body itself
        if self.fingerprint_key is not None:
            sent = credential(_fields(request.headers))
            if sent is not None:
                capture.credential = fingerprint(self.fingerprint_key, sent)
        return capture

    def _miss(self, flow: http.HTTPFlow, miss: Miss) -> None:
        where = miss.closest.source if miss.closest is not None else None
        advice = ctx.options.llmitm_miss_advice
        status, headers, body = miss_error(miss, where, ctx.options.llmitm_miss_status, advice)
        _answer(flow, status, headers, body, None)
        closest = miss.closest
        diff = canonical_diff(closest.canonical, miss.key.canonical) if closest else []
        key = miss.key
        lines = [
            f"REPLAY MISS scope={miss.scope} mode={self.mode} profile={self.key_options.profile}",
            f"  request : {key.method} {key.route} model={key.model or '-'} "
            f"stream={str(key.stream).lower()}",
            f"  key     : {key.key} (match key version {key.version})",
            f"  reason  : {miss.describe()} ({len(self.pool)} loaded, "
            f"{len(self.pool.unused())} unused)",
        ]
        if closest is not None:
            lines.append(f"  closest : {closest.id} {where or ''}".rstrip())
            lines += [f"  diff    : {line}" for line in diff] or ["  diff    : (same text)"]
        lines.append(
            f"  fix     : {advice}"
            if advice
            else "  fix     : --set llmitm_record=replay-or-record to record it, or "
            "--set llmitm_match_ignore=PATH to ignore a field"
        )
        logger.error("\n".join(lines))
        self.report.misses.append(
            {
                "scope": miss.scope,
                "key": key.key,
                "reason": miss.reason,
                "request": f"{key.method} {key.route}",
                "model": key.model,
                "closest": closest.id if closest else None,
                "diff": diff,
            }
        )
        self.store.submit(
            ReplayMissRecord(
                at_us=_now_us(),
                scope=miss.scope,
                key=key.key,
                reason=miss.reason,
                canonical=key.canonical,
                closest_id=closest.id if closest else None,
                closest_canonical=closest.canonical if closest else None,
            )
        )

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        capture: Capture | None = _CAPTURES.get(flow)
        response = flow.response
        if capture is None or not capture.record or response is None:
            return
        # The upstream's head, before the translator changes it.
        capture.upstream_status = response.status_code
        capture.upstream_headers = _fields(response.headers)

    def response(self, flow: http.HTTPFlow) -> None:
        capture: Capture | None = _CAPTURES.get(flow)
        response = flow.response
        if capture is None or not capture.record or response is None or response.stream:
            return
        # The upstream's body, before the translator replaces it.
        capture.upstream_body = response.get_content(strict=False)

    def deliver(
        self, flow: http.HTTPFlow, interaction: Interaction, answer: Answer, as_recorded: bool
    ) -> None:
        """Answer a hit: at once, or paced through the relay; a recorded upstream cut of a
        stream llmitm relayed as it was (``as_recorded``, or no plan) ends abruptly again."""
        truncated = interaction.truncated or ""
        cut = bool(truncated) and (truncated.startswith("client") or not interaction.plan)
        cut = cut and (as_recorded or not interaction.plan)
        if (self.timing.instant and not cut) or self.relay is None:
            _answer(flow, answer.status, answer.headers, answer.body, "hit")
            return
        chunks = answer.chunks
        if chunks is None:
            chunks = [(interaction.ttfb_us or 0, answer.body)]
        arrived = flow.request.timestamp_end or time.time()
        job = ReplayJob(
            status=answer.status,
            headers=[*answer.headers, ("x-llmitm-replay", "hit")],
            chunks=chunks,
            ttfb_us=interaction.ttfb_us,
            timing=self.timing,
            cut=cut,
            started=time.monotonic() - max(0.0, time.time() - arrived),
        )
        self.shared_relay.point(flow, self.relay.register(job))
        flow.metadata.pop(METADATA_KEY, None)  # played as recorded: nothing to translate

    def finished(self, interaction: Interaction) -> None:
        """Called by the tap with a finished, redacted interaction."""
        if self.before_record is not None:
            try:
                kept = self.before_record(interaction)
            except Exception:  # a broken filter must not write what it was meant to filter
                logger.exception("llmitm: before_record failed; %s not recorded", interaction.id)
                return
            if kept is None:
                return
            interaction = kept
        self.report.recorded += 1
        self.store.submit(RecordingWrite(interaction))
        if ctx.options.llmitm_recordings:
            self.recorded.append(interaction)


def _no_network(url: str) -> tuple[int, list[tuple[str, str]], bytes]:
    body = {
        "error": {
            "message": f"llmitm is in replay mode and never goes upstream: {url} is not an "
            "LLM API call it records.",
            "type": "llmitm_replay_offline",
            "param": None,
            "code": "replay_offline",
        }
    }
    headers = [("content-type", "application/json"), ("x-should-retry", "false")]
    return 502, headers, orjson.dumps(body)


def _answer(
    flow: http.HTTPFlow,
    status: int,
    headers: list[tuple[str, str]],
    body: bytes,
    replay: str | None,
) -> None:
    response = http.Response.make(status, body, [(k.encode(), v.encode()) for k, v in headers])
    if replay:
        response.headers["x-llmitm-replay"] = replay
    flow.response = response


class LlmRecordingsLoad:
    """Loads the replay pools in ``running``: placed after the store, which the recorder —
    first in line, to see each request as the client sent it — is not (mitmproxy awaits each
    addon's ``running`` in order, so the recorder cannot wait for the store there)."""

    name = "llmitm_recordings_load"

    def __init__(self, recorder: LlmRecorder) -> None:
        self.recorder = recorder

    def running(self) -> asyncio.Task[None] | None:
        return self.recorder.start_loading()


class LlmRecordTap:
    """The back half: serves from-upstream replay hits, hooks streams, records at the end."""

    name = "llmitm_record_tap"

    def __init__(self, recorder: LlmRecorder) -> None:
        self.recorder = recorder
        self.compactor = TapCompactor()

    def done(self) -> None:
        self.compactor.stop()

    def request(self, flow: http.HTTPFlow) -> None:
        capture: Capture | None = _CAPTURES.get(flow)
        if capture is None:
            return
        if capture.hit is not None:
            if flow.response is None and not capture.served:
                capture.served = True
                self._serve(flow, capture)
            return
        if not capture.record or flow.response is not None:
            return  # answered locally (a bad request): nothing went upstream
        capture.forwarded = True
        request = flow.request
        capture.upstream_req = Message(
            headers=redact_headers(_fields(request.headers)),
            content=request.get_content(strict=False),  # redacted at the flow's end
            method=request.method,
            url=redact_url(request.pretty_url),
        )

    def _serve(self, flow: http.HTTPFlow, capture: Capture) -> None:
        assert capture.hit is not None
        interaction = capture.hit.interaction
        state = flow.metadata.pop(METADATA_KEY, None)  # the replay answers, not the translator
        plan = state.plan if isinstance(state, FlowState) else None
        context = state.context if isinstance(state, FlowState) else None
        if self._check_drift(flow, interaction):
            return  # refused: llmitm_strict_drift
        as_recorded = plan is None
        try:
            strip = isinstance(state, FlowState) and state.strip_usage
            answer = from_upstream(interaction, plan, context, strip_usage=strip)
        except Exception:
            logger.exception("llmitm: cannot replay %s; serving the client leg", interaction.id)
            answer, as_recorded = verbatim(interaction), True
        self.recorder.deliver(flow, interaction, answer, as_recorded)

    def _check_drift(self, flow: http.HTTPFlow, interaction: Interaction) -> bool:
        """Warn of (and report) drift; under ``llmitm_strict_drift`` answer it with a 400
        instead of the recording, and say so (``True``)."""
        recorded = interaction.legs.get("upstream_req")
        if recorded is None:
            return False
        now = redact_body(flow.request.get_content(strict=False) or b"")
        options = self.recorder.key_options
        then = match_key(recorded.method or "POST", "/v1/x", [], recorded.content, options)
        today = match_key(flow.request.method, "/v1/x", [], now, options)
        if then.key == today.key:
            return False
        strict = bool(ctx.options.llmitm_strict_drift)
        diff = canonical_diff(then.canonical, today.canonical, limit=30)
        (logger.error if strict else logger.warning)(
            "llmitm: replay drift: the upstream request for %s differs from the recorded "
            "one (%s):\n%s",
            interaction.id,
            capture_label(interaction),
            "\n".join(diff),
        )
        self.recorder.report.drift.append({"id": interaction.id, "diff": diff})
        # Kept like a miss, so `llmitm rec diff --last-miss` shows the whole difference.
        self.recorder.store.submit(
            ReplayMissRecord(
                at_us=_now_us(),
                scope=interaction.scope,
                key=interaction.key,
                reason="drift",
                canonical=today.canonical,
                closest_id=interaction.id,
                closest_canonical=then.canonical,
            )
        )
        if not strict:
            return False
        _answer(flow, *drift_error(interaction, diff, interaction.source or None), None)
        return True

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        capture: Capture | None = _CAPTURES.get(flow)
        response = flow.response
        if capture is None or not capture.forwarded or response is None:
            return
        stream = flow_stream(flow)
        if stream is not None:
            capture.tap = tap = StreamTap()
            stream.add_note(tap.note)
            self.compactor.add(tap)
        elif callable(response.stream):
            logger.debug("llmitm: not recording the body of an unknown stream callable")

    def response(self, flow: http.HTTPFlow) -> None:
        self._finish(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        self._finish(flow)

    def _finish(self, flow: http.HTTPFlow) -> None:
        capture: Capture | None = _CAPTURES.get(flow)
        if capture is None or not capture.record or capture.done:
            return
        capture.done = True
        self.compactor.discard(capture.tap)
        try:
            interaction = build_interaction(flow, capture, self.recorder.session)
        except Exception:
            logger.exception("llmitm: cannot record %s", flow.request.pretty_url)
            return
        capture.recorded = interaction.id
        self.recorder.finished(interaction)


def capture_label(interaction: Interaction) -> str:
    return f"{interaction.method} {interaction.route} model={interaction.model or '-'}"


def build_interaction(flow: http.HTTPFlow, capture: Capture, session: str) -> Interaction:
    """The finished flow as a redacted :class:`Interaction` (runs once, at the flow's end)."""
    request, response = flow.request, flow.response
    t0 = request.timestamp_end or request.timestamp_start
    state = flow_state(flow)
    key = capture.key
    interaction = Interaction(
        id=new_id(capture.started_us),
        scope=capture.scope,
        key=key.key,
        key_version=key.version,
        method=key.method,
        route=key.route,
        model=key.model,
        stream=key.stream,
        canonical=key.canonical,
        started_us=capture.started_us,
        session=session,
        mode=ctx.options.llmitm_record,
        credential=capture.credential,
    )
    interaction.legs["client_req"] = capture.client_req
    mint = flow_mint(flow)
    if mint is not None:
        interaction.minted = mint.tape
    if isinstance(state, FlowState):
        interaction.endpoint = state.plan.endpoint.name
        interaction.plan = state.plan.label if state.plan.translates else "passthrough"
        if state.upstream_cut:
            interaction.truncated = f"upstream: {state.upstream_cut}"
    upstream_chunks, client_chunks = _stream_legs(capture, t0)
    routed = state.routed if isinstance(state, FlowState) else None
    if routed is not None and routed.upstream_request is not None:
        capture.upstream_req = _relayed_request(routed.upstream_request)
    if capture.forwarded and capture.upstream_req is not None:
        upstream_req = capture.upstream_req
        upstream_req.content = redact_body(upstream_req.content)
        interaction.legs["upstream_req"] = upstream_req
        if capture.upstream_status:
            upstream = Message(
                headers=redact_headers(capture.upstream_headers), status=capture.upstream_status
            )
            if upstream_chunks is not None:
                upstream.chunks = upstream_chunks
            else:
                upstream.content = redact_body(capture.upstream_body)
            interaction.legs["upstream_resp"] = upstream
    if response is not None:
        client = Message(
            headers=redact_headers(_fields(response.headers)), status=response.status_code
        )
        if client_chunks is not None:
            client.chunks = client_chunks
        else:
            with contextlib.suppress(ValueError):
                client.content = redact_body(response.get_content(strict=False))
        interaction.legs["client_resp"] = client
        interaction.status = response.status_code
        if response.timestamp_start and t0:
            interaction.ttfb_us = max(0, round((response.timestamp_start - t0) * 1e6))
        end = response.timestamp_end or time.time()
        interaction.duration_us = max(0, round((end - t0) * 1e6))
    if flow.error is not None:
        interaction.error = flow.error.msg
        if interaction.truncated is None:
            side = "client" if "client" in flow.error.msg.lower() else "upstream"
            interaction.truncated = f"{side}: {flow.error.msg}"
    return interaction


def _relayed_request(request: UpstreamRequest) -> Message:
    """The upstream leg of a relayed flow: what the answering endpoint was sent (the flow's
    request names llmitm's relay)."""
    return Message(
        headers=redact_headers(list(request.headers)),
        content=request.body,  # redacted with the other legs
        method=request.method,
        url=redact_url(request.url),
    )


def _stream_legs(
    capture: Capture, t0: float
) -> tuple[Sequence[Chunk] | None, Sequence[Chunk] | None]:
    """The upstream and client pieces of a streamed flow, as offsets, redacted.

    Runs once per flow over what the tap kept (:mod:`llmitm.exchange.tap`), and each pass
    happens once: a client leg that is the upstream leg (a passthrough) shares its pieces, and
    a client leg made only of clean inputs shares their verdict that there is nothing to
    redact. Times stay as they are: offsets are worked out when read."""
    tap = capture.tap
    if tap is None:
        return None, None
    times, upstream_leg, client_leg = tap.finish()
    body = upstream_leg.body()
    clean = not may_hold_secret(body)
    upstream: Sequence[Chunk] = pieces(times, t0, upstream_leg)
    if not clean:
        upstream = redact_chunks(upstream)
    if client_leg is None:
        return upstream, upstream  # relayed as it came, or a guard handed each chunk on
    answer = client_leg.body()
    client = pieces(times, t0, client_leg)
    if clean and capture.request_clean:
        # A translated answer is made of the upstream's bytes and fields of the client's own
        # request (echoed instructions, tools): neither held a credential, so neither does it.
        return upstream, client
    if clean and answer == body:
        return upstream, client  # same bytes, other split points: nothing to redact either
    return upstream, redact_chunks(client)
