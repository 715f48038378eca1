"""The Prometheus HTTP API's shapes, without Ray or services: the real router and the real
`QueryService` over the fake map source and fake nodes of tests/query/test_service_fanout.py,
called over ASGI. What Grafana's Prometheus data source asks (buildinfo, metadata, exemplars,
format_query, label names and values, series with `match[]`, bounds and `limit`) and the errors
it must tell apart (501 `unsupported` vs 400 `bad_data`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio
import httpx
import pytest
from fastapi import FastAPI

from core.dataset import Dataset, DatasetRef
from filopy.rest.app import serve_promql
from filopy.rest.errors import install_handlers
from ingest.memstore import ShardMemstore
from query.executor import NodeQuery, ShardsNotHere, ShardSource, run_node_query
from query.service import QueryService
from store.api import LabelMatcher
from tests.ingest.test_memstore import batch
from tests.query.test_service_fanout import (
    DS,
    NODES,
    SERIES,
    Done,
    FakeMaps,
    FakeNodes,
    FakeSource,
    T,
    active_map,
)

END_S = (T + 39 * 15_000) / 1000  # the fake series' last sample, in seconds
METRICS = ["a", "b"]
INSTANCES = sorted({s.labels["instance"] for ss in SERIES.values() for s in ss})


class FakeClient:
    """What the router asks of the cluster client: its timeout and the datasets."""

    timeout_s = 5.0

    def datasets(self) -> list[Dataset]:
        return [DS]


class BoundedSource(FakeSource):
    """FakeSource whose `series` keeps only series with samples in [start, end], as
    ShardSource's does (test_shard_source_series_are_those_with_samples_in_the_bounds)."""

    def restricted(self, shards: Sequence[int]) -> BoundedSource:
        return BoundedSource([s for s in self.shards if s in shards], self.stats)

    def series(self, matchers: Sequence[LabelMatcher], start: int, end: int) -> list[dict]:
        return [x.labels for x in self.select(matchers, start, end) if len(x.ts)]


class BoundedNodes(FakeNodes):
    def submit(self, node: str, ref: DatasetRef, shards: Sequence[int], request: NodeQuery) -> Done:
        if any(s not in self.runs.get(node, []) for s in shards):
            return Done(error=ShardsNotHere(ref.name, node, list(shards)))
        return Done(run_node_query(request, BoundedSource(shards)))  # type: ignore[arg-type]


