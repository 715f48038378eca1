"""Property-based tests: routing invariants, mapper round trips, and the manager under churn."""

from __future__ import annotations

import pickle

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from coordinator import DefaultShardAssignmentStrategy, ShardManager
from coordinator.messages import (
    DatasetRemoved,
    NodeShardMap,
    Result,
    ShardsStarted,
    ShardsStopped,
    StaleNodesRemoved,
    SubscriberMessage,
)
from coordinator.strategy import max_shards_per_node
from core.dataset import SpreadSettings
from core.hashing import (
    ingestion_shard,
    query_shards,
    shard_for_series,
    shards_for_query,
    strip_metric_suffix,
)
from filopy import (
    CurrentShardSnapshot,
    Dataset,
    Down,
    Error,
    IngestionError,
    IngestionStarted,
    IngestionStopped,
    Recovery,
    RecoveryInProgress,
    ShardAssignmentStarted,
    ShardDown,
    ShardEvent,
    ShardMapper,
    ShardMapState,
    Stopped,
    Unassigned,
)
from tests.mapper_helpers import minimal_events, num_assigned_shards, register_node, unassign_shard
from tests.unit.support import Clock

from .support import dataset, ref

INT32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)


@given(k=INT32, p=INT32, n=st.integers(0, 12), data=st.data())
def test_ingestion_shard_is_always_among_query_shards(k: int, p: int, n: int, data) -> None:
    spread = data.draw(st.integers(0, n))
    shards = query_shards(k, spread, 1 << n)
    assert len(shards) == 2**spread == len(set(shards))
    assert all(0 <= s < 1 << n for s in shards)
    assert ingestion_shard(k, p, spread, 1 << n) in shards


LABEL_TEXT = st.text(min_size=1, max_size=8)


@given(
    ws=LABEL_TEXT,
    ns=LABEL_TEXT,
    metric=LABEL_TEXT,
    suffix=st.sampled_from(["", "_bucket", "_count", "_sum"]),
    extra=st.dictionaries(st.text(min_size=1, max_size=5), LABEL_TEXT, max_size=4),
    spread=st.integers(0, 5),
)
def test_series_route_to_one_of_their_query_shards(ws, ns, metric, suffix, extra, spread) -> None:
    ds = Dataset(name="p", num_shards=32)
    series = {**extra, "_ws_": ws, "_ns_": ns, "_metric_": metric + suffix}
    # A query names the series' own metric (e.g. `x_bucket`) or, for a histogram, its base `x`.
    # Only the first matching suffix is trimmed (as in FiloDB), so the base form routes the same
    # only when the base name does not itself end in a suffix (`_sum` + `_bucket` does not).
    key = {"_ws_": ws, "_ns_": ns, "_metric_": metric + suffix}
    assert shard_for_series(ds, series, spread) in shards_for_query(ds, key, spread)
    if strip_metric_suffix(metric) == metric:
        base = {**key, "_metric_": metric}
        assert shard_for_series(ds, series, spread) in shards_for_query(ds, base, spread)


STATUSES = st.one_of(
    st.sampled_from([Unassigned(), Stopped(), Down()]),
    st.builds(Recovery, st.integers(0, 100)),
    st.builds(Error, st.text(max_size=4)),
)


@settings(max_examples=60)
@given(data=st.data(), n=st.integers(0, 10), many_nodes=st.booleans())
def test_shard_map_state_pickles_to_an_equal_state(data, n: int, many_nodes: bool) -> None:
    num_shards = 1 << n
    names = [f"node-{i}" for i in range(300 if many_nodes else 3)]
    owners = data.draw(
        st.lists(st.none() | st.sampled_from(names), min_size=num_shards, max_size=num_shards)
    )
    statuses = data.draw(st.lists(STATUSES, min_size=num_shards, max_size=num_shards))
    state = ShardMapState(
        num_shards, tuple(owners), tuple(statuses), data.draw(st.integers(0, 10**9))
    )
    again = pickle.loads(pickle.dumps(state))
    assert again == state and again.version == state.version
    assert pickle.loads(pickle.dumps(again)) == state


