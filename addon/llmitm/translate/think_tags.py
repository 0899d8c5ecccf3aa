"""``<think>…</think>`` reasoning inside a complete chat ``content`` string.

Chat backends without a reasoning parser (Qwen3, DeepSeek-R1 distills behind a plain server)
put their chain of thought inline in ``content``. This module owns splitting a *whole* string
into reasoning and answer, for non-streamed bodies; the incremental version for streams lives
with the stream translator because it must survive tags split across chunks.
"""

from __future__ import annotations

OPEN_TAG = "<think>"
CLOSE_TAG = "</think>"


def split_think_tags(text: str, open_missing: bool = False) -> tuple[str, str]:
    """Split ``text`` into ``(reasoning, content)``.

    Every ``<think>…</think>`` block becomes reasoning (several blocks are joined with a blank
    line); an unclosed ``<think>`` makes the rest of the text reasoning. With ``open_missing``
    the text before a first ``</think>`` that has no ``<think>`` before it is reasoning too (R1
    distills whose chat template already emitted the opening tag in the prompt).

    Whitespace around the blocks is trimmed where it only separated them from the answer, so
    ``"<think>\\nx\\n</think>\\n\\nHi"`` gives ``("x", "Hi")``. Text without tags is returned
    unchanged as content.
    """
    reasoning: list[str] = []
    content: list[str] = []
    first_block: int | None = None  # where the first reasoning block starts
    position = 0

    if open_missing:
        close = text.find(CLOSE_TAG)
        if close != -1:
            first_open = text.find(OPEN_TAG)
            if first_open == -1 or close < first_open:
                reasoning.append(text[:close])
                position = close + len(CLOSE_TAG)
                first_block = 0

    ended_inside = False
    while True:
        start = text.find(OPEN_TAG, position)
        if start == -1:
            content.append(text[position:])
            break
        content.append(text[position:start])
        if first_block is None:
            first_block = start
        body_start = start + len(OPEN_TAG)
        end = text.find(CLOSE_TAG, body_start)
        if end == -1:
            reasoning.append(text[body_start:])
            ended_inside = True
            break
        reasoning.append(text[body_start:end])
        position = end + len(CLOSE_TAG)

    if first_block is None:
        return "", text

    answer = "".join(content)
    # The blank lines models put after </think> (or before a trailing unclosed block) are
    # layout, not answer text.
    if not text[:first_block].strip():
        answer = answer.lstrip()
    if ended_inside:
        answer = answer.rstrip()
    thought = "\n\n".join(part.strip() for part in reasoning if part.strip())
    return thought, answer
