"""coordinator/ray_start.py without Ray: a node whose constructor gives up as Ray's does (the
message Ray raises, the half-started node unreachable but in the traceback) is killed and started
again; other errors, and the last attempt's, go through."""

from __future__ import annotations

import pytest

from coordinator.ray_start import TIMED_OUT, started


class Node:
    """Stands in for Ray's Node: its constructor starts processes, then may give up."""

    made: list[Node] = []

    def __init__(self, gives_up: bool, error: str = f"The current node {TIMED_OUT}.") -> None:
        self.killed = False
        Node.made.append(self)
        if gives_up:
            raise Exception(error)  # as Ray does: a bare Exception from __init__

    def kill_all_processes(self, check_alive: bool, allow_graceful: bool, wait: bool) -> None:
        assert (check_alive, allow_graceful, wait) == (False, False, True)
        self.killed = True


@pytest.fixture(autouse=True)
def _fresh() -> None:
    Node.made = []


def test_a_start_ray_gave_up_on_is_killed_and_made_again() -> None:
    outcomes = iter([True, True, False])
    node = started(lambda: Node(next(outcomes)), "a node")
    assert Node.made[-1] is node and not node.killed
    assert [n.killed for n in Node.made] == [True, True, False]


def test_the_last_attempt_s_error_goes_through() -> None:
    with pytest.raises(Exception, match=TIMED_OUT):
        started(lambda: Node(True), "a node", attempts=2)
    assert [n.killed for n in Node.made] == [True, True]


def test_other_errors_are_not_retried() -> None:
    with pytest.raises(Exception, match="port in use"):
        started(lambda: Node(True, "port in use"), "a node")
    assert [n.killed for n in Node.made] == [False]
