"""Dataset definitions: label limits are part of the contract, bounded so both stores are safe."""

from __future__ import annotations

import json
import pickle

import pytest
from pydantic import ValidationError

from core.dataset import (
    MAX_LABELS_PER_SERIES,
    MAX_SERIES_KEY_BYTES,
    Dataset,
    DatasetRef,
    LabelLimits,
)
from store.cassandra import _max_part_key_bytes


def test_default_limits_are_part_of_the_definition_and_round_trip() -> None:
    ds = Dataset(name="d", num_shards=4)
    assert ds.limits == LabelLimits(
        max_label_name_bytes=256,
        max_label_value_bytes=16_384,
        max_labels_per_series=64,
        max_series_key_bytes=32_768,
    )
    assert json.loads(ds.to_json())["limits"]["max_series_key_bytes"] == 32_768
    tight = ds.model_copy(update={"limits": LabelLimits(max_labels_per_series=8)})
    assert Dataset.from_json(tight.to_json()) == tight != ds


def test_a_definition_stored_before_limits_existed_gets_the_defaults() -> None:
    old = json.loads(Dataset(name="d", num_shards=4).to_json())
    del old["limits"]
    assert Dataset.from_json(json.dumps(old)).limits == LabelLimits()


@pytest.mark.parametrize(
    "limits",
    [
        {"max_label_name_bytes": 0},
        {"max_label_value_bytes": MAX_SERIES_KEY_BYTES + 1},
        {"max_labels_per_series": MAX_LABELS_PER_SERIES + 1},
        {"max_series_key_bytes": 65_535},
        {"max_series_key_bytes": 10},
        {"max_labels": 5},
    ],
)
def test_limits_outside_the_safe_bounds_are_refused(limits: dict[str, int]) -> None:
    with pytest.raises(ValidationError):
        Dataset.model_validate({"name": "d", "num_shards": 4, "limits": limits})


def test_the_schema_states_the_bounds() -> None:
    schema = LabelLimits.model_json_schema()["properties"]
    assert schema["max_series_key_bytes"]["maximum"] == MAX_SERIES_KEY_BYTES
    assert schema["max_labels_per_series"]["maximum"] == MAX_LABELS_PER_SERIES
    assert all("description" in p for p in schema.values())


def test_the_largest_series_key_fits_cassandras_key_for_the_longest_dataset_name() -> None:
    assert MAX_SERIES_KEY_BYTES <= _max_part_key_bytes("d" * 128) < 65_535


FULL = {
    "name": "full",
    "num_shards": 8,
    "min_num_nodes": 2,
    "shard_key_columns": ["_ws_", "_ns_", "_metric_"],
    "metric_column": "_metric_",
    "spread": {"default": 1, "overrides": [{"shard_key": {"_ws_": "w", "_ns_": "n"}, "spread": 3}]},
    "source": {"topic": "t", "bootstrap_servers": "kafka:9092", "record_format": "influx-line"},
    "store": {"groups_per_shard": 4, "flush_interval_s": 30, "chunk_span_ms": 600_000},
    "limits": {"max_labels_per_series": 32},
}


def test_strict_numbers_still_read_every_real_definition() -> None:
    # As the CLI and the Python client build it (Python lists and dicts), and as stored (JSON).
    ds = Dataset.model_validate(FULL)
    assert Dataset.from_json(ds.to_json()) == ds
    assert Dataset.model_validate_json(json.dumps(FULL)) == ds
    assert Dataset.model_validate(json.loads(ds.to_json())) == ds
    assert ds.store.flush_interval_s == 30.0  # an integer is a number where a float belongs


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"num_shards": "8"}, "num_shards"),
        ({"num_shards": 8.0}, "num_shards"),
        ({"min_num_nodes": True}, "min_num_nodes"),
        ({"min_num_nodes": 1e10}, "min_num_nodes"),
        ({"spread": {"default": "1"}}, "spread.default"),
        ({"store": {"flush_interval_s": "30"}}, "store.flush_interval_s"),
        ({"limits": {"max_labels_per_series": 32.0}}, "limits.max_labels_per_series"),
    ],
)
def test_numbers_are_not_coerced(change: dict, field: str) -> None:
    for text in (False, True):
        with pytest.raises(ValidationError) as e:
            body = {**FULL, **change}
            if text:
                Dataset.model_validate_json(json.dumps(body))
            else:
                Dataset.model_validate(body)
        assert [".".join(map(str, err["loc"])) for err in e.value.errors()] == [field]


def test_an_unset_bootstrap_is_the_clusters() -> None:
    unset = Dataset(name="d", num_shards=2)
    assert not unset.source.bootstrap_given
    held = unset.with_cluster_kafka("kafka:9092")
    assert held.source.bootstrap_servers == "kafka:9092" and held.source.bootstrap_given
    assert held.with_cluster_kafka("other:9092") == held  # filled once, kept
    assert Dataset.from_json(held.to_json()) == held  # as stored and read back
    assert pickle.loads(pickle.dumps(unset)).with_cluster_kafka("k:1").source.bootstrap_servers == (
        "k:1"  # the client's definition crosses Ray pickled: still unset on the other side
    )
    own = Dataset.model_validate(FULL)
    assert own.with_cluster_kafka("other:9092") == own


def test_a_dataset_ref_is_one_object_per_name_and_equal_by_name() -> None:
    import ray.cloudpickle

    ref = DatasetRef.of("metrics")
    assert Dataset(name="metrics", num_shards=2).ref is ref
    assert pickle.loads(pickle.dumps(ref)) is ref  # what a query channel frame carries
    assert ray.cloudpickle.loads(ray.cloudpickle.dumps(ref)) is ref  # and a Ray call
    other = DatasetRef(name="metrics")  # made directly: another object, the same ref
    assert other is not ref and other == ref and hash(other) == hash(ref)
    assert {(ref, 3): "x"}[(other, 3)] == "x"
    assert ref != DatasetRef.of("other") and ref != "metrics"
    with pytest.raises(ValueError, match="invalid dataset name"):
        DatasetRef.of("1-starts-with-a-digit")
