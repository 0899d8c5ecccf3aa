"""The secret scan (replay.scan): patterns and high-entropy tokens, and none of the random-
looking things recordings legitimately hold — over the committed recordings and every real
fixture, which must come out clean, and over planted secrets, which must all be found."""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
from pathlib import Path

import orjson
import pytest

from llmitm.cli import main
from llmitm.replay.scan import high_entropy_tokens, looks_random, scan_text, shannon_entropy
from tests.helpers.realfixtures import real_or_skip

ROOT = Path(__file__).resolve().parents[2]
RECORDINGS = ROOT / "recordings"

# Shapes of real credentials that no pattern of the redactor knows (those are the entropy
# scan's job): a GitHub token, an AWS secret key, a Slack bot token, a random url-safe key.
PLANTED = [
    "ghp_" + "R8xk2Lq9Vt4Zm7Nw1Pc6Hy3Js5Bd0Fg8Ke2T",
    "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY9",
    "xoxb-2148-93827-Qm8Zt4RkW2pLx9Vn7Yc3Bd6H",
    "kT9mQ2vX8pL4wN7rB3yH6jF1sD5gZ0cA",
]


def test_entropy_of_known_strings() -> None:
    assert shannon_entropy("") == 0.0
    assert shannon_entropy("aaaa") == 0.0
    assert shannon_entropy("abcd") == pytest.approx(2.0)
    assert looks_random(secrets.token_urlsafe(32)) or looks_random(secrets.token_urlsafe(32))
    assert not looks_random("abcdefghijklmnopqrstuvwxyz")  # one case, no digit
    assert not looks_random("a1B2" * 8)  # mixed but repetitive: 3 bits, not near 5
    assert not looks_random(hashlib.sha256(b"x").hexdigest())  # hex: a digest, never flagged


@pytest.mark.parametrize("secret", PLANTED)
def test_planted_secrets_are_found_by_entropy(secret: str) -> None:
    text = orjson.dumps({"messages": [{"role": "user", "content": f"my key is {secret} ok"}]})
    found = scan_text(text.decode())
    assert [f.kind for f in found] == ["entropy"], found
    assert secret.startswith(found[0].value[:20])
    assert found[0].label().startswith("entropy " + secret[:6])
    assert secret not in found[0].label()  # a scan's output never repeats the secret


def test_random_keys_are_found_nearly_always() -> None:
    missed = sum(
        not scan_text(f'{{"token_like": "{base64.b64encode(os.urandom(24)).decode()}"}}')
        for _ in range(500)
    )
    assert missed <= 10


def test_patterns_are_reported_once_not_again_as_entropy() -> None:
    key = "sk-proj-" + "Q7w8E9r0T1y2aZ" * 3
    found = scan_text(f"Authorization: Bearer {key}")
    assert [f.kind for f in found] == ["pattern"]


def test_legitimate_random_looking_values_pass() -> None:
    fernet = "gAAAAABp-r_nDEFD_pLd6MEzoOCG8O" + secrets.token_urlsafe(60)
    image = base64.b64encode(os.urandom(300)).decode()
    text = orjson.dumps(
        {
            "id": "resp_" + secrets.token_hex(24),
            "output": [
                {"type": "reasoning", "id": "rs_" + secrets.token_hex(24),
                 "encrypted_content": fernet},
                {"type": "function_call", "call_id": "call_" + secrets.token_urlsafe(18),
                 "id": "fc_" + secrets.token_hex(24)},
                {"type": "message", "id": "msg_" + secrets.token_hex(24)},
            ],
            "chat": "chatcmpl-" + secrets.token_urlsafe(22),
            "image": f"data:image/png;base64,{image}",
            "body": {"base64": base64.b64encode(os.urandom(64)).decode()},
            "digest": hashlib.sha256(b"manifest").hexdigest(),
            "placeholders": "Bearer <redacted> <uuid:1> <timestamp:2> <id:3>",
            "path": "/home/dev/.codex/skills/.system/skill-installer/SKILL.md",
            "prose": "The quick brown fox jumps over the lazy dog 1234567890 times.",
        }
    ).decode()  # fmt: skip
    assert high_entropy_tokens(text) == []
    assert scan_text(text) == []


def test_committed_recordings_and_real_fixtures_hold_nothing() -> None:
    files = [p for p in RECORDINGS.rglob("*") if p.is_file()]
    files += [p for p in real_or_skip().parent.rglob("*") if p.is_file()]
    assert len(files) > 50
    found = {
        str(p): [f.label() for f in scan_text(p.read_bytes().decode("latin-1"))] for p in files
    }
    assert {p: f for p, f in found.items() if f} == {}
    assert main(["rec", "check-secrets", str(RECORDINGS), str(real_or_skip().parent)]) == 0


def test_check_secrets_finds_planted_secrets_in_a_copy(tmp_path: Path, capsys) -> None:
    leaked = tmp_path / "leaked.json"
    leaked.write_text(orjson.dumps({"note": f"use {PLANTED[0]}"}).decode())
    assert main(["rec", "check-secrets", str(RECORDINGS), str(leaked)]) == 1
    out = capsys.readouterr().out
    assert "leaked.json" in out and "entropy ghp_R8" in out and PLANTED[0] not in out