class Api:
    """Synchronous calls into the ASGI app (httpx's ASGITransport on a fresh event loop)."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        async def go() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://filopy") as c:
                return await c.request(method, path, **kw)

        return anyio.run(go)

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return self.request("GET", path, **kw)

    def post(self, path: str, **kw: Any) -> httpx.Response:
        return self.request("POST", path, **kw)


@pytest.fixture(scope="module")
def api() -> Api:
    app = FastAPI()
    install_handlers(app, FakeClient.timeout_s)
    service = QueryService(FakeMaps(active_map().snapshot()), BoundedNodes(NODES))
    serve_promql(app, FakeClient(), service)  # type: ignore[arg-type]
    return Api(app)


BASES = ["/api/v1", f"/promql/{DS.name}/api/v1"]


def ok(resp: httpx.Response) -> Any:
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["status"] == "success", body
    return body["data"]


def error(resp: httpx.Response) -> tuple[int, str, str]:
    body = resp.json()
    assert body["status"] == "error", body
    return resp.status_code, body["errorType"], body["error"]


@pytest.mark.parametrize("base", BASES)
def test_buildinfo_has_prometheus_fields_and_filopys_version(api: Api, base: str) -> None:
    info = ok(api.get(f"{base}/status/buildinfo"))
    for field in ("version", "revision", "branch", "buildUser", "buildDate", "goVersion"):
        assert isinstance(info[field], str), field
    # Grafana parses `version` as semver to pick features: a Prometheus 3 API level.
    assert [int(x) for x in info["version"].split(".")][:1] == [3]
    assert info["filopyVersion"] and info["filopyVersion"] in info["revision"]


@pytest.mark.parametrize("base", BASES)
def test_runtimeinfo_config_and_flags_have_prometheus_shapes(api: Api, base: str) -> None:
    info = ok(api.get(f"{base}/status/runtimeinfo"))
    assert info["startTime"].endswith("Z") and info["serverTime"] >= info["startTime"]
    assert info["reloadConfigSuccess"] is True and info["corruptionCount"] == 0
    assert isinstance(info["GOMAXPROCS"], int) and info["goroutineCount"] >= 1
    for field in ("CWD", "hostname", "lastConfigTime", "GOGC", "GODEBUG", "storageRetention"):
        assert isinstance(info[field], str), field
    config = ok(api.get(f"{base}/status/config"))
    assert list(config) == ["yaml"] and config["yaml"].startswith("#")
    assert ok(api.get(f"{base}/status/flags")) == {}


@pytest.mark.parametrize("base", BASES)
def test_metadata_is_valid_and_empty(api: Api, base: str) -> None:
    assert ok(api.get(f"{base}/metadata")) == {}
    assert ok(api.get(f"{base}/metadata", params={"metric": "a", "limit": "5"})) == {}
    assert ok(api.get(f"{base}/metadata", params={"limit_per_metric": "1"})) == {}
    assert error(api.get(f"{base}/metadata", params={"limit": "x"})) == (
        400,
        "bad_data",
        "limit must be a number",
    )


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("method", ["GET", "POST"])
def test_query_exemplars_is_empty_for_a_valid_query_and_checks_like_prometheus(
    api: Api, base: str, method: str
) -> None:
    def call(**p: str) -> httpx.Response:
        if method == "GET":
            return api.get(f"{base}/query_exemplars", params=p)
        return api.post(f"{base}/query_exemplars", data=p)

    assert ok(call(query="sum(rate(a[5m]))", start="1", end="2")) == []
    assert ok(call(query="a")) == []  # start and end are optional
    assert ok(call(query="a + fill(0) b")) == []  # valid PromQL FiloPy does not evaluate
    assert error(call(query="a{"))[:2] == (400, "bad_data")
    assert error(call(query=""))[:2] == (400, "bad_data")
    assert error(call(query="a", start="x"))[:2] == (400, "bad_data")
    assert error(call(query="a", start="2", end="1")) == (
        400,
        "bad_data",
        "end timestamp must not be before start timestamp",
    )


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("method", ["GET", "POST"])
def test_format_query_prettifies_any_valid_promql(api: Api, base: str, method: str) -> None:
    def call(query: str) -> httpx.Response:
        if method == "GET":
            return api.get(f"{base}/format_query", params={"query": query})
        return api.post(f"{base}/format_query", data={"query": query})

    assert ok(call("sum   by(job)(rate(a{x='y'}[5m]))")) == 'sum by (job) (rate(a{x="y"}[5m]))'
    assert ok(call("a+fill(0)b")).replace(" ", "").replace("\n", "") == "a+fill(0)b"
    status, kind, message = error(call("sum(a"))
    assert (status, kind) == (400, "bad_data") and message.startswith('invalid parameter "query"')


@pytest.mark.parametrize("base", BASES)
def test_label_names_and_values_over_the_whole_range(api: Api, base: str) -> None:
    assert ok(api.get(f"{base}/labels")) == ["__name__", "instance"]
    assert ok(api.get(f"{base}/label/__name__/values")) == METRICS
    assert ok(api.get(f"{base}/label/instance/values")) == INSTANCES
    assert ok(api.get(f"{base}/label/nope/values")) == []


@pytest.mark.parametrize("base", BASES)
def test_repeated_match_is_a_union_and_start_end_bound_it(api: Api, base: str) -> None:
    """Grafana's metric browser and variables send `match[]` (repeated) and the dashboard's
    range: a series counts when it has a sample inside [start, end]."""
    first, last = T / 1000, END_S
    match = {"match[]": ['a{instance="i0-0"}', 'b{instance="i1-1"}']}
    want = [{"__name__": "a", "instance": "i0-0"}, {"__name__": "b", "instance": "i1-1"}]
    assert ok(api.get(f"{base}/series", params=match)) == want
    assert ok(api.post(f"{base}/series", data=match)) == want
    assert ok(api.get(f"{base}/label/instance/values", params=match)) == ["i0-0", "i1-1"]
    assert ok(api.post(f"{base}/labels", data={"match[]": "a"})) == ["__name__", "instance"]
    for start, end, found in [
        (first, last, True),
        (last, last + 3600, True),  # the last sample is inside
        (first - 3600, first, True),  # the first sample is inside
        (last + 0.001, last + 3600, False),  # after every sample
        (first - 3600, first - 0.001, False),  # before every sample
    ]:
        bounds = {"start": str(start), "end": str(end)}
        expect_names = METRICS if found else []
        got = ok(api.get(f"{base}/label/__name__/values", params=bounds))
        assert got == expect_names, bounds
        assert ok(api.get(f"{base}/series", params={**match, **bounds})) == (want if found else [])
        assert ok(api.get(f"{base}/labels", params=bounds)) == (
            ["__name__", "instance"] if found else []
        )
    rfc = {"start": "2023-11-14T22:13:20Z", "end": "+Inf"}  # T is 2023-11-14T22:13:20Z
    assert ok(api.get(f"{base}/label/__name__/values", params=rfc)) == METRICS


@pytest.mark.parametrize("base", BASES)
def test_limit_truncates_with_prometheus_warning(api: Api, base: str) -> None:
    body = api.get(f"{base}/label/instance/values", params={"limit": "2"}).json()
    assert body["data"] == INSTANCES[:2]
    assert body["warnings"] == ["results truncated due to limit"]
    body = api.get(f"{base}/series", params={"match[]": "a", "limit": "3"}).json()
    assert len(body["data"]) == 3 and body["warnings"] == ["results truncated due to limit"]
    body = api.get(f"{base}/labels", params={"limit": "1"}).json()
    assert body["data"] == ["__name__"] and "warnings" in body
    body = api.get(f"{base}/labels", params={"limit": "2"}).json()  # exactly all: no warning
    assert body["data"] == ["__name__", "instance"] and "warnings" not in body
    assert ok(api.get(f"{base}/label/__name__/values", params={"limit": "0"})) == METRICS
    for bad in ("-1", "x"):
        assert error(api.get(f"{base}/labels", params={"limit": bad}))[:2] == (400, "bad_data")


@pytest.mark.parametrize("base", BASES)
def test_series_needs_match_and_valid_selectors(api: Api, base: str) -> None:
    assert error(api.get(f"{base}/series")) == (
        400,
        "bad_data",
        'invalid parameter "match[]": no match[] parameter provided',
    )
    assert error(api.get(f"{base}/series", params={"match[]": "sum(a)"}))[:2] == (
        400,
        "bad_data",
    )
    assert error(api.get(f"{base}/labels", params={"start": "x"}))[:2] == (400, "bad_data")
    # A valid selector FiloPy does not evaluate (Prometheus 3's `or` of matchers): 501.
    either = {"match[]": 'a{instance="i0-0" or instance="i1-0"}'}
    assert error(api.get(f"{base}/series", params=either))[:2] == (501, "unsupported")


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("path", ["/query", "/query_range"])
def test_valid_promql_filopy_does_not_evaluate_is_501_unsupported(
    api: Api, base: str, path: str
) -> None:
    """What the compliance tester counts as "unsupported": HTTP 501, errorType `unsupported`."""
    p = {"query": "a + fill(0) b", "time": str(END_S), "start": str(END_S - 60)}
    p |= {"end": str(END_S), "step": "15"}
    for resp in (api.get(base + path, params=p), api.post(base + path, data=p)):
        status, kind, message = error(resp)
        assert (status, kind) == (501, "unsupported") and "fill" in message


@pytest.mark.parametrize(
    ("path", "params", "status", "kind"),
    [
        ("/query", {"query": "sum(a"}, 400, "bad_data"),  # a syntax error stays bad_data
        ("/query", {"query": ""}, 400, "bad_data"),
        ("/query_range", {"query": "a", "start": "2", "end": "1", "step": "1"}, 400, "bad_data"),
        ("/query", {"query": "a + ignoring(instance) b"}, 422, "execution"),  # many-to-many
    ],
)
def test_other_query_errors_keep_prometheus_codes(
    api: Api, path: str, params: dict[str, str], status: int, kind: str
) -> None:
    params = {"time": str(END_S), **params}
    assert error(api.get(f"/api/v1{path}", params=params))[:2] == (status, kind)


def test_grafanas_panel_queries_answer(api: Api) -> None:
    """The save & test query and a panel's range query, as Grafana posts them."""
    health = ok(api.post("/api/v1/query", data={"query": "1+1", "time": str(END_S)}))
    assert health == {"resultType": "scalar", "result": [END_S, "2"]}
    rng = {"query": "sum by (__name__) (a)", "start": str(END_S - 300), "end": str(END_S)}
    matrix = ok(api.post("/api/v1/query_range", data={**rng, "step": "60"}))
    assert matrix["resultType"] == "matrix" and len(matrix["result"]) == 1
    assert len(matrix["result"][0]["values"]) == 6


