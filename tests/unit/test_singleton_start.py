"""`start_cluster_actor` when Ray's restart of the singleton is stuck: it ends the stuck one and
creates it anew once Ray frees the name, and raises `SingletonUnavailable` (retry later) if the
name stays taken, rather than hand back a handle to the ended one. Ray is faked: the real
cluster's case is tests/runtime/test_singleton_placement.py's."""

from __future__ import annotations

from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from core.config import load_settings
from core.errors import Unavailable, category_of


class _Remote:
    def remote(self) -> str:
        return "ready?"


class _Stuck:
    """A singleton Ray restarts but never creates."""

    __ray_ready__ = _Remote()


@pytest.fixture
def ca() -> ModuleType:
    """`coordinator.cluster_actor`, imported by the tests that use it: it imports Ray."""
    from coordinator import cluster_actor

    return cluster_actor


class _FakeRay:
    def __init__(
        self, ca: ModuleType, monkeypatch: pytest.MonkeyPatch, frees_name_after: int | None
    ) -> None:
        import ray.exceptions

        self.lookups = 0
        self.killed: list[object] = []
        self.created = 0
        self.clock = 0.0
        self.frees_name_after = frees_name_after
        self.stuck = _Stuck()
        monkeypatch.setattr(ca, "cluster_actor", self.lookup)
        monkeypatch.setattr(ca, "_create_cluster_actor", self.create)
        fake_ray = SimpleNamespace(get=self.get, kill=self.kill, exceptions=ray.exceptions)
        monkeypatch.setattr(ca, "ray", fake_ray)
        monkeypatch.setattr(ca, "time", SimpleNamespace(monotonic=self.now, sleep=self.sleep))

    def lookup(self, settings: Any) -> object:
        self.lookups += 1
        freed = self.killed and self.frees_name_after is not None
        if freed and self.lookups > 1 + self.frees_name_after:
            raise ValueError("no actor by that name")
        return self.stuck

    def get(self, ref: object, timeout: float) -> object:
        import ray.exceptions

        raise ray.exceptions.GetTimeoutError("not created")

    def kill(self, actor: object, no_restart: bool) -> None:
        assert no_restart
        self.killed.append(actor)

    def now(self) -> float:
        return self.clock

    def sleep(self, seconds: float) -> None:
        self.clock += seconds

    def create(self, settings: Any) -> str:
        self.created += 1
        return "new singleton"


def test_a_stuck_singleton_is_created_anew_once_its_name_is_free(
    ca: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _FakeRay(ca, monkeypatch, frees_name_after=3)
    assert ca.start_cluster_actor(load_settings(), restart_grace_s=0.1) == "new singleton"
    assert fake.killed == [fake.stuck] and fake.created == 1


def test_a_name_never_freed_raises_unavailable(
    ca: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _FakeRay(ca, monkeypatch, frees_name_after=None)
    with pytest.raises(ca.SingletonUnavailable, match="did not free the name"):
        ca.start_cluster_actor(load_settings(), restart_grace_s=0.1)
    assert fake.killed == [fake.stuck] and fake.created == 0
    assert fake.clock >= ca.NAME_RELEASE_TIMEOUT_S
    assert category_of(ca.SingletonUnavailable) is Unavailable
