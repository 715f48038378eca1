"""Property-based run of the whole API from its own OpenAPI schema (schemathesis).

Generated requests, valid and invalid, hit the real server and cluster; every response must be a
documented status with a body matching its documented schema (never a 5xx). Random names and
node ids would almost never find a dataset or a node, so the test narrows the schema it generates
from to a few real ones: the requests then reach past validation into the cluster.
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

import pytest
import schemathesis
import schemathesis.specs.openapi.schemas  # imported at collection: see below
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import (
    negative_data_rejection,
    not_a_server_error,
    positive_data_acceptance,
)

from coordinator.messages import RejectReason
from tests.rest.conftest import Rest

pytestmark = pytest.mark.ray
# schemathesis' OpenAPI loader is imported above, at collection, rather than lazily by
# `from_dict` mid-run: pytest rewrites the modules of packages with a pytest plugin entry point
# as they are imported, and CPython 3.11.7's AST constructor can fail spuriously when that happens
# in a process full of threads (python/cpython#106905: "AST constructor recursion depth
# mismatch", seen in a full run).

EXAMPLES = 25  # per operation and generation mode
REASONS = {r.value for r in RejectReason}
# The Prometheus API's parameters: a few valid values and a bad one each.
QUERY_VALUES: dict[str, dict[str, Any]] = {
    "query": {"type": "string", "enum": ["sum(up)", "rate(up[5m])", "up", "sum(up"]},
    "time": {"type": "string", "enum": ["1700000000", "2023-11-14T22:13:20Z", "never"]},
    "start": {"type": "string", "enum": ["1700000000", "2023-11-14T22:13:20Z"]},
    "end": {"type": "string", "enum": ["1700000600"]},
    "step": {"type": "string", "enum": ["60", "1m"]},
    "match[]": {
        "type": "array",
        "items": {"type": "string", "enum": ["up", '{job="a"}', "{"]},
        "minItems": 1,
        "maxItems": 2,  # longer lists nearly always hold the bad one: the call never succeeds
    },
    "spread": {"type": "integer", "enum": [0, 1, 9]},
}


def narrowed(raw: dict[str, Any], datasets: list[str], nodes: list[str]) -> dict[str, Any]:
    schema = copy.deepcopy(raw)
    generated = ["gen0", "gen1", "gen2"]
    for item in schema["paths"].values():
        for method, op in item.items():
            # Deleting only generated datasets keeps `datasets` for the operations after it.
            names = generated if method == "delete" else [*datasets, *generated]
            for p in op.get("parameters", []):
                if p["name"] == "ds":
                    p["schema"] = {"type": "string", "enum": [*names, "nosuchdataset"]}
                elif p["name"] == "node":  # the drain API: the cluster's own nodes
                    p["schema"] = {"type": "string", "enum": [*nodes, "nobody"]}
                elif p["name"] == "dataset":  # the query API: mostly the dataset that exists
                    p["schema"] = {"type": "string", "enum": [*datasets, "nosuchdataset"]}
                elif p["name"] in QUERY_VALUES:
                    p["schema"] = QUERY_VALUES[p["name"]]
    c = schema["components"]["schemas"]
    props = c["Dataset"]["properties"]
    props["name"]["enum"] = [*generated, datasets[0]]
    shard_counts = [1, 2, 4, 8]  # small and valid
    props["num_shards"] = {"type": "integer", "enum": shard_counts}
    # At most the cluster's store.max_chunk_span_ms (a runtime limit the schema cannot state).
    c["StoreOptions"]["properties"]["chunk_span_ms"] = {
        "anyOf": [{"type": "integer", "minimum": 1, "maximum": 86_400_000}, {"type": "null"}]
    }
    c["StartShardsRequest"]["properties"]["address"]["enum"] = [*nodes, "nobody"]
    for request in ("StartShardsRequest", "StopShardsRequest"):
        shard_list = c[request]["properties"]["shardList"]
        # Past the last shard of the largest dataset generated: invalid for every dataset (a
        # smaller bound would call a valid shard of a larger generated dataset invalid).
        shard_list["items"]["maximum"] = max(shard_counts) - 1
        shard_list["maxItems"] = 2
    return schema


def test_api_conforms_to_its_schema(rest: Rest) -> None:
    """Per operation, valid and invalid requests; all checks but positive_data_acceptance, as
    schema-valid yet refused definitions (3 shards, spread 5 of 4 shards) are rightly a 400."""
    assert rest.http.post("/api/v1/datasets", json={"name": "seed", "num_shards": 4}).is_success
    raw = rest.http.get("/openapi.json").json()
    schema = schemathesis.openapi.from_dict(narrowed(raw, ["seed"], rest.nodes))
    # The event stream never ends by itself; tests/rest/test_cluster.py covers it.
    schema = schema.exclude(path="/api/v1/cluster/{ds}/events")
    answers: Counter[tuple[str, int, str | None]] = Counter()
    failures: dict[str, BaseException] = {}
    operations = [result.ok() for result in schema.get_all_operations()]
    # Stop before start (so some shards are free to start), delete last.
    operations.sort(key=lambda op: (op.method == "delete", op.path.endswith("/startshards")))
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            def check(case: Any) -> None:
                # /__health answers 503 by design when a shard is not live (it is documented).
                health = case.operation.path == "/__health"
                excluded = [positive_data_acceptance, *([not_a_server_error] if health else [])]
                if (
                    "api/v1/" in case.operation.path
                    and not case.operation.path.startswith("/api/v1/datasets")
                    and "/cluster" not in case.operation.path
                ):
                    # The query API's parameters are free-form strings (narrowed above only to
                    # reach the cluster): a value outside the narrowed enum may well be valid.
                    excluded.append(negative_data_rejection)
                response = case.call_and_validate(base_url=rest.url, excluded_checks=excluded)
                body = response.json() if response.status_code >= 400 else {}
                answers[(case.operation.label, response.status_code, body.get("errorType"))] += 1

            try:
                check()
            except Unsatisfiable:
                assert mode is GenerationMode.NEGATIVE  # no parameters: nothing to get wrong
            except Exception as e:
                failures[f"{operation.label} ({mode.value})"] = e
    assert not failures, "\n\n".join(f"{k}:\n{v}" for k, v in failures.items())
    assert not [k for k in answers if k[1] >= 500 and k[0] != "GET /__health"], answers
    # The narrowing worked: requests got past validation into the cluster. Every operation
    # succeeded at least once, except the shard requests, which random shard lists rarely get
    # right: for them, the shard manager's own verdicts (its rejection reasons) count as well.
    reached = {label for label, status, kind in answers if status < 300 or kind in REASONS}
    # Remote-write bodies (snappy protobuf) are never generated: tests/rest/test_remote_write.py.
    unreached = {"GET /__health", "POST /ingest/{dataset}/api/v1/write"}
    # Auth is off on this cluster (tests/cluster.py), so the token operations answer 404;
    # tests/rest/test_auth_clients.py runs schemathesis with auth on and reaches them.
    unreached |= {"GET /api/v1/tokens", "POST /api/v1/tokens", "DELETE /api/v1/tokens/{token_id}"}
    # delete_series takes its selectors as a form body the narrowed strategies do not fill with
    # valid PromQL: it answers 400 here (never a 5xx); tests/rest/test_delete_series.py runs it.
    unreached |= {
        f"{method} /promql/{{dataset}}/api/v1/admin/tsdb/delete_series"
        for method in ("POST", "PUT")
    }
    assert {op.label for op in operations} - unreached <= reached, sorted(answers.items())
