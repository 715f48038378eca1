"""PromQL on a real cluster: data through real Kafka into three Ray nodes, queried by routing,
fan-out and merge, compared with the brute-force reference over the same samples; the
Prometheus HTTP API, promtool against it, explain and node-side counters, partial results."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator

import numpy as np
import pytest

from coordinator.names import node_actor_name
from core.dataset import Dataset, SourceSettings, StoreOptions
from ingest.gateway import Gateway
from query.evaluator import range_times
from query.promql import parse, value_type
from query.service import QueryService, ShardsUnavailable
from query.values import StepMatrix
from tests.cluster import cluster_settings
from tests.query.reference import Reference, key
from tests.query.test_engine import (
    DATA,
    INSTANTS,
    LOOKBACK,
    MIN,
    QUERIES,
    SPAN,
    START,
    assert_same,
    engine_rows,
)
from tests.rest.conftest import Rest, start_rest

pytestmark = [pytest.mark.kafka, pytest.mark.ray]

NAME = f"q{uuid.uuid4().hex[:8]}"


def cluster_labels(labels: dict[str, str]) -> dict[str, str]:
    """FiloPy's shard key: workspace `demo`, namespace = the job, metric in `_metric_`."""
    out = {k: v for k, v in labels.items() if k != "__name__"}
    out["_metric_"] = labels["__name__"]
    out["_ws_"] = "demo"
    if "job" in labels:
        out["_ns_"] = labels["job"]
    return out


def query_labels(labels: dict[str, str]) -> dict[str, str]:
    """What a query returns for a series: PromQL's `__name__` for the metric."""
    out = {k: v for k, v in labels.items() if k != "_metric_"}
    out["__name__"] = labels["_metric_"]
    return out


SERIES = [(cluster_labels(s.labels), s.ts, s.vals) for s in DATA]
REF = Reference(
    [
        (query_labels(lb), list(zip(ts.tolist(), vals.tolist(), strict=True)))
        for lb, ts, vals in SERIES
    ],
    LOOKBACK,
)
TOTAL = sum(len(ts) for _, ts, _ in SERIES)
RANGE = range_times(START + 3 * MIN, START + SPAN + 7 * MIN, 130_000)


@pytest.fixture(scope="module")
def rest(tmp_path_factory: pytest.TempPathFactory, kafka_bootstrap: str) -> Iterator[Rest]:
    settings = cluster_settings(
        tmp_path_factory.mktemp("query"),
        "kafka",
        flush_interval_s=1.0,
        kafka_bootstrap=kafka_bootstrap,
    )
    for r in start_rest(tmp_path_factory.mktemp("query"), nodes=3, settings=settings):
        _load(r, kafka_bootstrap)
        yield r


def _load(r: Rest, kafka_bootstrap: str) -> None:
    """The dataset, every generated sample through the gateway, and a wait until all of it is
    ingested and flushed."""
    ds = Dataset(
        name=NAME,
        num_shards=8,
        min_num_nodes=3,
        source=SourceSettings(bootstrap_servers=kafka_bootstrap),
        # Little kept in memory: most of a query's samples come from the ColumnStore.
        store=StoreOptions(memory_retention_ms=10 * MIN, flush_interval_s=1.0),
    )
    r.client.setup_dataset(ds)
    r.wait_for("all shards active", lambda: r.all_active(NAME), 60)
    with Gateway(ds) as gw:
        for labels, ts, vals in SERIES:
            gw.send(
                (labels, int(t), float(v)) for t, v in zip(ts.tolist(), vals.tolist(), strict=True)
            )

    def flushed() -> bool:
        stats = r.client.ingest_stats(NAME)
        shards = [st for per_node in stats.values() for st in per_node.values()]
        ingested = sum(st["memstore"].ingested for st in shards)
        # durable: in chunks (most: every hour bucket but the last is sealed) or in snapshots
        unflushed = sum(st["unflushed_samples"] for st in shards)
        return ingested == TOTAL and unflushed == 0

    r.wait_for("every sample ingested and flushed", flushed, 120)


