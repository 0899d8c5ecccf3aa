"""llmitm's mitmproxy options and the configuration they point at, parsed once in
``configure`` and shared with the other addons. A bad file stops start-up with one error line
naming file, key and expectation; a bad file set later is refused with an ``OptionsError``
and the running configuration stays."""

from __future__ import annotations

import logging
from collections.abc import Set

from mitmproxy import ctx, exceptions
from mitmproxy.addonmanager import Loader

from llmitm.addons.choices import check_choices
from llmitm.routing.config import (
    Config,
    ConfigError,
    Endpoint,
    default_config,
    load_config,
    with_stream_idle_timeout,
)
from llmitm.translate.context import TranslateOptions
from llmitm.wire.modes import REASONING_MODES

logger = logging.getLogger(__name__)

_OPTIONS = {"llmitm_config", "llmitm_reasoning", "llmitm_strict", "llmitm_stream_idle_timeout"}


class LlmitmSettings:
    """Options ``llmitm_config``, ``llmitm_reasoning``, ``llmitm_strict``,
    ``llmitm_stream_idle_timeout``."""

    name = "llmitm_settings"

    def __init__(self) -> None:
        self.config: Config = default_config()
        self._loaded = False
        self._running = False

    def load(self, loader: Loader) -> None:
        loader.add_option(
            "llmitm_config",
            str,
            "",
            "llmitm's TOML configuration (endpoints, routes, settings). Empty: pass OpenAI "
            "and Azure traffic through unchanged.",
        )
        loader.add_option(
            "llmitm_reasoning",
            str,
            "",
            "How reasoning reaches chat clients; overrides the file's llmitm.reasoning.",
            choices=["", *REASONING_MODES],
        )
        loader.add_option(
            "llmitm_strict",
            bool,
            False,
            "Refuse hosted tools and fields the target API lacks instead of dropping them.",
        )
        loader.add_option(
            "llmitm_stream_idle_timeout",
            int,  # mitmproxy's --set parses no float options
            0,
            "Seconds a routed stream may go without a byte from the upstream before the client "
            "gets an error in its protocol. 0: the file's [routing] stream_idle_timeout and "
            "per-route values; a positive number overrides them all; a negative one lifts "
            "the limit.",
        )

    def configure(self, updated: Set[str]) -> None:
        if "connection_strategy" in updated and ctx.options.connection_strategy == "eager":
            # Answering locally (400s for bad requests) fails under eager connections, which
            # dial the original target before any hook runs.
            ctx.options.update(connection_strategy="lazy")
        check_choices(updated, {"llmitm_reasoning": ("", *REASONING_MODES)})
        if not updated & _OPTIONS:
            return
        path = ctx.options.llmitm_config
        try:
            config = load_config(path) if path else default_config()
        except ConfigError as exc:
            if not self._loaded:
                # At start-up an OptionsError from a script addon is printed with a
                # traceback; an error log makes mitmdump exit 1 with just the message.
                logger.error("llmitm: %s", exc)
                return
            raise exceptions.OptionsError(str(exc)) from None
        self.config = with_stream_idle_timeout(config, ctx.options.llmitm_stream_idle_timeout)
        self._loaded = True
        if self._running:
            self._announce()

    def running(self) -> None:
        # Said here, not in the first configure: mitmdump applies -q and friends after the
        # --set options, so a line logged then would ignore them.
        self._running = True
        self._announce()

    def _announce(self) -> None:
        if ctx.options.llmitm_config:
            logger.info(
                "llmitm: %s: %d endpoint(s), %d route(s)",
                ctx.options.llmitm_config,
                len(self.config.endpoints),
                len(self.config.routes),
            )

    def translate_options(self, endpoint: Endpoint) -> TranslateOptions:
        """Translation options for a request going to ``endpoint``."""
        settings = self.config.settings
        return TranslateOptions(
            reasoning=ctx.options.llmitm_reasoning or settings.reasoning,  # type: ignore[arg-type]
            strict=ctx.options.llmitm_strict or settings.strict,
            drop_unsupported=settings.drop_unsupported,
            think_open_missing=endpoint.think_open_missing,
            reasoning_passthrough=endpoint.reasoning_passthrough,
            reasoning_summary=endpoint.reasoning_summary,
        )