def test_shard_source_series_are_those_with_samples_in_the_bounds() -> None:
    """The node side of /series, /labels and label values (a real memstore): a series counts
    when its first..last sample span meets [start, end], both ends inclusive."""
    ds = Dataset(name="bounds", num_shards=2)
    mem = ShardMemstore(ds, 0, groups_per_shard=1)
    early = {"_metric_": "m", "_ws_": "w", "_ns_": "n", "host": "early"}
    late = {**early, "host": "late"}
    mem.ingest(batch([(early, 1_000, 1.0), (early, 2_000, 2.0), (late, 5_000, 3.0)]), 0)
    source = ShardSource(ds, {0: mem}, None)  # type: ignore[arg-type]  # series: no store read
    name = [LabelMatcher("__name__", "=", "m")]

    def hosts(start: int, end: int) -> list[str]:
        return sorted(labels["host"] for labels in source.series(name, start, end))

    assert hosts(0, 10_000) == ["early", "late"]
    assert hosts(2_000, 5_000) == ["early", "late"]
    assert hosts(2_001, 4_999) == []
    assert hosts(1_500, 1_600) == ["early"]  # inside early's span, between its samples
    assert hosts(5_000, 5_000) == ["late"]
    assert source.series(name, 0, 10_000)[0]["__name__"] == "m"  # PromQL's name, not _metric_
