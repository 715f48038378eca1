"""The membership state machine, without Ray: every allowed move, every refused one, the
quarantine and rejoin path, and the failure detector's clock passed in."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.membership import TRANSITIONS, IllegalTransition, Membership, NodeState
from tests.unit.support import Clock


def member(m: Membership, node: str) -> None:
    m.discovered(node)
    m.answered(node)


def test_a_discovered_node_joins_when_it_answers_and_members_keep_join_order() -> None:
    m = Membership(4.0, 0.5, Clock())
    change = m.discovered("a")
    assert change is not None and (change.before, change.after) == (None, NodeState.JOINING)
    assert m.members == [] and m.state("a") is NodeState.JOINING
    assert m.discovered("a") is None  # Ray lists it again: nothing new
    joined = m.answered("a")
    assert joined is not None and joined.joined and not joined.left
    member(m, "b")
    assert m.members == ["a", "b"]
    assert m.answered("a") is None  # a member's answer only resets its silence


def test_a_silent_member_is_quarantined_and_rejoins_as_the_newest_when_it_answers() -> None:
    clock = Clock()
    m = Membership(4.0, 0.5, clock)
    for n in "abc":
        member(m, n)
    for _ in range(9):  # 4.5 s of regular ticks; b and c answer, a stays silent
        clock.now += 0.5
        m.answered("b")
        m.answered("c")
        quarantined = m.tick()
    assert [(c.node, c.after, c.left) for c in quarantined] == [("a", NodeState.QUARANTINED, True)]
    assert "no answer to pings for 4.5 s" in quarantined[0].why
    assert m.members == ["b", "c"] and m.nodes(NodeState.QUARANTINED) == ["a"]
    clock.now += 0.5
    assert m.tick() == []  # quarantined nodes are not failed twice
    back = m.answered("a")
    assert back is not None and (back.before, back.after) == (
        NodeState.QUARANTINED,
        NodeState.MEMBER,
    )
    assert not back.left
    assert m.members == ["b", "c", "a"]  # the newest member now


def test_the_singleton_s_own_stall_does_not_quarantine_anyone() -> None:
    clock = Clock()
    m = Membership(4.0, 0.5, clock)
    member(m, "a")
    clock.now += 0.5
    m.tick()
    clock.now += 10.0  # the singleton's loop was blocked for 10 s; nobody could answer
    assert m.tick() == []
    assert m.members == ["a"]


@pytest.mark.parametrize(
    ("members", "silent", "quarantined"),
    [
        (2, ["a"], ["a"]),  # one of two silent: as many answer as are silent; it moves
        (3, ["a"], ["a"]),
        (3, ["a", "b"], []),  # two of three silent: the singleton suspects itself
        (3, ["a", "b", "c"], []),  # every member silent: the singleton is cut off
        (1, ["a"], []),  # a lone member: no one could take its shards anyway
        (4, ["a", "b"], ["a", "b"]),
    ],
)
def test_more_silent_members_than_answering_ones_quarantine_no_one(
    members: int, silent: list[str], quarantined: list[str]
) -> None:
    """The singleton's host cut off from the nodes looks, from the singleton, like every node
    failing at once: it must not move their shards (to nowhere, or to the one it still hears)."""
    clock = Clock()
    m = Membership(4.0, 0.5, clock)
    names = "abcd"[:members]
    for n in names:
        member(m, n)
    changes = []
    for _ in range(12):  # 6 s of regular ticks
        clock.now += 0.5
        for n in names:
            if n not in silent:
                m.answered(n)
        changes += m.tick()
    assert [c.node for c in changes] == quarantined
    if quarantined:
        assert m.suspect_self is None
    else:
        assert m.suspect_self is not None and f"{len(silent)} of {members}" in m.suspect_self
        assert m.members == list(names)
        for n in silent:  # the link heals: they answer, and all is as it was
            m.answered(n)
        clock.now += 0.5
        assert m.tick() == [] and m.suspect_self is None


def test_after_the_singleton_s_own_isolation_a_late_member_gets_a_full_timeout() -> None:
    """The link back to the nodes heals: they answer one by one. One still silent when the rest
    answer is not quarantined at once for the silence the singleton's own cut caused; it gets a
    whole failure timeout from then (and is quarantined if it stays silent)."""
    clock = Clock()
    m = Membership(4.0, 0.5, clock)
    for n in "abc":
        member(m, n)
    for _ in range(12):  # 6 s: every member silent, the singleton suspects itself
        clock.now += 0.5
        assert m.tick() == []
    assert m.suspect_self is not None
    m.answered("a")
    m.answered("b")
    changes = []
    for _ in range(7):  # 3.5 s more of c's silence
        clock.now += 0.5
        m.answered("a")
        m.answered("b")
        changes += m.tick()
    assert changes == [] and m.suspect_self is None and m.members == ["a", "b", "c"]
    for _ in range(3):
        clock.now += 0.5
        m.answered("a")
        m.answered("b")
        changes += m.tick()
    assert [(c.node, c.after) for c in changes] == [("c", NodeState.QUARANTINED)]


def test_a_dead_node_is_gone_from_any_state_and_may_join_again_afresh() -> None:
    clock = Clock()
    m = Membership(4.0, 0.5, clock)
    m.discovered("joining")
    member(m, "member")
    member(m, "quarantined")
    for _ in range(10):
        clock.now += 0.5
        m.answered("member")
        m.tick()
    assert m.state("quarantined") is NodeState.QUARANTINED
    gone = m.vanished(live=[])
    assert {(c.node, c.before) for c in gone} == {
        ("joining", NodeState.JOINING),
        ("member", NodeState.MEMBER),
        ("quarantined", NodeState.QUARANTINED),
    }
    assert [c.node for c in gone if c.left] == ["member"]
    assert m.known() == set()
    assert m.died("member", "again") is None  # already gone
    assert m.answered("member") is None  # a late answer from a gone node changes nothing
    change = m.discovered("member")
    assert change is not None and change.before is None  # back as a new node


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (b, a)
        for b in TRANSITIONS
        for a in NodeState
        if a not in TRANSITIONS[b] and b is not NodeState.GONE
    ],
)
def test_every_move_not_in_the_table_raises_naming_both_states(
    before: NodeState | None, after: NodeState
) -> None:
    m = Membership(4.0, 0.5, Clock())
    if before is not None:
        m._states["n"] = before  # the state under test, however it was reached
    with pytest.raises(IllegalTransition) as e:
        m._move("n", after, "test")
    assert str(before or "unknown") in str(e.value) and str(after) in str(e.value)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["discover", "answer", "die", "tick", "vanish"]),
            st.sampled_from(["a", "b", "c"]),
            st.floats(0, 3),
        ),
        max_size=60,
    )
)
def test_random_event_sequences_only_take_allowed_moves(events) -> None:
    clock = Clock()
    m = Membership(2.0, 0.5, clock)
    for what, node, dt in events:
        clock.now += dt
        before = {n: m.state(n) for n in "abc"}
        changes = {
            "discover": lambda n=node: [m.discovered(n)],
            "answer": lambda n=node: [m.answered(n)],
            "die": lambda n=node: [m.died(n, "test")],
            "tick": m.tick,
            "vanish": lambda n=node: m.vanished(x for x in "abc" if x != n),
        }[what]()
        for c in changes:
            if c is not None:
                assert c.before == before[c.node]
                assert c.after in TRANSITIONS[c.before]
        assert set(m.members) <= m.known()
        assert all(m.state(n) is not NodeState.GONE for n in m.known())


def test_members_cut_off_at_once_but_heard_at_different_times_quarantine_no_one() -> None:
    """A cut catches members at different points of the ping round, so they cross the timeout
    one by one. The first to cross is not quarantined alone: the others, on their way to the
    timeout, do not count as answering."""
    clock = Clock()
    m = Membership(4.0, 0.5, clock)
    for n in "abc":
        member(m, n)
    clock.now += 0.5
    m.answered("b")
    m.answered("c")
    m.tick()
    clock.now += 0.5
    m.answered("c")  # the cut: a last heard at 0 s, b at 0.5 s, c at 1 s
    m.tick()
    changes = []
    for _ in range(12):
        clock.now += 0.5
        changes += m.tick()
    assert changes == [] and m.suspect_self is not None
    assert m.members == ["a", "b", "c"]


def test_one_failed_member_is_quarantined_while_the_others_answer_late() -> None:
    """The others answer, if slowly (within half the timeout): the one silent member moves."""
    clock = Clock()
    m = Membership(4.0, 0.5, clock)
    for n in "abc":
        member(m, n)
    changes = []
    for i in range(12):
        clock.now += 0.5
        if i % 3 == 0:  # b and c answer every 1.5 s, a never
            m.answered("b")
            m.answered("c")
        changes += m.tick()
    assert [(c.node, c.after) for c in changes] == [("a", NodeState.QUARANTINED)]
