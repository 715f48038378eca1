"""Datasets over REST: create, read, list, delete; 400 per invalid field, 404, 409; envelopes."""

from __future__ import annotations

from typing import Any

import pytest

from core.dataset import Dataset, DatasetInvalid

pytestmark = pytest.mark.ray

DATASETS = "/api/v1/datasets"


def error_of(resp: Any, status: int, error_type: str) -> str:
    """Assert an error envelope with this status and type; return its message."""
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"status", "errorType", "error"}, body
    assert body["status"] == "error"
    assert body["errorType"] == error_type, body
    assert "Traceback" not in body["error"]
    return body["error"]


def test_create_read_list_delete(rest, name: str) -> None:
    definition = {"name": name, "num_shards": 4, "min_num_nodes": 2, "spread": {"default": 2}}
    created = rest.http.post(DATASETS, json=definition)
    assert created.status_code == 201, created.text
    assert created.headers["location"] == f"{DATASETS}/{name}"
    body = created.json()
    assert body["status"] == "success"
    assert body["data"]["name"] == name
    assert body["data"]["num_shards"] == 4
    assert body["data"]["spread"] == {"default": 2, "overrides": []}
    assert body["data"]["shard_key_columns"] == ["_ws_", "_ns_", "_metric_"]

    again = rest.http.post(DATASETS, json=definition)
    assert again.status_code == 200, again.text  # identical definition: idempotent
    assert again.json()["data"] == body["data"]

    got = rest.http.get(f"{DATASETS}/{name}")
    assert got.status_code == 200
    assert got.json() == {"status": "success", "data": body["data"]}
    listed = rest.http.get(DATASETS).json()["data"]
    assert body["data"] in listed
    assert name in rest.http.get("/api/v1/cluster").json()["data"]

    removed = rest.http.delete(f"{DATASETS}/{name}")
    assert removed.status_code == 200, removed.text
    assert removed.json() == {"status": "success", "data": {"name": name}}
    assert name not in rest.http.get("/api/v1/cluster").json()["data"]
    assert "unknown dataset" in error_of(rest.http.get(f"{DATASETS}/{name}"), 404, "not_found")
    assert "unknown dataset" in error_of(rest.http.delete(f"{DATASETS}/{name}"), 404, "not_found")


def test_full_definition_round_trips(rest, name: str) -> None:
    definition = {
        "name": name,
        "num_shards": 8,
        "min_num_nodes": 1,
        "shard_key_columns": ["_ws_", "_ns_", "_metric_"],
        "metric_column": "_metric_",
        "spread": {
            "default": 1,
            "overrides": [{"shard_key": {"_ws_": "demo", "_ns_": "big"}, "spread": 3}],
        },
        "source": {
            "topic": f"topic-{name}",
            "bootstrap_servers": "127.0.0.1:9092",
            "record_format": "influx-line",
        },
        "store": {
            "groups_per_shard": 4,
            "flush_interval_s": 30.0,
            "max_chunk_samples": None,
            "chunk_span_ms": 600_000,
            "memory_retention_ms": None,
        },
        "limits": {
            "max_label_name_bytes": 128,
            "max_label_value_bytes": 4096,
            "max_labels_per_series": 32,
            "max_series_key_bytes": 16_384,
        },
    }
    resp = rest.http.post(DATASETS, json=definition)
    assert resp.status_code == 201, resp.text
    assert resp.json()["data"] == definition
    assert rest.http.get(f"{DATASETS}/{name}").json()["data"] == definition
    rest.http.delete(f"{DATASETS}/{name}")


def test_same_name_other_definition_is_409(rest, name: str) -> None:
    assert rest.http.post(DATASETS, json={"name": name, "num_shards": 4}).status_code == 201
    message = error_of(
        rest.http.post(DATASETS, json={"name": name, "num_shards": 8}), 409, "conflict"
    )
    assert f"dataset {name!r} already exists with a different definition" in message
    assert '"num_shards":4' in message and '"num_shards":8' in message
    # The stored definition is untouched.
    assert rest.http.get(f"{DATASETS}/{name}").json()["data"]["num_shards"] == 4
    rest.http.delete(f"{DATASETS}/{name}")


