"""Planning shard moves that spread a dataset's load over its nodes: a pure function.

The singleton asks "which moves now?" with the current owners, which shards may move, each
node's version and each shard's load, and how many moves it may start (the throttle's budget).
The answer is a `Plan`: the moves, the map and the load per node they lead to, and why no more
moves were planned. Nothing here applies a move; the same function answers an operator's
`filopy plan` (what-if) and the periodic rebalance, so a plan shown is the plan applied.

Rules, each a reason in `Plan.held_back`:
- No moves while the nodes run different versions (a rolling update is under way).
- A move never goes to a node of an older version than the shard's current owner.
- A move is made only if it narrows the gap between the two nodes: load w moves from the most
  to the least loaded node only when `least + w < most` (Shardcake's rule for counts: a
  difference of one shard is not worth a move).
- At most `budget` moves (the throttle: free move slots, per dataset and cluster-wide).
Loads default to 1 per shard, which balances shard counts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

__all__ = ["Move", "Plan", "evacuation_moves", "plan_moves", "version_key"]


@dataclass(frozen=True, slots=True)
class Move:
    """Hand `shard` from `source` to `target` (through the drain protocol)."""

    shard: int
    source: str
    target: str


@dataclass(frozen=True, slots=True)
class Plan:
    """The moves to start now and where they lead."""

    moves: tuple[Move, ...]
    owners: tuple[str | None, ...]  # per shard, once the moves are done
    load_before: Mapping[str, float]  # per node
    load_after: Mapping[str, float]
    held_back: str  # why no more moves: "balanced", "throttled", "versions differ: ...", ...

    @property
    def spread_before(self) -> float:
        return _spread(self.load_before)

    @property
    def spread_after(self) -> float:
        return _spread(self.load_after)


def _spread(load: Mapping[str, float]) -> float:
    return max(load.values()) - min(load.values()) if load else 0.0


def version_key(version: str) -> tuple[int, Version | str]:
    """A sortable key for a node's version: PEP 440 versions in order; anything else after
    them, by text (so an unparsable version is never taken for an older one)."""
    try:
        return (0, Version(version))
    except InvalidVersion:
        return (1, version)


def plan_moves(
    owners: Sequence[str | None],
    movable: Sequence[bool],
    nodes: Mapping[str, str],
    budget: int,
    load: Sequence[float] | None = None,
    min_gap: float = 0.0,
) -> Plan:
    """Moves that narrow the load gap between `nodes` (name -> version), at most `budget`;
    two nodes whose loads differ by `min_gap` or less count as balanced (measured loads are
    noisy: without it a rebalance would chase the noise).

    `owners[s]` is the node of shard s (None: unowned); only shards with `movable[s]` (ingesting,
    no move in flight, not held by an operator) are moved, and only between `nodes`; shards of
    other owners count for nothing. `load[s]` is the shard's weight (samples/s, or 1)."""
    n = len(owners)
    if len(movable) != n or (load is not None and len(load) != n):
        raise ValueError("owners, movable and load must have one entry per shard")
    weights = [1.0] * n if load is None else [max(0.0, float(w)) for w in load]
    per_node = {node: 0.0 for node in nodes}
    held: dict[str, list[int]] = {node: [] for node in nodes}
    for shard, owner in enumerate(owners):
        if owner in per_node:
            per_node[owner] += weights[shard]
            if movable[shard]:
                held[owner].append(shard)
    before = dict(per_node)
    new_owners = list(owners)

    def plan(moves: list[Move], why: str) -> Plan:
        return Plan(tuple(moves), tuple(new_owners), before, dict(per_node), why)

    if len(nodes) < 2:
        return plan([], "balanced")
    versions = {version_key(v) for v in nodes.values()}
    if len(versions) > 1:
        shown = ", ".join(f"{k}={v}" for k, v in sorted(nodes.items()))
        return plan([], f"versions differ ({shown}): no rebalancing during a rolling update")
    moves: list[Move] = []
    while True:
        move = _best_move(per_node, held, weights, nodes, min_gap)
        if move is None:
            return plan(moves, "balanced")
        if len(moves) >= budget:
            return plan(moves, "throttled")
        shard, source, target = move
        moves.append(Move(shard, source, target))
        held[source].remove(shard)  # moved once per plan: it is in flight now
        per_node[source] -= weights[shard]
        per_node[target] += weights[shard]
        new_owners[shard] = target


def _best_move(
    per_node: Mapping[str, float],
    held: Mapping[str, list[int]],
    weights: Sequence[float],
    nodes: Mapping[str, str],
    min_gap: float = 0.0,
) -> tuple[int, str, str] | None:
    """The move from the most loaded node (that has a movable shard which helps) to the least
    loaded one that may take it; ties broken by name and shard number, so plans are stable."""
    by_load = sorted(per_node, key=lambda node: (per_node[node], node))
    for source in reversed(by_load):
        for target in by_load:
            gap = per_node[source] - per_node[target]
            if gap <= max(0.0, min_gap):
                break
            if version_key(nodes[target]) < version_key(nodes[source]):
                continue
            # The shard that best halves the gap, among those that narrow it at all.
            best: tuple[float, int] | None = None
            for shard in held[source]:
                w = weights[shard]
                if 0 < w < gap:
                    score = (abs(gap / 2 - w), shard)
                    if best is None or score < best:
                        best = score
            if best is not None:
                return best[1], source, target
    return None


def evacuation_moves(
    owners: Sequence[str | None],
    movable: Sequence[bool],
    leaving: frozenset[str] | set[str],
    nodes: Mapping[str, str],
    budget: int,
) -> tuple[Move, ...]:
    """Moves that empty the `leaving` nodes (an operator's drain): each movable shard of theirs
    goes to the least loaded of `nodes` (name -> version) that is not older than its owner,
    lowest shard first, at most `budget` of them. Loads are shard counts."""
    per_node = {n: 0 for n in nodes if n not in leaving}
    for owner in owners:
        if owner in per_node:
            per_node[owner] += 1
    moves: list[Move] = []
    for shard, owner in enumerate(owners):
        if len(moves) >= budget:
            break
        if owner not in leaving or not movable[shard]:
            continue
        floor = version_key(nodes.get(owner, ""))
        candidates = [n for n in per_node if version_key(nodes[n]) >= floor]
        if not candidates:
            continue
        target = min(candidates, key=lambda n: (per_node[n], n))
        per_node[target] += 1
        moves.append(Move(shard, owner, target))
    return tuple(moves)
