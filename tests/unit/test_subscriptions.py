"""ShardSubscriptions: an immutable value; every change is a new value."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from coordinator.messages import SubscriptionsChanged
from coordinator.subscriptions import ShardSubscriptions
from core.dataset import DatasetRef

A, B = DatasetRef(name="a"), DatasetRef(name="b")


def test_changes_return_new_values_and_leave_the_old_one_alone() -> None:
    empty = ShardSubscriptions()
    one = empty.subscribe("s1", A)
    assert empty == ShardSubscriptions() and empty.subscribers(A) == ()
    two = one.subscribe("s2", A).subscribe("s1", B).watch("g")
    assert one.subscribers(A) == ("s1",)
    assert two.subscribers(A) == ("s1", "s2") and two.subscribers(B) == ("s1",)
    assert two.audience(A) == ("s1", "s2", "g")
    assert two.subscribe("s1", A) == two and two.watch("g") == two  # idempotent
    assert two.unsubscribe("s1", A).subscribers(A) == ("s2",)
    gone = two.unsubscribe("s1")
    assert gone.subscribers(A) == ("s2",) and gone.subscribers(B) == ()
    assert gone.unsubscribe("g").watchers == ()
    assert two.without_dataset(A).subscribers(A) == () and two.without_dataset(A).watchers == ("g",)
    assert two.unsubscribe("nobody") == two


def test_the_guardian_message_is_canonical_and_merges_back() -> None:
    subs = ShardSubscriptions().subscribe("z", B).subscribe("y", A).subscribe("x", A).watch("g")
    message = subs.as_message()
    assert message == SubscriptionsChanged(((A, ("x", "y")), (B, ("z",))), ("g",))
    assert ShardSubscriptions().merged(message).as_message() == message


ops = st.lists(
    st.tuples(
        st.sampled_from(["sub", "unsub", "unsub_all", "watch", "drop"]),
        st.sampled_from(["s1", "s2", "g"]),
        st.sampled_from([A, B]),
    ),
    max_size=30,
)


@given(ops)
def test_it_agrees_with_a_plain_model(steps) -> None:
    subs = ShardSubscriptions()
    model: dict[DatasetRef, list[str]] = {}
    watchers: list[str] = []
    for op, who, ref in steps:
        if op == "sub":
            subs = subs.subscribe(who, ref)
            if who not in model.setdefault(ref, []):
                model[ref].append(who)
        elif op == "unsub":
            subs = subs.unsubscribe(who, ref)
            if who in model.get(ref, []):
                model[ref].remove(who)
        elif op == "unsub_all":
            subs = subs.unsubscribe(who)
            for names in model.values():
                if who in names:
                    names.remove(who)
            if who in watchers:
                watchers.remove(who)
        elif op == "watch":
            subs = subs.watch(who)
            if who not in watchers:
                watchers.append(who)
        else:
            subs = subs.without_dataset(ref)
            model.pop(ref, None)
        for r in (A, B):
            assert subs.subscribers(r) == tuple(model.get(r, []))
        assert subs.watchers == tuple(watchers)
        assert all(names for _, names in subs.by_dataset)  # no empty entries
