"""The flow recorder: decides, for each request as the client sent it, whether it is
recorded, replayed or neither, and hands finished records to the store.

First in line (before the router and the translator) it strips the scope (header or path
prefix) and keeps references to the request as it came; a replaying mode redacts it,
computes its match key and looks it up at once
(:class:`~llmitm.addons.record.replay.Replayer`), recording alone does that after the flow,
off the request path. In ``replay`` it also answers what is no LLM
call and dials nothing but llmitm's own relay. For a recorded flow it keeps the upstream's
response head and, for a non-streamed body, the body before the translator replaces them;
the record tap (:mod:`llmitm.addons.record.tap`) does the rest and calls :meth:`finished`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from mitmproxy import ctx, exceptions, http
from mitmproxy.addonmanager import Loader
from mitmproxy.proxy.server_hooks import ServerConnectionHookData

from llmitm.addons.access import REFUSED_KEY
from llmitm.addons.choices import check_choices
from llmitm.addons.record import options
from llmitm.addons.record.builder import RecordBuilder
from llmitm.addons.record.flows import Capture, capture_of, fields, keep_capture, now_us
from llmitm.addons.record.options import RecordSettings, read_settings
from llmitm.addons.record.recordings import write_folder, write_report
from llmitm.addons.record.replay import Replayer, answer_offline
from llmitm.addons.relay import LlmRelay
from llmitm.addons.state import SOCKET_KEY, set_mint
from llmitm.addons.status import STATUS_PATH
from llmitm.addons.store import LlmStore
from llmitm.replay.capture import ClientRequest, ReplayReport
from llmitm.replay.ci_guard import record_refusal
from llmitm.replay.keys import KeyOptions
from llmitm.replay.memo import RequestMemo
from llmitm.replay.model import Interaction, new_id
from llmitm.replay.pool import SCOPE_HEADERS, split_scope_path
from llmitm.store.recordings import DeleteScope, RecordingWrite
from llmitm.wire.ids import Mint
from llmitm.wire.paths import is_llm_call

logger = logging.getLogger(__package__)


class LlmFlowRecorder:
    """Options ``llmitm_record``, ``llmitm_recordings``, ``llmitm_replay_*``,
    ``llmitm_match_*``, ``llmitm_scope`` and friends (:mod:`llmitm.addons.record.options`);
    the front half of recording and replay."""

    name = "llmitm_recorder"

    def __init__(
        self,
        store: LlmStore,
        relay: LlmRelay,
        collection_due: Callable[[], bool] = lambda: False,
    ) -> None:
        self.store = store
        self.shared_relay = relay
        self.settings = RecordSettings()
        self.report = ReplayReport()
        self.replay = Replayer(store, relay, self.report)
        self.session = new_id()
        self.recorded: list[Interaction] = []
        """This run's recordings, kept for the recordings folder written at shutdown."""
        self.wiped: set[str] = set()
        self.fingerprint_key: bytes | None = None
        """Makes ``Interaction.credential`` (replay.fingerprint); read from the store."""
        self._started = False
        self.builder = RecordBuilder(self.finished, self._store_behind, collection_due)
        """Builds finished flows' records off the event loop, delivers them to finished()."""
        self.memo = RequestMemo()
        """What the records' redaction and keys made of recent bodies' parts: an agent's
        resent history costs its new items only."""
        self.before_record: Callable[[Interaction], Interaction | None] | None = None
        """Sees each finished, redacted interaction before it is kept; returns it (edited or
        not) or ``None`` to keep nothing (the pytest plugin's ``pytest_llmitm_before_record``)."""

    @property
    def mode(self) -> str:
        return self.settings.mode

    @property
    def key_options(self) -> KeyOptions:
        return self.settings.key_options

    # --- options -------------------------------------------------------------------------

    def load(self, loader: Loader) -> None:
        options.add_options(loader)

    def configure(self, updated: set[str]) -> None:
        check_choices(updated, options.CHOICES)
        if not updated & options.NAMES:
            return
        mode = self.settings.mode
        if updated & options.MODE_OPTIONS:
            wanted = ctx.options.llmitm_record
            refusal = record_refusal(
                wanted,
                wanted in options.RECORDING,
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
                mode = "off"
            elif "llmitm_record" in updated:
                mode = wanted
                if mode == "replay" and ctx.options.upstream_cert:
                    # Sniffing the upstream's certificate would connect upstream.
                    ctx.options.update(upstream_cert=False)
        try:
            self.settings = read_settings(ctx.options, mode)
        except ValueError as exc:
            raise exceptions.OptionsError(str(exc)) from None

    # --- lifecycle -----------------------------------------------------------------------

    def running(self) -> None:
        self.report.mode = self.settings.mode
        self.report.strict_drift = self.settings.strict_drift
        self._started = True

    def done(self) -> None:
        self.builder.flush()  # before the folder is written and the store closes
        settings = self.settings
        if settings.report:
            unused = self.replay.pool.unused() if settings.replaying else []
            write_report(settings.report, self.report, unused)
        if settings.recordings and settings.recording and self.recorded:
            write_folder(
                settings.recordings,
                self.recorded,
                self.wiped,
                settings.key_options,
                settings.export_timing,
            )

    # --- hooks ---------------------------------------------------------------------------

    def request(self, flow: http.HTTPFlow) -> None:
        if flow.error or not flow.live or flow.metadata.get(SOCKET_KEY):
            return  # a socket llmitm serves is recorded as the calls made over it
        # LlmAccess answers refusals before anything else sees the flow; they are recorded
        # all the same (never replayed). Other answers this early are not calls.
        refused = flow.response is not None
        if refused and flow.metadata.get(REFUSED_KEY) is None:
            return
        settings, request = self.settings, flow.request
        scope = settings.scope
        in_path, path = split_scope_path(request.path)
        if in_path is not None:
            scope, request.path = in_path, path  # never forwarded upstream
        for name in SCOPE_HEADERS:
            value = request.headers.pop(name, None)
            if value:
                scope = value
        mode = settings.mode
        if mode == "off":
            return
        if not (settings.record_all or is_llm_call(request.path)):
            # Telemetry, trace uploads and the like: proxied, never recorded or replayed.
            if mode == "replay" and request.path != STATUS_PATH:  # the router answers that
                answer_offline(flow)
            return
        try:
            capture = self._capture(flow, scope, settings)
        except Exception:  # recording must never cost the client its answer
            logger.exception("llmitm: cannot record %s", request.pretty_url)
            return
        keep_capture(flow, capture)
        if refused:
            if settings.recording:
                self._wipe_once(mode, scope)
                capture.record = True
            return
        if settings.replaying and self.replay.lookup(flow, capture, settings):
            return
        self._wipe_once(mode, scope)
        capture.record = True
        set_mint(flow, Mint())
        # The stream callable should see the body as sent, not gzip (the router does the
        # same for the flows it plans).
        request.headers["accept-encoding"] = "identity"

    def _store_behind(self) -> int:
        """Writes the store has not finished (the record builder paces itself by it)."""
        store = self.store.store
        if store is None:
            return 0
        stats = store.stats()
        return stats.submitted - stats.written - stats.failed

    def _wipe_once(self, mode: str, scope: str) -> None:
        """``rewrite``: the scope's old recordings go before its first new one."""
        if mode == "rewrite" and scope not in self.wiped:
            self.wiped.add(scope)
            self.store.submit(DeleteScope(scope))

    def server_connect(self, data: ServerConnectionHookData) -> None:
        # Replay opens no socket (the backstop of the answers in ``request``): whatever got
        # this far — a raw TCP or UDP stream, a tunnel ignore_hosts passes through unseen, a
        # flow nothing answered — is refused; only llmitm's own relay, which paces hits, is
        # dialled.
        address = data.server.address
        if self.settings.mode != "replay" or address is None:
            return
        relay = self.shared_relay.listening()
        if relay is not None and (address[0], address[1]) == ("127.0.0.1", relay.port):
            return
        target = f"{address[0]}:{address[1]}"
        logger.info("llmitm: replay: not connecting to %s", target)
        data.server.error = (
            f"llmitm is in replay mode and never goes upstream: not connecting to {target}"
        )

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        capture = capture_of(flow)
        response = flow.response
        if capture is None or not capture.record or response is None:
            return
        # The upstream's head, before the translator changes it.
        capture.upstream_status = response.status_code
        capture.upstream_headers = fields(response.headers)

    def response(self, flow: http.HTTPFlow) -> None:
        capture = capture_of(flow)
        response = flow.response
        if capture is None or not capture.record or response is None or response.stream:
            return
        # The upstream's body, before the translator replaces it.
        capture.upstream_body = response.get_content(strict=False)

    def finished(self, interaction: Interaction) -> None:
        """Called (on the event loop) with a finished, redacted interaction."""
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
        if self.settings.recordings:
            self.recorded.append(interaction)

    def _capture(self, flow: http.HTTPFlow, scope: str, settings: RecordSettings) -> Capture:
        """The flow's capture: references to the request as it came, nothing computed. Only
        a replaying mode, which must look the request up before answering it, redacts and
        keys it here; recording alone does that once the flow has ended, off the request
        path (:class:`~llmitm.addons.record.builder.RecordBuilder`)."""
        request = flow.request
        capture = Capture(scope, None, None, now_us())
        capture.unseen = ClientRequest(
            method=request.method,
            path=request.path,
            url=request.pretty_url,
            host=request.pretty_host,
            headers=fields(request.headers),
            content=request.get_content(strict=False) or b"",
        )
        capture.key_options = settings.key_options
        capture.fingerprint_key = self.fingerprint_key
        capture.memo = self.memo
        if settings.replaying:
            capture.see()
        return capture