# ----- mapper ----------------------------------------------------------------------------------

R = ref("p")
NODES = st.sampled_from(["a", "b", "c"])
SHARD = st.integers(0, 7)
EVENTS = st.one_of(
    st.builds(ShardAssignmentStarted, st.just(R), SHARD, NODES),
    st.builds(IngestionStarted, st.just(R), SHARD, NODES),
    st.builds(RecoveryInProgress, st.just(R), SHARD, NODES, st.integers(0, 100)),
    st.builds(IngestionError, st.just(R), SHARD, st.none() | NODES, st.text(max_size=3)),
    st.builds(IngestionStopped, st.just(R), SHARD, st.none() | NODES),
    st.builds(ShardDown, st.just(R), SHARD, st.none() | NODES),
)
OPS = st.one_of(
    EVENTS,
    st.tuples(st.just("register"), st.lists(SHARD, max_size=3), NODES),
    st.tuples(st.just("unassign"), SHARD),
    st.tuples(st.just("remove"), NODES),
)


def check_mapper(m: ShardMapper) -> None:
    seen: set[int] = set()
    for node in m.all_nodes():
        shards = m.shards_for_node(node)
        assert shards and all(m.owner(s) == node for s in shards)
        assert not seen & set(shards)  # no shard has two owners
        seen |= set(shards)
    assert sorted(seen) == m.assigned_shards()
    assert m.unassigned_shards() == [s for s in range(m.num_shards) if m.owner(s) is None]
    free = [s for s in range(m.num_shards) if m.owner(s) is None and m.status(s) != Stopped()]
    assert m.assignable_shards() == free and m.num_assignable_shards == len(free)
    for k in (0, 1, 3):
        assert m.assignable_shards(limit=k) == free[:k]
        assert m.unassigned_shards(limit=k) == m.unassigned_shards()[:k]
    for s in range(m.num_shards):
        if m.owner(s) is None:
            assert isinstance(m.status(s), Unassigned | Error | Down | Stopped)
        else:
            assert not isinstance(m.status(s), Unassigned | Error | Down)
    rebuilt = ShardMapper(m.num_shards)
    for e in minimal_events(m, R):
        rebuilt.update_from_event(e)
    assert rebuilt == m
    assert ShardMapper.from_state(m.snapshot()) == m


@settings(max_examples=200)
@given(ops=st.lists(OPS, max_size=40))
def test_mapper_stays_consistent_and_minimal_events_round_trip(ops) -> None:
    m = ShardMapper(8)
    version = m.version
    for op in ops:
        before = m.copy()
        if isinstance(op, ShardEvent):
            m.update_from_event(op)
        elif op[0] == "register":
            register_node(m, op[1], op[2])
        elif op[0] == "unassign":
            unassign_shard(m, op[1])
        else:
            m.remove_node(op[1])
        assert (m.version > version) == (m != before)
        version = m.version
        check_mapper(m)


# ----- manager state machine --------------------------------------------------------------------

DATASETS = [
    dataset("small", num_shards=4, min_num_nodes=2),
    dataset("mid", num_shards=16, min_num_nodes=3),
    dataset("single", num_shards=1, min_num_nodes=1, spread=SpreadSettings(default=0)),
    dataset("wide", num_shards=32, min_num_nodes=5),
]