@pytest.fixture(scope="module")
def service(rest: Rest) -> Iterator[QueryService]:
    from coordinator.cluster_queries import cluster_query_service  # it imports Ray

    svc = cluster_query_service(rest.client)
    yield svc
    svc.close()


def rows(value: StepMatrix) -> dict:
    return engine_rows(value)


def test_most_samples_are_read_from_the_column_store(rest: Rest) -> None:
    stats = rest.client.ingest_stats(NAME)
    held = sum(st["memory_samples"] for per in stats.values() for st in per.values())
    assert held < TOTAL / 2, (held, TOTAL)


@pytest.mark.parametrize("query", QUERIES)
def test_range_queries_match_the_brute_force_reference(service: QueryService, query: str) -> None:
    expected = REF.evaluate(parse(query), list(RANGE))
    got = service.range(NAME, query, int(RANGE[0]), int(RANGE[-1]), 130_000, lookback_ms=LOOKBACK)
    assert not got.warnings
    if value_type(parse(query)) == "scalar":  # a range query answers a matrix, as Prometheus'
        assert isinstance(got.value, StepMatrix) and got.value.labels == [{}]
        np.testing.assert_allclose(got.value.values[0], expected, rtol=1e-9, atol=1e-9)
        return
    assert isinstance(got.value, StepMatrix)
    assert_same(expected, rows(got.value), query)


@pytest.mark.parametrize(
    "query",
    [
        "sum by (job) (rate(http_requests_total[5m]))",
        'topk(2, temperature{job="api"})',
        "avg without (instance) (temperature) > 9",
        "http_requests_total / on(job, instance, code) group_left http_requests_total",
        "count(up == 1)",
    ],
)
def test_instant_queries_match_the_brute_force_reference(service: QueryService, query: str) -> None:
    for t in INSTANTS:
        expected = REF.evaluate(parse(query), [t])
        got = service.instant(NAME, query, t, lookback_ms=LOOKBACK)
        assert isinstance(got.value, StepMatrix)
        assert_same(expected, rows(got.value), query)
        if query.startswith("topk"):
            assert [key(lb) for lb in got.value.labels] == REF.instant_order(parse(query), t)


def _node_counts(rest: Rest) -> dict[int, int]:
    import ray

    counts: dict[int, int] = {}
    for node in rest.client.members():
        h = ray.get_actor(node_actor_name(node), namespace=rest.cluster.settings.ray.namespace)
        for shard, n in ray.get(h.query_stats.remote()).get(NAME, {}).items():
            counts[shard] = counts.get(shard, 0) + n
    return counts


def test_a_full_shard_key_touches_two_to_the_spread_shards(
    rest: Rest, service: QueryService
) -> None:
    query = 'sum(rate(http_requests_total{_ws_="demo", _ns_="api"}[5m]))'
    plan = service.explain(NAME, query)
    (sel,) = plan["selectors"]
    (key_route,) = sel["shardKeys"]
    assert key_route["spread"] == 1 and len(plan["shards"]) == 2
    assert plan["remote"] == [
        {
            "kind": "partial aggregation",
            "expr": 'sum (rate(http_requests_total{_ws_="demo", _ns_="api"}[5m]))',
        }
    ]
    before = _node_counts(rest)
    got = service.instant(NAME, query, INSTANTS[1], lookback_ms=LOOKBACK)
    after = _node_counts(rest)
    touched = {s for s in after if after[s] != before.get(s, 0)}
    assert touched == set(plan["shards"]) == set(got.shards)
    expected = REF.evaluate(parse('sum(rate(http_requests_total{job="api"}[5m]))'), [INSTANTS[1]])
    assert_same(expected, rows(got.value), query)
    # Per-request spread: 0 visits one shard; without a shard key, every shard.
    assert len(service.explain(NAME, query, spread=0)["shards"]) == 1
    everything = service.explain(NAME, "sum(rate(http_requests_total[5m]))")
    assert everything["shards"] == list(range(8))
    assert "no exact matcher" in everything["selectors"][0]["reason"]


