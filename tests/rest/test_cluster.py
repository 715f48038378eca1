"""Shard status, start/stop and the SSE event stream over REST, against a real two-node cluster."""

from __future__ import annotations

import asyncio
import json
import queue
import socket
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from core.dataset import DatasetRef
from tests.rest.test_datasets import error_of

pytestmark = pytest.mark.ray


def status(rest, name: str) -> list[dict[str, Any]]:
    resp = rest.http.get(f"/api/v1/cluster/{name}/status")
    assert resp.status_code == 200, resp.text
    return resp.json()["data"]


def by_address(rest, name: str) -> dict[str, list[dict[str, Any]]]:
    resp = rest.http.get(f"/api/v1/cluster/{name}/statusByAddress")
    assert resp.status_code == 200, resp.text
    return {g["address"]: g["shards"] for g in resp.json()["data"]}


def all_active(rest, name: str) -> list[dict[str, Any]] | None:
    shards = status(rest, name)
    return shards if all(s["status"] == "Active" for s in shards) else None


@pytest.fixture
def dataset(rest, name: str) -> Iterator[str]:
    """A 4-shard dataset over both nodes, all Active; removed afterwards."""
    resp = rest.http.post(
        "/api/v1/datasets", json={"name": name, "num_shards": 4, "min_num_nodes": 2}
    )
    assert resp.status_code == 201, resp.text
    rest.wait_for("all shards active", lambda: all_active(rest, name))
    yield name
    rest.http.delete(f"/api/v1/datasets/{name}")


def post(rest, name: str, action: str, body: Any) -> httpx.Response:
    return rest.http.post(f"/api/v1/cluster/{name}/{action}", json=body)


def test_status_and_status_by_address(rest, dataset: str) -> None:
    shards = status(rest, dataset)
    assert [s["shard"] for s in shards] == [0, 1, 2, 3]
    assert {s["address"] for s in shards} == set(rest.nodes)
    assert all(s["status"] == "Active" for s in shards)
    groups = by_address(rest, dataset)
    assert set(groups) == set(rest.nodes)  # every member, no unowned group
    assert sorted(len(g) for g in groups.values()) == [2, 2]
    for node, owned in groups.items():
        assert all(s["status"] == "Active" for s in owned)
        assert {s["shard"] for s in owned} == {s["shard"] for s in shards if s["address"] == node}
    assert dataset in rest.http.get("/api/v1/cluster").json()["data"]


def test_nodes_are_listed_with_names_and_versions_and_shards_show_their_owner_s_name(
    rest, dataset: str
) -> None:
    resp = rest.http.get("/api/v1/nodes")
    assert resp.status_code == 200, resp.text
    data = resp.json()["data"]
    host = socket.gethostname().split(".")[0]
    names = {n["address"]: n["name"] for n in data["members"]}
    assert names == {node: f"{host}-{node[:6]}" for node in rest.nodes}
    assert all(n["version"] for n in data["members"])  # the installed package's
    assert data["refused"] == {}
    for s in status(rest, dataset):
        assert s["node"] == names.get(s["address"], ""), s
    groups = rest.http.get(f"/api/v1/cluster/{dataset}/statusByAddress").json()["data"]
    assert {g["address"]: g["node"] for g in groups} == names


def test_stop_then_start_a_shard_elsewhere(rest, dataset: str) -> None:
    owner = status(rest, dataset)[0]["address"]
    other = next(n for n in rest.nodes if n != owner)

    stopped = post(rest, dataset, "stopshards", {"shardList": [0]})
    assert stopped.status_code == 200, stopped.text
    assert stopped.json() == {"status": "success", "data": {"shardList": [0]}}
    # Stopped and unowned, and it stays so until started (no reassignment takes it).
    assert status(rest, dataset)[0] == {"shard": 0, "status": "Stopped", "address": "", "node": ""}
    assert by_address(rest, dataset)[""] == [{"shard": 0, "status": "Stopped"}]

    # The other node holds 2 of max 2 shards: no room until the owner's count drops too.
    full = post(rest, dataset, "startshards", {"address": other, "shardList": [0]})
    assert "capacity exceeded" in error_of(full, 400, "capacity_exceeded")

    started = post(rest, dataset, "startshards", {"address": owner, "shardList": [0]})
    assert started.status_code == 200, started.text
    assert started.json()["data"] == {"address": owner, "shardList": [0]}
    rest.wait_for("shard 0 active again", lambda: all_active(rest, dataset))
    assert status(rest, dataset)[0]["address"] == owner
    assert "" not in by_address(rest, dataset)


