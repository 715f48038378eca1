"""The rebalance planner: pure rules, and properties that hold for any cluster."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from coordinator.rebalance import Move, plan_moves, version_key

V = "1.0.0"


def test_two_new_nodes_get_an_even_share_of_32_shards() -> None:
    owners = ["a"] * 16 + ["b"] * 16
    nodes = dict.fromkeys("abcd", V)
    plan = plan_moves(owners, [True] * 32, nodes, budget=100)
    assert plan.held_back == "balanced"
    assert len(plan.moves) == 16
    assert plan.load_after == dict.fromkeys("abcd", 8.0)
    assert plan.spread_before == 16 and plan.spread_after == 0
    assert {m.target for m in plan.moves} == {"c", "d"}


def test_a_difference_of_one_is_not_worth_a_move() -> None:
    plan = plan_moves(["a", "a", "b"], [True] * 3, {"a": V, "b": V}, budget=10)
    assert plan.moves == () and plan.held_back == "balanced"


def test_the_budget_throttles_and_says_so() -> None:
    plan = plan_moves(["a"] * 8, [True] * 8, {"a": V, "b": V}, budget=2)
    assert len(plan.moves) == 2 and plan.held_back == "throttled"
    assert plan.moves == (Move(0, "a", "b"), Move(1, "a", "b"))  # stable: lowest shards first
    assert plan_moves(["a"] * 8, [True] * 8, {"a": V, "b": V}, budget=0).moves == ()


def test_no_moves_while_versions_differ() -> None:
    plan = plan_moves(["a"] * 8, [True] * 8, {"a": "1.0", "b": "1.1"}, budget=10)
    assert plan.moves == ()
    assert plan.held_back.startswith("versions differ (a=1.0, b=1.1)")


def test_only_movable_shards_move_and_other_owners_do_not_count() -> None:
    owners = ["a", "a", "a", "a", "x", None]
    movable = [False, False, True, False, True, True]
    plan = plan_moves(owners, movable, {"a": V, "b": V}, budget=10)
    assert plan.moves == (Move(2, "a", "b"),)  # the one movable shard of a; x is not a node
    assert plan.owners == ("a", "a", "b", "a", "x", None)


def test_load_aware_a_hot_shard_is_balanced_against_cold_ones() -> None:
    # a: one hot shard (10) and two cold ones; b: three cold ones.
    owners = ["a", "a", "a", "b", "b", "b"]
    load = [10.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    plan = plan_moves(owners, [True] * 6, {"a": V, "b": V}, budget=10, load=load)
    # Moving the hot shard would only swap the imbalance; the cold ones narrow it.
    assert [m.shard for m in plan.moves] == [1, 2]
    assert plan.load_after == {"a": 10.0, "b": 5.0}
    assert plan.spread_after < plan.spread_before


def test_version_keys_order_releases_and_put_unknown_last() -> None:
    assert version_key("0.9") < version_key("0.10") < version_key("1.0rc1") < version_key("1.0")
    assert version_key("1.0") < version_key("dev-build")


nodes_st = st.dictionaries(
    st.sampled_from("abcdef"), st.sampled_from(["1.0", "1.0", "1.0", "1.1"]), min_size=1
)


@given(
    data=st.data(),
    nodes=nodes_st,
    n=st.integers(1, 64),
    budget=st.integers(0, 8),
    weighted=st.booleans(),
)
def test_any_plan_keeps_one_owner_per_shard_and_respects_the_rules(
    data: st.DataObject, nodes: dict[str, str], n: int, budget: int, weighted: bool
) -> None:
    owner_choices = [*nodes, "gone", None]
    owners = data.draw(st.lists(st.sampled_from(owner_choices), min_size=n, max_size=n))
    movable = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    load = (
        data.draw(st.lists(st.floats(0, 1000, allow_nan=False), min_size=n, max_size=n))
        if weighted
        else None
    )
    plan = plan_moves(owners, movable, nodes, budget, load)
    assert len(plan.moves) <= budget
    moved = [m.shard for m in plan.moves]
    assert len(moved) == len(set(moved))  # a shard moves at most once per plan
    expected = list(owners)
    for m in plan.moves:
        assert movable[m.shard] and owners[m.shard] == m.source
        assert m.source in nodes and m.target in nodes and m.source != m.target
        assert version_key(nodes[m.target]) >= version_key(nodes[m.source])
        expected[m.shard] = m.target
    assert list(plan.owners) == expected  # exactly one owner per shard, the planned one
    if len({version_key(v) for v in nodes.values()}) > 1:
        assert plan.moves == ()
    assert plan.spread_after <= plan.spread_before + 1e-9  # never worse
    assert abs(sum(plan.load_after.values()) - sum(plan.load_before.values())) < 1e-6
    # Deterministic: the same question gets the same plan.
    assert plan_moves(owners, movable, nodes, budget, load) == plan
