"""Keys of stored recordings recomputed under today's rules (``rec migrate``, ``rec verify``,
``rec why``).

The redacted client request is stored with every recording, so a key is recomputed exactly:
an ignore path added after recording, another profile, or a new :data:`MATCH_KEY_VERSION`
applies to old recordings without re-recording them. The replay addon re-keys what it loads
with it, and the CLI's ``migrate``, ``verify`` and ``why`` use it.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from llmitm.replay.keys import KeyOptions, MatchKey, match_key
from llmitm.replay.model import Interaction


def request_key(interaction: Interaction, options: KeyOptions) -> MatchKey | None:
    """The key of ``interaction``'s client request under ``options`` (``None`` without one)."""
    request = interaction.legs.get("client_req")
    if request is None or not request.method:
        return None
    parts = urlsplit(request.url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return match_key(
        request.method, path, request.headers, request.content, options, parts.hostname or ""
    )


def rekey(interactions: Iterable[Interaction], options: KeyOptions) -> list[Interaction]:
    """Give each interaction its key under ``options``; return those whose key, canonical
    text or key version changed."""
    changed = []
    for interaction in interactions:
        key = request_key(interaction, options)
        if key is None:
            continue
        before = (interaction.key, interaction.canonical_utf8, interaction.key_version)
        interaction.key, interaction.canonical_utf8 = key.key, key.canonical_utf8
        interaction.key_version = key.version
        if before != (key.key, key.canonical_utf8, key.version):
            changed.append(interaction)
    return changed
