"""docker-compose.yml, run: every service on a host of its own (tests/netbed/compose.py), then
used from a `client` host the way its header says: create a dataset over REST, write through the
gateway, query through the head, kill a worker and read everything back. A compose file whose
services do not start, do not find each other or lose a sample fails here."""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.netbed.bed import Bed
from tests.netbed.cluster import wait_for
from tests.netbed.compose import ComposeRun, load

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"


@pytest.fixture
def compose(tmp_path: Path) -> Iterator[ComposeRun]:
    """A bed of its own (prefix `fpc-`): its hosts are the compose file's services, plus
    `client` outside the compose network's services."""
    names = [*load(COMPOSE), "client"]
    hosts = {name: f"10.231.0.{2 + i}" for i, name in enumerate(names)}
    bed = Bed(tmp_path, hosts=hosts, prefix="fpc-").create()
    try:
        run = ComposeRun(bed, ROOT, COMPOSE)
        yield run
    finally:
        bed.remove()


def _curl(bed: Bed, token: str, *args: str) -> str:
    argv = ["curl", "-sS", "--fail-with-body", "--max-time", "30",
            "-H", f"Authorization: Bearer {token}", *args]  # fmt: skip
    return bed.sh("client", argv).stdout


# Its own waits (services, head, workers, failover) add up past the suite's 300 s: they, not the
# suite's timeout, must end a run that goes wrong, so the failure comes with the services' logs.
@pytest.mark.timeout(1200)
def test_the_compose_file_runs_ingests_answers_and_survives_a_worker(compose: ComposeRun) -> None:
    bed = compose.bed
    try:
        compose.start()
        wait_for("the gateway serving", lambda: bed.reaches("client", "gateway", 8081), 300)
        # As the file's header says: a token made on the head (auth is on by default).
        token = compose.exec("head", ["filopy", "token", "create", "compose", "--scope", "admin"])
        token = token.strip()

        def members() -> set[str]:
            data = json.loads(_curl(bed, token, "http://head:8080/api/v1/nodes"))["data"]
            return {m["name"] for m in data["members"]}

        def joined() -> bool:
            compose.restart_exited()
            return members() == {"worker1", "worker2"}

        wait_for("both workers members", joined, 300)
        body = {"name": "compose", "num_shards": 4, "min_num_nodes": 1}
        _curl(bed, token, "-H", "content-type: application/json", "--data", json.dumps(body),
              "http://head:8080/api/v1/datasets")  # fmt: skip

        def shards() -> list[dict[str, str]]:
            status = _curl(bed, token, "http://head:8080/api/v1/cluster/compose/status")
            return list(json.loads(status)["data"])

        wait_for("every shard Active", lambda: all(s["status"] == "Active" for s in shards()), 180)
        ts = 1_760_000_000_000
        lines = "\n".join(f"cpu,_ws_=demo,_ns_=app,host=h{i} usage={i} {ts}" for i in range(40))
        _curl(bed, token, "--data-binary", lines,
              "http://gateway:8081/ingest/compose/api/v2/write?precision=ms")  # fmt: skip
        query = urllib.parse.urlencode({"query": "count(cpu_usage)", "time": str(ts / 1000)})

        def count() -> float:
            out = json.loads(
                _curl(bed, token, f"http://head:8080/promql/compose/api/v1/query?{query}")
            )
            result = out["data"]["result"]
            return float(result[0]["value"][1]) if result else 0.0

        wait_for("the 40 series answered", lambda: count() == 40.0, 120)

        victim = next(s["node"] for s in shards() if s["status"] == "Active")
        bed.kill(victim)
        wait_for(
            f"{victim}'s shards Active on the other worker",
            lambda: all(s["status"] == "Active" and s["node"] != victim for s in shards()),
            180,
        )
        wait_for("the 40 series answered after the failover", lambda: count() == 40.0, 120)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{compose.logs()}") from None