OVERRIDE = {"shard_key": {"_ws_": "w", "_ns_": "n"}, "spread": 1}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_shards": 3}, "num_shards must be a power of two, got 3"),
        ({"num_shards": 12}, "num_shards must be a power of two, got 12"),
        ({"num_shards": 0}, "num_shards: Input should be greater than or equal to 1"),
        ({"num_shards": 1 << 17}, "num_shards: Input should be less than or equal to 65536"),
        ({"num_shards": "many"}, "num_shards: Input should be a valid integer"),
        # Strict numbers: a string, a boolean or a float is refused, never coerced.
        ({"num_shards": "8"}, "num_shards: Input should be a valid integer"),
        ({"num_shards": 8.0}, "num_shards: Input should be a valid integer"),
        ({"num_shards": True}, "num_shards: Input should be a valid integer"),
        ({"min_num_nodes": 1e10}, "min_num_nodes: Input should be a valid integer"),
        ({"min_num_nodes": "2"}, "min_num_nodes: Input should be a valid integer"),
        ({"spread": {"default": "1"}}, "spread.default: Input should be a valid integer"),
        (
            {"spread": {"overrides": [{**OVERRIDE, "spread": True}]}},
            "spread.overrides[0].spread: Input should be a valid integer",
        ),
        ({"store": {"groups_per_shard": 2.0}}, "store.groups_per_shard: Input should be a valid"),
        ({"store": {"flush_interval_s": "30"}}, "store.flush_interval_s: Input should be a valid"),
        (
            {"limits": {"max_labels_per_series": "64"}},
            "limits.max_labels_per_series: Input should be a valid integer",
        ),
        ({"num_shards": None}, "num_shards: Input should be a valid integer"),
        ({"name": "1st"}, "invalid dataset name '1st': use 1-128 characters, a letter first"),
        ({"name": "a b"}, "invalid dataset name 'a b'"),
        ({"name": "x" * 129}, "invalid dataset name"),
        ({"min_num_nodes": 0}, "min_num_nodes: Input should be greater than or equal to 1"),
        (
            # A node of the dataset holds at least one shard: more nodes can never be used.
            {"min_num_nodes": 16},
            "min_num_nodes is 16, more than num_shards (8): a node of the dataset holds at least "
            "one shard, so it can be spread over at most 8 nodes",
        ),
        ({"min_num_nodes": 10**10}, "min_num_nodes is 10000000000, more than num_shards (8)"),
        (
            {"shard_key_columns": ["_ws_", "_ns_"]},
            "shard_key_columns ['_ws_', '_ns_'] must include the metric column '_metric_'",
        ),
        (
            {"shard_key_columns": ["_ws_", "_ws_", "_metric_"]},
            "shard_key_columns must be distinct, non-empty names",
        ),
        ({"shard_key_columns": "_ws_"}, "shard_key_columns: Input should be a valid tuple"),
        ({"metric_column": "m"}, "must include the metric column 'm'"),
        ({"spread": {"default": -1}}, "spread.default: Input should be greater than or equal to 0"),
        (
            {"spread": {"default": 4}},
            "spread.default is 4, but with 8 shards spread must be between 0 and 3",
        ),
        ({"spread": {"default": "wide"}}, "spread.default: Input should be a valid integer"),
        (
            {"spread": {"overrides": [{**OVERRIDE, "spread": 9}]}},
            "spread.overrides[0] is 9, but with 8 shards spread must be between 0 and 3",
        ),
        (
            {"spread": {"overrides": [{"shard_key": {"_ws_": "w"}, "spread": 1}]}},
            "spread.overrides[0].shard_key must name exactly the non-metric shard key columns "
            "['_ns_', '_ws_'], got ['_ws_']",
        ),
        (
            {"spread": {"overrides": [OVERRIDE, OVERRIDE]}},
            "spread.overrides[1] repeats shard key",
        ),
        (
            {"spread": {"overrides": [{"shard_key": {"_ws_": "w", "_ns_": "n"}}]}},
            "spread.overrides[0].spread: required",
        ),
        ({"spread": {"width": 2}}, "unknown field 'spread.width'"),
        (
            {"source": {"record_format": "xml"}},
            "source.record_format: Input should be 'filopy-binary' or 'influx-line'",
        ),
        ({"source": {"bootstrap_servers": 9092}}, "source.bootstrap_servers: Input should be"),
        ({"source": {"partitions": 8}}, "unknown field 'source.partitions'"),
        ({"replicas": 3}, "unknown field 'replicas'"),
        (
            {"store": {"groups_per_shard": 0}},
            "store.groups_per_shard: Input should be greater than or equal to 1",
        ),
        ({"store": {"flush_interval_s": -1}}, "store.flush_interval_s: Input should be greater"),
        ({"store": {"ttl": 5}}, "unknown field 'store.ttl'"),
        (
            # Valid on its own, but more than this cluster's store.max_chunk_span_ms.
            {"store": {"chunk_span_ms": 10 * 86_400_000}},
            "store.chunk_span_ms is 864000000, more than this cluster's store.max_chunk_span_ms "
            "(86400000): queries would miss such chunks",
        ),
    ],
)
def test_each_invalid_field_is_a_400_naming_it(rest, name: str, change: dict, message: str) -> None:
    body = {"name": name, "num_shards": 8, **change}
    if body["num_shards"] is None:
        del body["num_shards"]
        message = "num_shards: required"
    error = error_of(rest.http.post(DATASETS, json=body), 400, "bad_data")
    assert message in error, error
    assert name not in rest.http.get("/api/v1/cluster").json()["data"]