def test_shard_request_validation_errors_are_400_with_the_reason(rest, dataset: str) -> None:
    shards = status(rest, dataset)
    owner = shards[0]["address"]
    other = next(n for n in rest.nodes if n != owner)
    of_other = next(s["shard"] for s in shards if s["address"] == other)
    cases = [
        ("stopshards", {"shardList": []}, "invalid_shards", "no shards given"),
        ("stopshards", {"shardList": [7]}, "invalid_shards", "invalid shards [7]"),
        ("stopshards", {"shardList": [1, 1]}, "invalid_shards", "shards repeated: [1]"),
        ("startshards", {"address": "nobody", "shardList": [0]}, "unknown_node", "not a member"),
        ("startshards", {"address": owner, "shardList": [4]}, "invalid_shards", "0..3"),
        ("startshards", {"address": owner, "shardList": [0]}, "same_node", "already run on"),
        (
            "startshards",
            {"address": owner, "shardList": [of_other]},
            "owned_by_other",
            f"{of_other} on {other!r}; stop them first",
        ),
    ]
    for action, body, reason, message in cases:
        assert message in error_of(post(rest, dataset, action, body), 400, reason), body
    assert post(rest, dataset, "stopshards", {"shardList": [0]}).status_code == 200
    again = post(rest, dataset, "stopshards", {"shardList": [0]})
    assert "cannot stop shards [0]: not assigned" in error_of(again, 400, "not_assigned")
    post(rest, dataset, "startshards", {"address": owner, "shardList": [0]})


@pytest.mark.parametrize(
    ("action", "body", "message"),
    [
        ("stopshards", {}, "shardList: required"),
        ("stopshards", {"shardList": [-1]}, "shardList[0]: Input should be greater than or equal"),
        ("stopshards", {"shardList": "0"}, "shardList: Input should be a valid list"),
        ("stopshards", {"shardList": [0], "force": True}, "unknown field 'force'"),
        ("startshards", {"shardList": [0]}, "address: required"),
        ("startshards", {"address": "", "shardList": [0]}, "address: String should have at least"),
        ("startshards", {"address": "n", "shardList": ["x"]}, "shardList[0]: Input should be"),
    ],
)
def test_shard_request_bodies_are_validated(rest, action: str, body: Any, message: str) -> None:
    # Body validation comes before the dataset lookup, so any valid name will do.
    error = error_of(post(rest, "anything", action, body), 400, "bad_data")
    assert message in error, error


class EventStream:
    """Reads an SSE endpoint on a thread; parsed (event, data) pairs arrive on a queue.

    The reader is async on its own loop so that `close()` can cancel a read that is blocked
    waiting for the next event, which really closes the connection (as a browser would).
    """

    def __init__(self, url: str) -> None:
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.status: int | None = None
        self.content_type = ""
        self._opened = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._task: asyncio.Task[None] | None = None
        self._thread = threading.Thread(
            target=self._loop.run_until_complete, args=(self._read(url),), daemon=True
        )
        self._thread.start()
        assert self._opened.wait(30), "the stream did not open"

    async def _read(self, url: str) -> None:
        self._task = asyncio.current_task()
        try:
            async with (
                httpx.AsyncClient(timeout=httpx.Timeout(30, read=None)) as client,
                client.stream("GET", url) as resp,
            ):
                self.status = resp.status_code
                self.content_type = resp.headers.get("content-type", "")
                self._opened.set()
                event, data = "message", []
                async for line in resp.aiter_lines():
                    if line.startswith("event:"):
                        event = line[6:].strip()
                    elif line.startswith("data:"):
                        data.append(line[5:].strip())
                    elif line == "" and data:
                        self.events.put((event, json.loads("\n".join(data))))
                        event, data = "message", []
        except (httpx.HTTPError, asyncio.CancelledError):
            pass
        finally:
            self._opened.set()
            self.events.put(("<end>", None))

    def next(self, timeout_s: float = 15.0) -> tuple[str, Any]:
        return self.events.get(timeout=timeout_s)

    def close(self) -> None:
        if self._task is not None:
            self._loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(10)
        assert not self._thread.is_alive(), "the stream did not close"
        self._loop.close()


def subscribers(rest, name: str) -> list[str]:
    import ray

    return ray.get(rest.cluster.actor.subscribers.remote(DatasetRef(name=name)), timeout=30)


