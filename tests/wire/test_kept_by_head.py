"""The index of recent bodies by their leading bytes: candidates, the cap per head, the budget."""

from __future__ import annotations

from dataclasses import dataclass

from llmitm.wire.kept_by_head import KeptByHead


@dataclass(eq=False)
class Body:
    data: bytes


def test_candidates_are_the_bodies_that_start_alike_oldest_first() -> None:
    kept: KeptByHead[Body] = KeptByHead(budget=10_000, head=4, per_head=8)
    a, b, other = Body(b"abcd-1"), Body(b"abcd-22"), Body(b"wxyz-1")
    for body in (a, other, b):
        kept.keep(body)
    assert list(kept.alike(b"abcd-333")) == [a, b]
    assert list(kept.alike(b"wxyz")) == [other]
    assert list(kept.alike(b"none")) == []
    assert kept.entries() == [a, other, b]


def test_a_head_holds_at_most_per_head_bodies_the_oldest_dropped() -> None:
    kept: KeptByHead[Body] = KeptByHead(budget=10_000, head=4, per_head=2)
    bodies = [Body(b"same" + bytes([n])) for n in range(3)]
    for body in bodies:
        kept.keep(body)
    assert list(kept.alike(b"same")) == bodies[1:]
    assert len(kept) == 2
    assert kept.held == sum(len(b.data) for b in bodies[1:])


def test_past_the_budget_the_least_recently_kept_go_by_weight() -> None:
    kept: KeptByHead[Body] = KeptByHead(budget=300, head=1, per_head=8, weight=3)
    first, second, third = Body(b"a" * 40), Body(b"b" * 40), Body(b"c" * 40)
    kept.keep(first)
    kept.keep(second)
    assert kept.held == 240
    kept.keep(third)  # 360 > 300: the first goes
    assert kept.entries() == [second, third]
    assert kept.held == 240
    assert list(kept.alike(b"a")) == []


def test_dropping_forgets_a_body_once_and_empties_its_head() -> None:
    kept: KeptByHead[Body] = KeptByHead(budget=10_000, head=2, per_head=8)
    body = Body(b"xy-body")
    kept.keep(body)
    kept.drop(body)
    kept.drop(body)  # not kept any more: nothing happens
    assert len(kept) == 0 and kept.held == 0
    assert list(kept.alike(b"xy")) == []
    assert kept._heads == {}
