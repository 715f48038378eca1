"""The SSE stream's node names (filopy/rest/events.py), with a scripted subscription and a
client whose members change: names are looked up for nodes not named yet and kept for nodes
that left, so every event about a node names it, whenever the lookup ran."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import anyio

from core.mapper import ShardMapper
from core.shard_status import (
    CurrentShardSnapshot,
    IngestionStarted,
    ShardAssignmentStarted,
    ShardDown,
    ShardEvent,
)
from filopy.rest.events import _stream

from .support import ref

R = ref()


class Members:
    """node_names() as the singleton answers it: the current members only."""

    def __init__(self, names: dict[str, str]) -> None:
        self.names = names
        self.asked = 0

    def node_names(self) -> dict[str, str]:
        self.asked += 1
        return dict(self.names)


class Script:
    """A subscription that yields a snapshot, then events, changing the members between."""

    def __init__(self, members: Members, steps: list[ShardEvent | dict[str, str]]) -> None:
        self.ref, self.members, self.steps = R, members, steps
        self.unsubscribed = False

    async def __aiter__(self) -> AsyncIterator[object]:
        mapper = ShardMapper(2)
        mapper.update_from_event(ShardAssignmentStarted(R, 0, "id-a"))
        mapper.update_from_event(IngestionStarted(R, 0, "id-a"))
        yield CurrentShardSnapshot(R, mapper.snapshot())
        for step in self.steps:
            if isinstance(step, dict):
                self.members.names = step  # a membership change between two events
            else:
                yield step

    def unsubscribe(self) -> None:
        self.unsubscribed = True


def _events(members: Members, steps: list[ShardEvent | dict[str, str]]) -> list[dict]:
    script = Script(members, steps)

    async def collect() -> list[dict]:
        return [json.loads(e.data) async for e in _stream(members, script)]  # type: ignore[arg-type]

    out = anyio.run(collect)
    assert script.unsubscribed
    return out


def test_a_node_that_left_keeps_its_name_after_a_newcomer_is_named() -> None:
    members = Members({"id-a": "alpha"})
    events = _events(
        members,
        [
            {"id-c": "gamma"},  # alpha left, gamma joined (named at its first event)
            ShardAssignmentStarted(R, 0, "id-c"),
            ShardDown(R, 1, "id-a"),  # an event about alpha, after gamma's lookup
        ],
    )
    snapshot, to_gamma, alpha_down, removed = events
    assert [s["node"] for s in snapshot["shards"] if s["shard"] == 0] == ["alpha"]
    assert (to_gamma["node"], to_gamma["address"]) == ("gamma", "id-c")
    assert (alpha_down["node"], alpha_down["address"]) == ("alpha", "id-a")
    assert removed == {"dataset": R.name}
    assert members.asked == 2  # the snapshot, then gamma; alpha was known


def test_a_node_never_named_shows_by_its_id() -> None:
    members = Members({"id-a": "alpha"})
    _, event, _ = _events(members, [{}, ShardDown(R, 0, "id-x")])
    assert (event["node"], event["address"]) == ("id-x", "id-x")
