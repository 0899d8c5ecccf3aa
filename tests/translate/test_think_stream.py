"""ThinkTagSplitter: incremental ``<think>`` splitting of streamed content."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from llmitm.translate.think_stream import CLOSE_TAG, OPEN_TAG, ThinkTagSplitter


def split(pieces: list[str], open_missing: bool = False) -> tuple[str, str, list[bool]]:
    """Feed ``pieces``, close; return (reasoning, text, the kinds of the segments in order).

    Empty pieces are skipped: the translator never feeds an empty ``content``."""
    splitter = ThinkTagSplitter(open_missing)
    segments = []
    for piece in pieces:
        if piece:
            segments += splitter.feed(piece)
    segments += splitter.close()
    assert all(text for _, text in segments), "empty segments are noise downstream"
    reasoning = "".join(text for is_reasoning, text in segments if is_reasoning)
    visible = "".join(text for is_reasoning, text in segments if not is_reasoning)
    return reasoning, visible, [is_reasoning for is_reasoning, _ in segments]


def cuts(text: str, *points: int) -> list[str]:
    bounds = [0, *points, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


def assert_reasoning_first(kinds: list[bool]) -> None:
    """All reasoning segments come before all visible ones."""
    assert kinds == sorted(kinds, reverse=True)


STREAM = "<think>\nI weigh < and > here.\n</think>\n\nThe answer is <b>42</b>."


def test_whole_block_in_one_delta() -> None:
    reasoning, text, kinds = split([STREAM])
    assert reasoning == "I weigh < and > here.\n"
    assert text == "The answer is <b>42</b>."
    assert_reasoning_first(kinds)


def test_tags_split_at_every_position() -> None:
    """Wherever one cut falls — inside ``<think>``, inside ``</think>``, in the
    whitespace around them — no tag text leaks and nothing is lost."""
    for cut in range(len(STREAM) + 1):
        reasoning, text, kinds = split(cuts(STREAM, cut))
        assert (reasoning, text) == ("I weigh < and > here.\n", "The answer is <b>42</b>."), cut
        assert_reasoning_first(kinds)


def test_tags_split_at_every_pair_of_positions() -> None:
    """Two cuts anywhere (three deltas, possibly empty)."""
    for first in range(len(STREAM) + 1):
        for second in range(first, len(STREAM) + 1):
            reasoning, text, _ = split(cuts(STREAM, first, second))
            assert reasoning == "I weigh < and > here.\n", (first, second)
            assert text == "The answer is <b>42</b>.", (first, second)


def test_one_character_per_delta() -> None:
    assert split(list(STREAM))[:2] == ("I weigh < and > here.\n", "The answer is <b>42</b>.")


def test_open_tag_missing_with_open_missing() -> None:
    """R1 distills whose template swallowed ``<think>``: everything up to ``</think>`` is
    reasoning, at every cut."""
    body = "I reason.</think>\n\nAnswer."
    for cut in range(len(body) + 1):
        reasoning, text, kinds = split(cuts(body, cut), open_missing=True)
        assert (reasoning, text) == ("I reason.", "Answer."), cut
        assert_reasoning_first(kinds)


def test_open_missing_tolerates_an_open_tag_anyway() -> None:
    """With ``open_missing`` a stray ``<think>`` inside the reasoning is just reasoning text."""
    assert split(["<think>x</think>y"], open_missing=True)[:2] == ("<think>x", "y")


def test_open_missing_and_never_closed() -> None:
    """An unterminated reasoning block (cut by max tokens) stays reasoning."""
    assert split(["still thinking", " </thi"], open_missing=True)[:2] == (
        "still thinking </thi",
        "",
    )


def test_without_open_missing_plain_text_is_text() -> None:
    assert split(["I reason.</think>Answer."])[:2] == ("", "I reason.</think>Answer.")


def test_think_tag_after_visible_text_is_text() -> None:
    """An opening tag counts only before any visible text: a model quoting ``<think>`` in its
    answer keeps the rest of the answer."""
    assert split(["Use ", "<think>", " tags</think> like this"])[:2] == (
        "",
        "Use <think> tags</think> like this",
    )


def test_second_think_block_is_text() -> None:
    assert split(["<think>a</think>b<think>c</think>"])[:2] == ("a", "b<think>c</think>")


def test_leading_whitespace_before_the_open_tag() -> None:
    for pieces in (["\n\n<think>r</think>a"], ["\n", "\n", "<th", "ink>r</think>a"]):
        assert split(pieces)[:2] == ("r", "a"), pieces


def test_leading_whitespace_then_text_is_kept() -> None:
    """Whitespace held while a ``<think>`` might follow is text after all."""
    assert split(["\n", "  Hello"])[:2] == ("", "\n  Hello")
    assert split(["  ", "<b>bold</b>"])[:2] == ("", "  <b>bold</b>")


def test_whitespace_only_content_is_released_at_close() -> None:
    assert split([" ", "\n"])[:2] == ("", " \n")


def test_a_tag_prefix_left_at_the_end_is_text() -> None:
    """``<thi`` with nothing after it was text, not a tag."""
    assert split(["<thi"])[:2] == ("", "<thi")
    assert split(["<", "thinking>"])[:2] == ("", "<thinking>")


def test_a_close_tag_prefix_that_is_not_a_tag_is_reasoning() -> None:
    assert split(["<think>a</th", "x</think>b"])[:2] == ("a</thx", "b")
    assert split(["<think>a<", "/", "t", "h", "i", "n", "k", ">b"])[:2] == ("a", "b")


def test_empty_think_block() -> None:
    assert split(["<think></think>", "\n\nanswer"])[:2] == ("", "answer")


def test_whitespace_after_the_tags_is_layout() -> None:
    """Whitespace right after ``<think>`` and ``</think>`` is dropped, also across deltas."""
    assert split(["<think>", "\n", "  r", "</think>", "\n", "\n", "a"])[:2] == ("r", "a")


def test_reasoning_is_streamed_not_held() -> None:
    """Reasoning text is released as it arrives (only a possible tag suffix waits)."""
    splitter = ThinkTagSplitter()
    assert splitter.feed("<think>") == []
    assert splitter.feed("abc") == [(True, "abc")]
    assert splitter.feed("de</") == [(True, "de")]
    assert splitter.feed("think>x") == [(False, "x")]


def test_text_after_the_block_is_not_held_on_a_lone_angle_bracket() -> None:
    """Past the think block, ``<`` at the end of a delta goes out at once (the llama.cpp
    capture ends its content with ``.<``)."""
    splitter = ThinkTagSplitter()
    assert splitter.feed("Name three colours") == [(False, "Name three colours")]
    assert splitter.feed(".<") == [(False, ".<")]
    assert splitter.close() == []


@pytest.mark.parametrize(
    ("pieces", "settled_after"),
    [
        (["Hello"], [True]),
        (["<think>", "r", "</think>", "\n", "a"], [False, False, False, False, True]),
        ([" ", "x"], [False, True]),
    ],
)
def test_settled_once_past_the_leading_block(pieces: list[str], settled_after: list[bool]) -> None:
    """``settled`` tells the translator that further deltas are plain text (its fast path)."""
    splitter = ThinkTagSplitter()
    states = []
    for piece in pieces:
        splitter.feed(piece)
        states.append(splitter.settled)
    assert states == settled_after


_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)


@settings(max_examples=300, deadline=None)
@given(
    reasoning=_text,
    answer=_text,
    leading=st.sampled_from(["", "\n", " \n\t"]),
    points=st.lists(st.integers(min_value=0), max_size=8),
    open_missing=st.booleans(),
)
def test_any_split_of_a_think_block(
    reasoning: str, answer: str, leading: str, points: list[int], open_missing: bool
) -> None:
    """For any reasoning and answer text and any chunking: reasoning comes out as reasoning
    (layout whitespace after the tags dropped), the answer as text, no tag leaks."""
    assume(CLOSE_TAG not in reasoning)
    opening = "" if open_missing else leading + OPEN_TAG
    body = opening + reasoning + CLOSE_TAG + answer
    chunk_points = sorted({point % (len(body) + 1) for point in points})
    got_reasoning, got_text, kinds = split(cuts(body, *chunk_points), open_missing)
    assert got_reasoning == reasoning.lstrip()
    assert got_text == answer.lstrip()
    assert_reasoning_first(kinds)


@settings(max_examples=200, deadline=None)
@given(text=_text, points=st.lists(st.integers(min_value=0), max_size=8))
def test_text_without_a_leading_tag_is_unchanged(text: str, points: list[int]) -> None:
    """Content that does not open with ``<think>`` comes out byte for byte as text."""
    assume(not text.lstrip().startswith(OPEN_TAG))
    chunk_points = sorted({point % (len(text) + 1) for point in points})
    assert split(cuts(text, *chunk_points))[:2] == ("", text)