def test_http_api_shapes_and_errors(rest: Rest) -> None:
    http = rest.http
    t = INSTANTS[1] / 1000
    body = http.get(
        f"/promql/{NAME}/api/v1/query",
        params={"query": 'up{job="api"}', "time": t, "lookback_delta": "5m"},
    ).json()
    assert body["status"] == "success", body
    assert body["data"]["resultType"] == "vector"
    assert {r["metric"]["instance"] for r in body["data"]["result"]} == {"a:1", "b:1", "c:1"}
    assert all(r["value"][0] == t and r["value"][1] in ("0", "1") for r in body["data"]["result"])
    # The same through /api/v1 with a dataset parameter, and as a POST form.
    same = http.post(
        "/api/v1/query", data={"query": 'up{job="api"}', "time": t, "dataset": NAME}
    ).json()
    assert same == body
    rng = http.get(
        f"/promql/{NAME}/api/v1/query_range",
        params={"query": "sum(up)", "start": t, "end": t + 300, "step": "60s"},
    ).json()
    assert rng["data"]["resultType"] == "matrix"
    assert [p[0] for p in rng["data"]["result"][0]["values"]] == [t + 60 * i for i in range(6)]
    series = http.get(f"/promql/{NAME}/api/v1/series", params={"match[]": 'up{job="db"}'}).json()
    assert sorted(s["instance"] for s in series["data"]) == ["a:1", "b:1", "c:1"]
    assert all(s["__name__"] == "up" and s["_ns_"] == "db" for s in series["data"])
    labels = http.get(f"/promql/{NAME}/api/v1/labels").json()["data"]
    assert {"__name__", "_ns_", "_ws_", "code", "instance", "job", "version"} <= set(labels)
    values = http.get(f"/promql/{NAME}/api/v1/label/__name__/values").json()["data"]
    assert values == ["build_info", "http_requests_total", "temperature", "up"]
    for params, status, error_type, message in [
        ({"query": "sum(up"}, 400, "bad_data", "parse error"),
        # Valid PromQL FiloPy does not evaluate: 501, as the compliance tester counts it.
        ({"query": "up + fill(0) up"}, 501, "unsupported", "unsupported: fill modifiers"),
        ({"query": "up", "time": "yesterday"}, 400, "bad_data", 'invalid parameter "time"'),
        ({}, 400, "bad_data", 'invalid parameter "query": required'),
        ({"query": "up", "spread": "9"}, 400, "bad_data", "spread"),
    ]:
        resp = http.get(f"/promql/{NAME}/api/v1/query", params=params)
        err = resp.json()
        assert resp.status_code == status, (params, err)
        assert err["status"] == "error" and err["errorType"] == error_type
        assert message in err["error"], (params, err)
    unknown = http.get("/promql/nope/api/v1/query", params={"query": "up"})
    assert unknown.status_code == 404


def test_promtool_queries_the_api(rest: Rest) -> None:
    # promtool comes from the Debian prometheus package (scripts/system-deps.sh, run by make test).
    assert shutil.which("promtool"), "promtool missing: run scripts/system-deps.sh"
    url = f"{rest.url}/promql/{NAME}"
    t = INSTANTS[1] / 1000

    def promtool(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["promtool", "query", *args], capture_output=True, text=True, timeout=60, check=False
        )

    out = promtool(
        "instant",
        "-o",
        "json",
        "--time",
        str(t),
        url,
        "sum by (job) (rate(http_requests_total[5m]))",
    )
    assert out.returncode == 0, out.stderr
    got = {r["metric"]["job"]: float(r["value"][1]) for r in json.loads(out.stdout)}
    expected = REF.evaluate(parse("sum by (job) (rate(http_requests_total[5m]))"), [INSTANTS[1]])
    assert got.keys() == {"api", "db"}
    for k, by_t in expected.items():
        assert math.isclose(got[dict(k)["job"]], by_t[INSTANTS[1]], rel_tol=1e-9)
    rng = promtool(
        "range",
        "-o",
        "json",
        "--start",
        str(t),
        "--end",
        str(t + 600),
        "--step",
        "2m",
        url,
        'max(temperature{job="db"})',
    )
    assert rng.returncode == 0, rng.stderr
    (series,) = json.loads(rng.stdout)
    times = [INSTANTS[1] + 120_000 * i for i in range(6)]
    expected = REF.evaluate(parse('max(temperature{job="db"})'), times)
    (want,) = expected.values()
    assert {round(float(p[0]) * 1000): float(p[1]) for p in series["values"]} == pytest.approx(want)