def test_events_stream_a_snapshot_then_every_shard_event(rest, dataset: str) -> None:
    before = len(subscribers(rest, dataset))
    stream = EventStream(f"{rest.url}/api/v1/cluster/{dataset}/events")
    try:
        assert stream.status == 200
        assert stream.content_type.startswith("text/event-stream")
        event, snapshot = stream.next()
        assert event == "snapshot"
        assert snapshot["dataset"] == dataset
        assert snapshot["version"] >= 1
        assert snapshot["shards"] == status(rest, dataset)
        assert len(subscribers(rest, dataset)) == before + 1

        owner = snapshot["shards"][1]["address"]
        owner_name = snapshot["shards"][1]["node"]  # its readable name, also in each event
        assert owner_name and owner_name != owner
        assert post(rest, dataset, "stopshards", {"shardList": [1]}).status_code == 200
        event, down = stream.next()
        assert event == "shard_event"
        assert down == {
            "dataset": dataset,
            "shard": 1,
            "event": "ShardDown",
            "address": owner,
            "node": owner_name,
            "status": "Down",
        }
        # Then Stopped without an owner: it stays so until an operator starts it.
        event, stopped = stream.next()
        assert event == "shard_event"
        assert stopped == {
            "dataset": dataset,
            "shard": 1,
            "event": "IngestionStopped",
            "address": "",
            "node": "",
            "status": "Stopped",
        }
        assert (
            post(rest, dataset, "startshards", {"address": owner, "shardList": [1]}).status_code
            == 200
        )
        seen = [stream.next()[1]]
        while seen[-1]["event"] != "IngestionStarted":
            seen.append(stream.next()[1])
        steps = [(e["event"], e["status"], e["address"]) for e in seen]
        assert steps[0] == ("ShardAssignmentStarted", "Assigned", owner)
        assert steps[-1] == ("IngestionStarted", "Active", owner)
        # The node's report that its previous ingester stopped may land after the new
        # assignment (same node), briefly showing Stopped; nothing else comes in between.
        assert set(steps[1:-1]) <= {("IngestionStopped", "Stopped", owner)}, steps
        assert all(e["shard"] == 1 and e["dataset"] == dataset for e in seen)
    finally:
        stream.close()
    # The client went away: the server unsubscribed its subscription from the cluster.
    rest.wait_for("unsubscribed", lambda: len(subscribers(rest, dataset)) == before)


def test_events_end_when_the_dataset_is_removed(rest, name: str) -> None:
    assert (
        rest.http.post("/api/v1/datasets", json={"name": name, "num_shards": 2}).status_code == 201
    )
    stream = EventStream(f"{rest.url}/api/v1/cluster/{name}/events")
    try:
        assert stream.next()[0] == "snapshot"
        assert rest.http.delete(f"/api/v1/datasets/{name}").status_code == 200
        kinds = []
        while not kinds or kinds[-1] not in ("dataset_removed", "<end>"):
            kind, data = stream.next()
            kinds.append(kind)
        assert kinds[-1] == "dataset_removed"
        assert data == {"dataset": name}
        assert stream.next()[0] == "<end>"  # the server closed the stream
    finally:
        stream.close()


@pytest.mark.parametrize(
    ("query", "status", "error_type", "message"),
    [
        ("up + fill(0) down", 501, "unsupported", "fill modifiers"),
        ('{a="1" or b="2"}', 501, "unsupported", "'or' between label matchers"),
        ("sum(up", 400, "bad_data", "parse error"),
    ],
)
def test_promql_errors_answer_as_prometheus_does(
    rest, dataset: str, query: str, status: int, error_type: str, message: str
) -> None:
    """Valid PromQL FiloPy does not evaluate is 501 `unsupported` (what the compliance tester
    counts as unsupported), invalid PromQL a 400 `bad_data`."""
    resp = rest.http.get(f"/promql/{dataset}/api/v1/query", params={"query": query})
    body = resp.json()
    assert (resp.status_code, body["status"], body["errorType"]) == (status, "error", error_type)
    assert message in body["error"]


def test_grafanas_calls_answer_in_prometheus_shapes(rest, dataset: str) -> None:
    base = f"/promql/{dataset}/api/v1"
    info = rest.http.get(f"{base}/status/buildinfo").json()["data"]
    assert info["version"].startswith("3.") and info["filopyVersion"]
    assert rest.http.get(f"{base}/metadata", params={"metric": "up"}).json()["data"] == {}
    assert rest.http.get(f"{base}/metadata", params={"limit": "x"}).status_code == 400
    ex = rest.http.post(f"{base}/query_exemplars", data={"query": "up", "start": "1", "end": "2"})
    assert ex.json() == {"status": "success", "data": []}
    assert rest.http.post(f"{base}/query_exemplars", data={"query": "up{"}).status_code == 400
    # Any valid PromQL formats, also what FiloPy does not evaluate (a fill modifier).
    q = {"query": "sum by(a)(rate(x[5m]))+fill(0) y"}
    assert rest.http.get(f"{base}/format_query", params=q).json()["data"].startswith("sum by (a)")
    bad = rest.http.get(f"{base}/format_query", params={"query": "sum("})
    assert (bad.status_code, bad.json()["errorType"]) == (400, "bad_data")
