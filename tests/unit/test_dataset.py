"""Dataset definitions: label limits are part of the contract, bounded so both stores are safe."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from filopy.dataset import (
    MAX_LABELS_PER_SERIES,
    MAX_SERIES_KEY_BYTES,
    Dataset,
    LabelLimits,
)
from filopy.store.cassandra import _max_part_key_bytes


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
