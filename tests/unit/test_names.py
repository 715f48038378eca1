"""Actor names and subscriber ids: what one module builds, the same module parses back."""

from __future__ import annotations

from coordinator.names import (
    guardian_id,
    is_guardian,
    new_sink_name,
    new_subscription_id,
    node_actor_name,
    sink_of,
)


def test_a_subscription_id_names_its_sink_and_ids_are_unique() -> None:
    sink = new_sink_name()
    ids = {new_subscription_id(sink) for _ in range(100)}
    assert len(ids) == 100 and all(sink_of(i) == sink for i in ids)
    assert new_sink_name() != sink
    assert not any(is_guardian(i) for i in ids)


def test_guardians_and_node_actors_are_named_after_the_node() -> None:
    assert is_guardian(guardian_id("abc")) and guardian_id("abc") != guardian_id("abd")
    assert node_actor_name("abc") != node_actor_name("abd")
    assert not is_guardian(node_actor_name("abc"))