def test_numbers_in_a_definition_may_be_json_numbers_of_either_kind(rest, name: str) -> None:
    # A float setting given as a JSON integer is still a number: accepted, stored as a float.
    body = {"name": name, "num_shards": 2, "store": {"flush_interval_s": 30}}
    resp = rest.http.post(DATASETS, json=body)
    assert resp.status_code == 201, resp.text
    assert resp.json()["data"]["store"]["flush_interval_s"] == 30.0
    rest.http.delete(f"{DATASETS}/{name}")


@pytest.mark.parametrize(
    ("action", "body", "message"),
    [
        ("stopshards", {"shardList": [True]}, "shardList[0]: Input should be a valid integer"),
        ("stopshards", {"shardList": ["1"]}, "shardList[0]: Input should be a valid integer"),
        ("stopshards", {"shardList": [1.0]}, "shardList[0]: Input should be a valid integer"),
        ("stopshards", {"shardList": "1"}, "shardList: Input should be a valid list"),
        ("startshards", {"shardList": [True]}, "shardList[0]: Input should be a valid integer"),
        ("startshards", {"address": 7, "shardList": [1]}, "address: Input should be a valid str"),
    ],
)
def test_loosely_typed_shard_requests_are_400_and_change_nothing(
    rest, name: str, action: str, body: dict, message: str
) -> None:
    created = rest.http.post(DATASETS, json={"name": name, "num_shards": 2})
    assert created.status_code == 201, created.text
    try:
        rest.wait_for("all shards active", lambda: rest.all_active(name))
        before = rest.client.shard_map(name)
        if action == "startshards":
            body = {"address": rest.nodes[0], **body}
        resp = rest.http.post(f"/api/v1/cluster/{name}/{action}", json=body)
        assert message in error_of(resp, 400, "bad_data")
        after = rest.client.shard_map(name)
        assert after.statuses == before.statuses and after.is_healthy()
    finally:
        rest.http.delete(f"{DATASETS}/{name}")