class ManagerMachine(RuleBasedStateMachine):
    """Random joins, leaves, errors, node events, start/stop and recoveries."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock(0.0)
        self.mgr = ShardManager(clock=self.clock, reassignment_min_interval=100)
        self.joined = 0
        self.node_versions: dict[tuple[str, str], int] = {}
        self.mirror: dict[str, ShardMapper] = {}  # the guardian's view, built from messages
        self.consume(self.mgr.subscribe_all("guardian"))

    # -- helpers --

    def mapper(self, d: Dataset) -> ShardMapper:
        m = self.mgr.mapper(d.ref)
        assert m is not None
        return m

    def datasets(self) -> list[Dataset]:
        return [d for d in DATASETS if self.mgr.dataset(d.ref) is not None]

    def datasets_with_owners(self) -> list[Dataset]:
        return [d for d in self.datasets() if num_assigned_shards(self.mapper(d))]

    def consume(self, result: Result) -> Result:
        """Check what a call sent, and play the guardian: mirror maps from its messages only."""
        last_map: dict[str, NodeShardMap] = {}
        for msg in result.messages:
            if isinstance(msg, NodeShardMap):
                key = (msg.node, msg.ref.name)
                assert msg.version >= self.node_versions.get(key, -1), "version went back"
                self.node_versions[key] = msg.version
                last_map[msg.ref.name] = msg
            elif isinstance(msg, SubscriberMessage) and msg.subscriber == "guardian":
                p = msg.payload
                if isinstance(p, CurrentShardSnapshot):
                    self.mirror[p.ref.name] = ShardMapper.from_state(p.state)
                elif isinstance(p, ShardEvent):
                    self.mirror[p.ref.name].update_from_event(p)
                elif isinstance(p, DatasetRemoved):
                    del self.mirror[p.ref.name]
        for name, msg in last_map.items():
            current = self.mgr.mapper(ref(name))
            if msg.removed:
                assert current is None
            else:
                assert current is not None and ShardMapper.from_state(msg.state) == current
        return result

    def check_all_owned_if_enough_members(self, only: Dataset | None = None) -> None:
        """Call after a change that offered the unowned shards to every member."""
        for d in [only] if only else self.datasets():
            if len(self.mgr.members) >= d.min_num_nodes:
                # Stopped shards wait for an operator's start; everything else found a home.
                assert self.mapper(d).num_assignable_shards == 0

    def draw_shards(self, data, d: Dataset, preferred: list[int]) -> list[int]:
        """Mostly shards from ``preferred``, sometimes anything, including invalid numbers."""
        any_shard = st.integers(-1, d.num_shards)
        anything = st.lists(any_shard, min_size=0, max_size=3)
        if not preferred:
            return data.draw(anything)
        return data.draw(
            st.lists(st.sampled_from(preferred), min_size=1, max_size=3, unique=True) | anything
        )

    # -- rules --

    @rule()
    def join(self) -> None:
        self.joined += 1
        self.consume(self.mgr.add_member(f"n{self.joined}"))

    @precondition(lambda self: self.mgr.members)
    @rule(data=st.data())
    def leave(self, data) -> None:
        node = data.draw(st.sampled_from(self.mgr.members))
        self.consume(self.mgr.remove_member(node))
        self.check_all_owned_if_enough_members()

    @rule(d=st.sampled_from(DATASETS))
    def add_dataset(self, d: Dataset) -> None:
        existed = self.mgr.dataset(d.ref) is not None
        self.consume(self.mgr.add_dataset(d))
        if not existed:
            self.check_all_owned_if_enough_members(only=d)

    @precondition(lambda self: self.datasets())
    @rule(data=st.data())
    def remove_dataset(self, data) -> None:
        d = data.draw(st.sampled_from(self.datasets()))
        self.consume(self.mgr.remove_dataset(d.ref))

    @precondition(lambda self: self.datasets())
    @rule(data=st.data(), kind=st.sampled_from(["error", "started", "recovery", "stopped", "down"]))
    def node_event(self, data, kind: str) -> None:
        d = data.draw(st.sampled_from(self.datasets()))
        owned = self.mapper(d).assigned_shards()
        any_shard = st.integers(0, d.num_shards - 1)
        shard = data.draw(st.sampled_from(owned) | any_shard if owned else any_shard)
        owner = self.mapper(d).owner(shard)
        anyone = st.sampled_from([*self.mgr.members, "stranger"])
        sender = data.draw(st.just(owner) | anyone if owner else anyone)
        event = {
            "error": IngestionError(d.ref, shard, sender, "boom"),
            "started": IngestionStarted(d.ref, shard, sender),
            "recovery": RecoveryInProgress(d.ref, shard, sender, data.draw(st.integers(0, 100))),
            "stopped": IngestionStopped(d.ref, shard, sender),
            "down": ShardDown(d.ref, shard, sender),
        }[kind]
        before = self.mapper(d)
        self.consume(self.mgr.update_from_external_shard_event(sender, event))
        if sender != owner or kind == "stopped":
            # Only the owner's reports count, and a node's IngestionStopped is always about an
            # ingester the map no longer runs: the manager decides stops itself.
            assert self.mapper(d) == before

    @precondition(lambda self: self.datasets() and self.mgr.members)
    @rule(data=st.data())
    def start_shards(self, data) -> None:
        d = data.draw(st.sampled_from(self.datasets()))
        node = data.draw(st.sampled_from(self.mgr.members))
        before = self.mapper(d)
        shards = self.draw_shards(data, d, before.unassigned_shards())
        result = self.consume(self.mgr.start_shards(d.ref, node, shards))
        after = self.mapper(d)
        if isinstance(result.reply, ShardsStarted):
            assert all(before.owner(s) is None and after.owner(s) == node for s in shards)
        else:
            assert after == before

    @precondition(lambda self: self.datasets())
    @rule(data=st.data())
    def stop_shards(self, data) -> None:
        d = data.draw(st.sampled_from(self.datasets()))
        shards = self.draw_shards(data, d, self.mapper(d).assigned_shards())
        result = self.consume(self.mgr.stop_shards(d.ref, shards))
        if isinstance(result.reply, ShardsStopped):
            m = self.mapper(d)
            assert all(m.owner(s) is None and m.status(s) == Stopped() for s in shards)

    @precondition(lambda self: self.datasets_with_owners())
    @rule(data=st.data())
    def move_shard(self, data) -> None:
        """Stop a shard, then start it on a member with room: the operator's way to move one."""
        d = data.draw(st.sampled_from(self.datasets_with_owners()))
        shard = data.draw(st.sampled_from(self.mapper(d).assigned_shards()))
        assert isinstance(self.consume(self.mgr.stop_shards(d.ref, [shard])).reply, ShardsStopped)
        mapper, strategy = self.mapper(d), DefaultShardAssignmentStrategy()
        roomy = [n for n in self.mgr.members if strategy.remaining_capacity(n, d, mapper) > 0]
        if roomy:
            node = data.draw(st.sampled_from(roomy))
            result = self.consume(self.mgr.start_shards(d.ref, node, [shard]))
            assert result.reply == ShardsStarted(d.ref, node, (shard,))

    @rule(seconds=st.sampled_from([1.0, 50.0, 150.0]))
    def tick(self, seconds: float) -> None:
        self.clock.now += seconds

    @precondition(lambda self: self.mgr.members)
    @rule(data=st.data())
    def remove_stale(self, data) -> None:
        live = data.draw(st.lists(st.sampled_from(self.mgr.members), unique=True))
        result = self.consume(self.mgr.remove_stale_coordinators(live))
        assert set(self.mgr.members) <= set(live)
        assert isinstance(result.reply, StaleNodesRemoved)
        if result.reply.nodes:  # only then are unowned shards offered again
            self.check_all_owned_if_enough_members()

    @precondition(lambda self: self.datasets())
    @rule(data=st.data())
    def recover_same_map(self, data) -> None:
        d = data.draw(st.sampled_from(self.datasets()))
        saved = self.mapper(d)
        saved.advance_version(saved.version + 1)
        self.consume(self.mgr.recover_shards(d.ref, saved.snapshot()))
        assert self.mapper(d) == saved

    # -- invariants --

    @invariant()
    def shard_maps_are_consistent(self) -> None:
        members = set(self.mgr.members)
        for d in self.datasets():
            m = self.mapper(d)
            check_mapper(m)  # incl. no shard with two owners, minimal_events round trip
            assert m.all_nodes() <= members
            cap = max_shards_per_node(d)
            assert all(m.num_shards_for_node(n) <= cap for n in m.all_nodes())

    @invariant()
    def guardian_mirror_matches(self) -> None:
        assert set(self.mirror) == {d.name for d in self.datasets()}
        for d in self.datasets():
            assert self.mirror[d.name] == self.mapper(d)


ManagerMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestManagerStateMachine = ManagerMachine.TestCase