def test_unavailable_shards_fail_the_query_or_give_a_partial_result(
    rest: Rest, service: QueryService
) -> None:
    query = 'count(up{_ws_="demo", _ns_="api"})'
    plan = service.explain(NAME, query)
    stopped = plan["shards"][0]
    owner = service.shard_map(NAME).owner(stopped)
    assert owner is not None
    rest.client.stop_shards(NAME, [stopped])
    try:
        rest.wait_for("the shard stopped", lambda: not rest.all_active(NAME))
        rest.wait_for(
            "the query service saw it",
            lambda: str(service.shard_map(NAME).status(stopped)) != "Active",
        )
        status = str(service.shard_map(NAME).status(stopped))
        with pytest.raises(ShardsUnavailable, match=re.escape(f"{stopped} ({status})")):
            service.instant(NAME, query, INSTANTS[1], lookback_ms=LOOKBACK)
        part = service.instant(NAME, query, INSTANTS[1], lookback_ms=LOOKBACK, partial=True)
        assert part.warnings and f"{stopped} ({status})" in part.warnings[0]
        full = REF.evaluate(parse('count(up{job="api"})'), [INSTANTS[1]])
        (want,) = full.values()
        (row,) = part.value.values
        assert 0 <= row[0] < want[INSTANTS[1]] or np.isnan(row[0])
        resp = rest.http.get(
            f"/promql/{NAME}/api/v1/query", params={"query": query, "time": INSTANTS[1] / 1000}
        )
        assert resp.status_code == 503 and resp.json()["errorType"] == "unavailable"
        ok = rest.http.get(
            f"/promql/{NAME}/api/v1/query",
            params={"query": query, "time": INSTANTS[1] / 1000, "partial_response": "true"},
        ).json()
        assert ok["status"] == "success" and ok["warnings"]
    finally:
        rest.client.start_shards(NAME, owner, [stopped])
        rest.wait_for("active again", lambda: rest.all_active(NAME), 60)


def test_cli_query(rest: Rest, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from filopy.cli import app

    monkeypatch.setenv("FILOPY_RAY__NAMESPACE", rest.cluster.settings.ray.namespace)
    monkeypatch.setenv("COLUMNS", "200")
    runner = CliRunner()
    addr = ["--address", rest.cluster.ray.address]
    t = str(INSTANTS[1] / 1000)
    out = runner.invoke(app, ["query", NAME, "sum by (job) (up)", "--time", t, *addr])
    assert out.exit_code == 0, out.output
    expected = REF.evaluate(parse("sum by (job) (up)"), [INSTANTS[1]])
    for k, by_t in expected.items():
        assert f'{{job="{dict(k)["job"]}"}}' in out.output
        assert f"{by_t[INSTANTS[1]]:g}" in out.output
    assert "2 series;" in out.output
    as_json = runner.invoke(app, ["query", NAME, "sum(up)", "--time", t, "--json", *addr])
    assert json.loads(as_json.output)["data"]["resultType"] == "vector"
    ranged = runner.invoke(
        app, ["query", NAME, "sum(up)", "--start", t, "--end", str(float(t) + 600), *addr]
    )
    assert ranged.exit_code == 0 and "11 points" in ranged.output, ranged.output
    plan = runner.invoke(
        app, ["query", NAME, 'up{_ws_="demo", _ns_="db"}', "--explain", "--spread", "0", *addr]
    )
    assert len(json.loads(plan.output)["shards"]) == 1
    bad = runner.invoke(app, ["query", NAME, "sum(up", *addr])
    assert bad.exit_code == 1 and "error:" in bad.output and "Traceback" not in bad.output
