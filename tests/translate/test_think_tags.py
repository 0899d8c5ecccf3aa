"""split_think_tags: inline ``<think>`` reasoning in whole chat content strings."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmitm.translate.think_tags import split_think_tags
from tests.helpers._fixtures_body import load_real


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("plain answer", ("", "plain answer")),
        ("", ("", "")),
        ("<think>\nponder\n</think>\n\nAnswer", ("ponder", "Answer")),
        ("  \n<think>ponder</think>Answer", ("ponder", "Answer")),
        ("<think>a</think>\n\n<think>b</think>\n\nAnswer", ("a\n\nb", "Answer")),
        ("Intro <think>a</think>middle<think>b</think> end", ("a\n\nb", "Intro middle end")),
        ("<think>\n\n</think>\n\nAnswer", ("", "Answer")),  # Qwen3 with thinking off
        ("Answer\n<think>still going", ("still going", "Answer")),
        ("<think>only thinking, cut by max_tokens", ("only thinking, cut by max_tokens", "")),
        # Without open_missing a stray close tag is ordinary text.
        ("ponder</think>\n\nAnswer", ("", "ponder</think>\n\nAnswer")),
        ("keep  inner  spacing\n\n", ("", "keep  inner  spacing\n\n")),
    ],
)
def test_split(text: str, expected: tuple[str, str]) -> None:
    assert split_think_tags(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ponder\n</think>\n\nAnswer", ("ponder", "Answer")),
        ("ponder</think>Answer<think>more</think>", ("ponder\n\nmore", "Answer")),
        # An explicit open tag first: the missing-open rule does not apply.
        ("<think>a</think>b</think>c", ("a", "b</think>c")),
        ("no tags at all", ("", "no tags at all")),
    ],
)
def test_checklist_14_open_tag_missing(text: str, expected: tuple[str, str]) -> None:
    assert split_think_tags(text, open_missing=True) == expected


def test_checklist_14_real_r1_content_splits_cleanly() -> None:
    body, _ = load_real("pydantic-ai-hf-together-r1-think")
    content = body["choices"][0]["message"]["content"]
    reasoning, answer = split_think_tags(content)
    assert reasoning.startswith('Okay, the user asked "How do I cross the street?"')
    assert reasoning.endswith("Lives depend on it.")
    assert answer.startswith("Crossing the street safely requires")
    assert answer.endswith("🛑👟")
    for part in (reasoning, answer):
        assert "<think>" not in part
        assert "</think>" not in part


_free = st.text().filter(lambda s: "<think>" not in s and "</think>" not in s)


@given(_free)
def test_text_without_tags_is_untouched(text: str) -> None:
    assert split_think_tags(text) == ("", text)
    assert split_think_tags(text, open_missing=True) == ("", text)


@given(_free.map(str.strip).filter(bool), _free.map(str.lstrip))
def test_think_tags_rendering_splits_back(reasoning: str, content: str) -> None:
    # The exact wrapper body_to_chat renders for think-tags clients.
    rendered = f"<think>\n{reasoning}\n</think>\n\n{content}"
    assert split_think_tags(rendered) == (reasoning, content)
    assert split_think_tags(rendered[len("<think>") :], open_missing=True) == (reasoning, content)
