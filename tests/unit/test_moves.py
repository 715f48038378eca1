"""ShardMoves on its own, without a ShardManager: the handoff report table and the bookkeeping
the manager feeds it through `track`. The workflow end to end is in test_manager_handoff.py."""

from __future__ import annotations

import itertools

from coordinator.moves import (
    REPORTS,
    Action,
    Role,
    ShardMoves,
    Step,
    handoff_report,
    is_target_report,
)
from filopy import (
    Active,
    Handoff,
    IngestionDegraded,
    IngestionError,
    IngestionStarted,
    IngestionStopped,
    RecoveryInProgress,
    ShardAssignmentStarted,
    ShardDrained,
    ShardEvent,
    ShardHandoffStarted,
    ShardMapper,
)

from .support import ref

R = ref()
REPORT_TYPES = [
    ShardDrained,
    IngestionStarted,
    RecoveryInProgress,
    IngestionDegraded,
    IngestionError,
    IngestionStopped,
]


def _status(step: Step) -> Handoff:
    return Handoff("b", drained=step is Step.WARMING)


def test_a_shard_in_handoff_accepts_exactly_the_reports_of_the_table() -> None:
    """Owner "a" hands shard 0 to "b": every other report, from either side in either step, is
    ignored with a reason, so a late report cannot undo a step."""
    for step, role, kind in itertools.product(Step, Role, REPORT_TYPES):
        sender = "a" if role is Role.OWNER else "b"
        event = kind(R, 0, sender)
        answer = handoff_report(_status(step), "a", sender, event)
        expected = REPORTS.get((step, role, kind))
        if expected is None:
            assert isinstance(answer, str) and "shard 0" in answer, (step, role, kind)
        else:
            assert answer is expected, (step, role, kind)


def test_the_target_is_heard_only_once_the_owner_drained_and_only_about_itself() -> None:
    started = IngestionStarted(R, 0, "b")
    assert is_target_report(Handoff("b", drained=True), "b", started)
    assert not is_target_report(Handoff("b"), "b", started)  # still draining
    assert not is_target_report(Handoff("b", drained=True), "c", IngestionStarted(R, 0, "c"))
    assert not is_target_report(Handoff("b", drained=True), "b", IngestionStarted(R, 0, "a"))
    assert not is_target_report(Active(), "b", started)


def test_a_drained_report_names_its_sender_and_a_shard_in_handoff() -> None:
    assert handoff_report(Handoff("b"), "a", "a", ShardDrained(R, 0, "a")) is Action.DRAINED
    assert isinstance(handoff_report(Handoff("b"), "a", "a", ShardDrained(R, 0, "x")), str)
    assert isinstance(handoff_report(Active(), "a", "a", ShardDrained(R, 0, "a")), str)


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _moves(clock: _Clock) -> tuple[ShardMoves, ShardMapper]:
    mapper = ShardMapper(4)
    for shard, node in enumerate("aabb"):
        mapper.update_from_event(ShardAssignmentStarted(R, shard, node))
        mapper.update_from_event(IngestionStarted(R, shard, node))
    moves = ShardMoves({R: mapper}, clock, drain_timeout=10.0, max_concurrent_moves=2)
    return moves, mapper


def _apply(moves: ShardMoves, mapper: ShardMapper, event: ShardEvent) -> None:
    """What the manager does: apply the event to the map, then tell `track`."""
    assert mapper.update_from_event(event)
    moves.track(R, event.shard, mapper.status(event.shard), event)


def test_track_times_a_handoff_from_start_to_end_and_the_throttle_counts_it() -> None:
    clock = _Clock()
    moves, mapper = _moves(clock)
    assert moves.free_slots(R) == 2
    _apply(moves, mapper, ShardHandoffStarted(R, 0, "a", "b", "drain"))
    assert moves.handoffs() == {(R, 0): 100.0}
    assert moves.free_slots(R) == 1
    assert moves.reason(R, 0, "?") == "drain"
    assert moves.targeting("b") == [(R, 0)]
    clock.now += 5.0
    _apply(moves, mapper, ShardDrained(R, 0, "a"))
    assert moves.handoffs() == {(R, 0): 100.0}  # a handoff is timed from its start
    assert moves.overdue() == []
    clock.now += 5.0
    [late] = moves.overdue()
    assert (late.ref, late.shard, late.source, late.target) == (R, 0, "a", "b")
    assert "b did not go live within 10 s" in late.why
    _apply(moves, mapper, IngestionStarted(R, 0, "b"))
    assert moves.handoffs() == {} and moves.free_slots(R) == 2
    assert moves.reason(R, 0, "?") == "?"
    assert mapper.owner(0) == "b" and isinstance(mapper.status(0), Active)


def test_a_recovered_map_restarts_each_handoff_clock_from_now() -> None:
    clock = _Clock()
    moves, mapper = _moves(clock)
    mapper.update_from_event(ShardHandoffStarted(R, 1, "a", "b"))
    clock.now = 500.0
    moves.restart_clocks(R, mapper)
    assert moves.handoffs() == {(R, 1): 500.0}
    moves.forget_dataset(R)
    assert moves.handoffs() == {}
