"""Credential fingerprints: which key a recording was made with, without the key."""

from __future__ import annotations

import pytest

from llmitm.replay.fingerprint import credential, fingerprint


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ([("Authorization", "Bearer sk-abc")], "sk-abc"),
        ([("authorization", "bearer  sk-abc ")], "sk-abc"),
        ([("api-key", "azure-key")], "azure-key"),
        ([("x-api-key", "k1"), ("authorization", "Bearer k2")], "k2"),  # the bearer first
        ([("authorization", "")], None),
        ([("content-type", "application/json")], None),
    ],
)
def test_the_credential_a_request_sent(headers: list[tuple[str, str]], expected: str) -> None:
    assert credential(headers) == expected


def test_one_key_one_fingerprint_and_nothing_of_the_key() -> None:
    key = bytes(range(32))
    first = fingerprint(key, "sk-proj-abcdefghijklmnop")
    assert first == fingerprint(key, "sk-proj-abcdefghijklmnop")
    assert first.startswith("hmac:") and len(first) == len("hmac:") + 16
    assert first != fingerprint(key, "sk-proj-abcdefghijklmnoq")
    assert first != fingerprint(bytes(32), "sk-proj-abcdefghijklmnop")  # another database
