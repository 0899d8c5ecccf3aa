"""Reasoning continuity without server state: reasoning sealed into ``encrypted_content``.

(Compaction summaries are sealed the same way, under their own kind, so a token made for
one can never be opened as the other: :mod:`llmitm.responses_api.compaction`.)

A ``store: false`` client (Codex) keeps the conversation itself and sends reasoning items
back on the next turn with the opaque ``encrypted_content`` it was given. llmitm puts the
reasoning text there as a Fernet token (AES-128-CBC with HMAC-SHA256, from ``cryptography``,
which mitmproxy already depends on) and, when the item comes back, opens it and restores the
text, so chat backends that want prior reasoning (DeepSeek, Kimi) get it as
``reasoning_content`` on the assistant turn.

Why this is safe:
- the key is 256 random bits made once by SQLite's ``randomblob`` when the store's schema is
  created (or, with no store, per process); it lives only in the owner-only database file,
  never in a response, a log line or the configuration;
- tokens are authenticated: a token llmitm did not make, or one changed by a byte, does not
  open, so a client can only hand back reasoning llmitm itself produced — a token from
  another provider (OpenAI's own, after switching endpoints) is simply not restored;
- the text is encrypted, so the token reveals nothing to whoever holds the transcript beyond
  what the summary the client was shown already did.
"""

from __future__ import annotations

import base64
import logging
import secrets
from typing import Any

import orjson
from cryptography.fernet import Fernet, InvalidToken

logger = logging.getLogger(__name__)

_VERSION = 1
REASONING = "reasoning"


class ReasoningSeal:
    """Seal reasoning text into a token and open it again, with one 32-byte key."""

    def __init__(self, key: bytes | None = None) -> None:
        raw = key if key is not None else secrets.token_bytes(32)
        if len(raw) != 32:
            raise ValueError("the reasoning seal key must be 32 bytes")
        self._fernet = Fernet(base64.urlsafe_b64encode(raw))
        self._remembered: dict[tuple[str, str], str] = {}

    def seal(self, item: dict[str, Any]) -> str:
        """The ``encrypted_content`` for a reasoning item (its summary and content text)."""
        return self.seal_text(reasoning_text(item))

    def open(self, token: Any) -> str | None:
        """The reasoning text sealed in ``token``, or ``None`` when it is not llmitm's."""
        return self.open_text(token)

    def seal_text(self, text: str, kind: str = REASONING) -> str:
        """A token holding ``text`` that only :meth:`open_text` of the same ``kind`` opens."""
        payload: dict[str, Any] = {"v": _VERSION, "text": text}
        if kind != REASONING:  # reasoning tokens predate kinds: theirs stay as they were
            payload["kind"] = kind
        return self._fernet.encrypt(orjson.dumps(payload)).decode("ascii")

    def open_text(self, token: Any, kind: str = REASONING) -> str | None:
        """The text sealed in ``token`` as ``kind``, or ``None`` when it is not llmitm's."""
        if not isinstance(token, str) or not token:
            return None
        remembered = self._remembered.get((kind, token))
        if remembered is not None:
            return remembered
        try:
            payload = orjson.loads(self._fernet.decrypt(token.encode("ascii")))
        except (InvalidToken, ValueError, UnicodeEncodeError):
            return None
        if not isinstance(payload, dict) or payload.get("v") != _VERSION:
            return None
        if payload.get("kind", REASONING) != kind:
            return None
        text = payload.get("text")
        return text if isinstance(text, str) else None

    def remember(self, token: str, text: str, kind: str = REASONING) -> None:
        """Open ``token`` to ``text`` from now on: a replay serves tokens sealed under the
        recording process's key, and its client sends them back next turn."""
        self._remembered[(kind, token)] = text


def reasoning_text(item: dict[str, Any]) -> str:
    """The text of a reasoning item: its raw content if any, else its summary parts."""
    for key, part_type in (("content", "reasoning_text"), ("summary", "summary_text")):
        parts = item.get(key)
        if isinstance(parts, list):
            texts = [
                part["text"]
                for part in parts
                if isinstance(part, dict)
                and part.get("type") == part_type
                and isinstance(part.get("text"), str)
            ]
            if any(texts):
                return "\n\n".join(texts)
    return ""


def restore_reasoning(items: Any, seal: ReasoningSeal) -> int:
    """Open llmitm's tokens in the reasoning items of a request's ``input`` (in place): the
    sealed text becomes the item's ``reasoning_text`` content, which request mapping attaches
    to the next assistant turn. Returns how many items were restored."""
    if not isinstance(items, list):
        return 0
    restored = 0
    for item in items:
        if not isinstance(item, dict) or item.get("type") != "reasoning":
            continue
        text = seal.open(item.get("encrypted_content"))
        if text is None:
            continue
        item["content"] = [{"type": "reasoning_text", "text": text}]
        restored += 1
    return restored
