"""Concurrency caps: per endpoint and per endpoint-model, idempotent release, the bounded
FIFO of waiters with hand-over, and a hypothesis property over any interleaving of acquires
and (double) releases: never above a cap, never negative, back to zero at the end."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmitm.routing.limits import Lease, Limiter, WaitPolicy, acquire_first


def test_cap_per_endpoint() -> None:
    limiter = Limiter({"a": 2})
    first, second = limiter.try_acquire("a"), limiter.try_acquire("a")
    assert first is not None and second is not None
    assert limiter.try_acquire("a") is None
    assert limiter.in_flight("a") == 2
    first.release()
    assert limiter.in_flight("a") == 1
    assert limiter.try_acquire("a") is not None


def test_uncapped_endpoints_count_but_never_refuse() -> None:
    limiter = Limiter()
    leases = [limiter.try_acquire("a", "m") for _ in range(50)]
    assert all(leases)
    assert limiter.in_flight("a") == 50 and limiter.in_flight("a", "m") == 50


def test_cap_per_endpoint_model_and_endpoint_together() -> None:
    limiter = Limiter({"a": 3}, {("a", "big"): 1})
    big = limiter.try_acquire("a", "big")
    assert big is not None
    assert limiter.try_acquire("a", "big") is None  # the model's cap
    assert limiter.try_acquire("a", "small") is not None
    assert limiter.try_acquire("a") is not None
    assert limiter.try_acquire("a", "small") is None  # the endpoint's cap
    assert limiter.in_flight("a") == 3 and limiter.in_flight("a", "big") == 1


def test_release_is_idempotent() -> None:
    limiter = Limiter({"a": 1})
    lease = limiter.try_acquire("a", "m")
    assert lease is not None
    assert lease.release() is True
    assert lease.release() is False
    assert limiter.in_flight("a") == 0 and limiter.in_flight("a", "m") == 0
    other = limiter.try_acquire("a", "m")
    lease.release()  # a stale release must not free someone else's slot
    assert other is not None and limiter.in_flight("a") == 1


def test_lease_as_context_manager_releases_on_error() -> None:
    limiter = Limiter({"a": 1})
    with pytest.raises(RuntimeError), limiter.try_acquire("a") as lease:  # type: ignore[union-attr]
        assert isinstance(lease, Lease)
        raise RuntimeError("upstream cut")
    assert limiter.in_flight("a") == 0


def test_acquire_first_moves_past_full_endpoints() -> None:
    limiter = Limiter({"a": 1, "b": 1})
    assert acquire_first(limiter, ["a", "b"]).endpoint == "a"  # type: ignore[union-attr]
    assert acquire_first(limiter, ["a", "b"]).endpoint == "b"  # type: ignore[union-attr]
    assert acquire_first(limiter, ["a", "b"]) is None


def test_bad_caps_are_refused() -> None:
    for cap in (0, -1, 1.5, True):
        with pytest.raises(ValueError):
            Limiter({"a": cap})  # type: ignore[dict-item]
    with pytest.raises(ValueError):
        WaitPolicy(max_waiters=-1)


# --- waiting ------------------------------------------------------------------------------


def test_queue_is_bounded() -> None:
    limiter = Limiter({"a": 1}, wait=WaitPolicy(max_waiters=1, timeout=5))
    assert limiter.try_acquire("a") is not None
    assert limiter.enqueue([("a", None)], lambda _lease: True) is not None
    assert limiter.enqueue([("a", None)], lambda _lease: True) is None
    assert Limiter({"a": 1}).enqueue([("a", None)], lambda _l: True) is None  # default: no queue


def test_release_hands_the_slot_to_the_first_waiter_in_order() -> None:
    limiter = Limiter({"a": 1}, wait=WaitPolicy(max_waiters=5))
    held = limiter.try_acquire("a")
    got: list[tuple[str, Lease]] = []
    for name in ("w1", "w2"):
        limiter.enqueue([("a", None)], lambda lease, name=name: got.append((name, lease)) or True)
    assert held is not None
    held.release()
    assert [name for name, _ in got] == ["w1"]
    assert limiter.in_flight("a") == 1  # handed over, not freed: no barging
    assert limiter.try_acquire("a") is None
    got[0][1].release()
    assert [name for name, _ in got] == ["w1", "w2"]
    got[1][1].release()
    assert limiter.in_flight("a") == 0 and limiter.waiting == 0


def test_a_waiter_that_no_longer_wants_the_slot_passes_it_on() -> None:
    limiter = Limiter({"a": 1}, wait=WaitPolicy(max_waiters=5))
    held = limiter.try_acquire("a")
    got: list[Lease] = []
    limiter.enqueue([("a", None)], lambda _lease: False)  # timed out a moment ago
    limiter.enqueue([("a", None)], lambda lease: got.append(lease) or True)
    held.release()  # type: ignore[union-attr]
    assert len(got) == 1 and limiter.in_flight("a") == 1
    got[0].release()
    assert limiter.in_flight("a") == 0


def test_cancelled_waiters_are_skipped_and_cancel_is_idempotent() -> None:
    limiter = Limiter({"a": 1}, wait=WaitPolicy(max_waiters=5))
    held = limiter.try_acquire("a")
    called: list[str] = []
    waiter = limiter.enqueue([("a", None)], lambda _l: called.append("w") or True)
    assert waiter is not None
    waiter.cancel()
    waiter.cancel()
    held.release()  # type: ignore[union-attr]
    assert called == [] and limiter.in_flight("a") == 0


def test_a_waiter_for_another_endpoint_is_not_blocked_by_the_head_of_the_queue() -> None:
    limiter = Limiter({"a": 1, "b": 1}, wait=WaitPolicy(max_waiters=5))
    on_a, on_b = limiter.try_acquire("a"), limiter.try_acquire("b")
    got: list[str] = []
    limiter.enqueue([("a", None)], lambda lease: got.append("wants-a") or True)
    limiter.enqueue([("a", None), ("b", None)], lambda lease: got.append(lease.endpoint) or True)
    on_b.release()  # type: ignore[union-attr]
    assert got == ["b"]
    on_a.release()  # type: ignore[union-attr]
    assert got == ["b", "wants-a"]


def test_enqueue_serves_at_once_if_a_slot_is_free() -> None:
    limiter = Limiter({"a": 1}, wait=WaitPolicy(max_waiters=1))
    got: list[Lease] = []
    waiter = limiter.enqueue([("a", None)], lambda lease: got.append(lease) or True)
    assert waiter is not None and waiter.done and len(got) == 1 and limiter.waiting == 0


def test_version_grows_on_every_release() -> None:
    limiter = Limiter()
    lease = limiter.try_acquire("a")
    before = limiter.version
    lease.release()  # type: ignore[union-attr]
    lease.release()  # type: ignore[union-attr]
    assert limiter.version == before + 1


# --- property: any interleaving -----------------------------------------------------------

ENDPOINTS = ("a", "b")
MODELS = (None, "m", "n")
CAPS = {"a": 2, "b": 3}
MODEL_CAPS = {("a", "m"): 1, ("b", "n"): 2}

operations = st.lists(
    st.one_of(
        st.tuples(st.just("acquire"), st.sampled_from(ENDPOINTS), st.sampled_from(MODELS)),
        st.tuples(st.just("release"), st.integers(0, 30), st.none()),
        st.tuples(st.just("enqueue"), st.sampled_from(ENDPOINTS), st.booleans()),
        st.tuples(st.just("cancel"), st.integers(0, 30), st.none()),
    ),
    max_size=60,
)


def _check(limiter: Limiter) -> None:
    for endpoint in ENDPOINTS:
        count = limiter.in_flight(endpoint)
        assert 0 <= count <= CAPS[endpoint]
        for model in MODELS[1:]:
            per_model = limiter.in_flight(endpoint, model)
            assert 0 <= per_model <= count
            cap = MODEL_CAPS.get((endpoint, model))  # type: ignore[arg-type]
            assert cap is None or per_model <= cap


@settings(max_examples=300, deadline=None)
@given(operations)
def test_any_interleaving_respects_caps_and_returns_to_zero(ops: list[tuple]) -> None:
    limiter = Limiter(CAPS, MODEL_CAPS, WaitPolicy(max_waiters=4, timeout=1))
    leases: list[Lease] = []
    waiters = []
    for op, x, y in ops:
        if op == "acquire":
            lease = limiter.try_acquire(x, y)
            if lease is not None:
                leases.append(lease)
        elif op == "release" and leases:
            leases[x % len(leases)].release()  # may be a double release
        elif op == "enqueue":
            # y: whether the waiter still wants the slot when it arrives
            def deliver(lease: Lease, wants: bool = y) -> bool:
                if wants:
                    leases.append(lease)
                return wants

            waiter = limiter.enqueue([(x, "m"), (x, None)], deliver)
            if waiter is not None:
                waiters.append(waiter)
        elif op == "cancel" and waiters:
            waiters[x % len(waiters)].cancel()
        _check(limiter)
    for waiter in waiters:
        waiter.cancel()
    for lease in leases:
        lease.release()
        _check(limiter)
    for lease in leases:
        lease.release()
    assert limiter.total_in_flight() == 0
    assert all(limiter.in_flight(e, m) == 0 for e in ENDPOINTS for m in MODELS)
    assert limiter.waiting == 0