def test_the_python_client_is_refused_a_dataset_the_cluster_cannot_hold(rest, name) -> None:
    with pytest.raises(DatasetInvalid, match="min_num_nodes is 3, more than num_shards"):
        rest.client.setup_dataset(Dataset(name=name, num_shards=2, min_num_nodes=3))
    assert name not in rest.http.get("/api/v1/cluster").json()["data"]


def test_several_invalid_fields_are_all_named(rest) -> None:
    error = error_of(
        rest.http.post(DATASETS, json={"name": "9", "num_shards": 0, "min_num_nodes": -1}),
        400,
        "bad_data",
    )
    assert "invalid dataset name '9'" in error
    assert "num_shards: Input should be greater than or equal to 1" in error
    assert "min_num_nodes: Input should be greater than or equal to 1" in error


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "a JSON request body is required"),
        ({"content": b"{nope", "headers": {"content-type": "application/json"}}, "not valid JSON"),
        ({"json": [1, 2]}, "the request body must be a JSON object"),
        (
            {"content": b"name=x", "headers": {"content-type": "text/plain"}},
            "must be a JSON object",
        ),
    ],
)
def test_malformed_bodies_are_400(rest, kwargs: dict, message: str) -> None:
    assert message in error_of(rest.http.post(DATASETS, **kwargs), 400, "bad_data")


def test_unknown_dataset_is_404_everywhere(rest) -> None:
    ds = "nosuchdataset"
    for method, path, body in [
        ("GET", f"{DATASETS}/{ds}", None),
        ("DELETE", f"{DATASETS}/{ds}", None),
        ("GET", f"/api/v1/cluster/{ds}/status", None),
        ("GET", f"/api/v1/cluster/{ds}/statusByAddress", None),
        ("GET", f"/api/v1/cluster/{ds}/events", None),
        ("POST", f"/api/v1/cluster/{ds}/startshards", {"address": "n", "shardList": [0]}),
        ("POST", f"/api/v1/cluster/{ds}/stopshards", {"shardList": [0]}),
    ]:
        resp = rest.http.request(method, path, json=body)
        assert error_of(resp, 404, "not_found") == f"unknown dataset {ds!r}", (method, path)


def test_an_invalid_name_in_the_path_is_400(rest) -> None:
    for path in [f"{DATASETS}/9lives", "/api/v1/cluster/-x/status", "/api/v1/cluster/a.b/events"]:
        assert "invalid dataset name" in error_of(rest.http.get(path), 400, "bad_data"), path


def test_unknown_endpoints_and_methods_are_enveloped(rest) -> None:
    assert error_of(rest.http.get("/api/v1/nothing"), 404, "not_found") == "no such endpoint"
    assert error_of(rest.http.put(DATASETS), 405, "method_not_allowed") == "Method Not Allowed"


def test_openapi_and_docs_are_served(rest) -> None:
    docs = rest.http.get("/docs")
    assert docs.status_code == 200 and "swagger" in docs.text.lower()
    schema = rest.http.get("/openapi.json").json()
    paths = schema["paths"]
    assert {
        "/api/v1/datasets",
        "/api/v1/datasets/{ds}",
        "/api/v1/cluster",
        "/api/v1/cluster/{ds}/status",
        "/api/v1/cluster/{ds}/statusByAddress",
        "/api/v1/cluster/{ds}/startshards",
        "/api/v1/cluster/{ds}/stopshards",
        "/api/v1/cluster/{ds}/events",
        "/__health",
        "/__liveness",
        "/metrics",
    } <= set(paths)
    # Request validation is documented as the 400 it is, not FastAPI's default 422.
    for item in paths.values():
        for op in item.values():
            assert "422" not in op["responses"]
    assert "400" in paths["/api/v1/datasets"]["post"]["responses"]
    assert "409" in paths["/api/v1/datasets"]["post"]["responses"]
