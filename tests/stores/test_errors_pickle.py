"""Store and topic errors survive pickling, as they must when Ray carries them to a caller."""

from __future__ import annotations

import pickle

from core.dataset import Dataset
from ingest.topics import TopicMismatch, TopicMissing
from store import DatasetConflict, StaleEpochError


def test_errors_round_trip_with_their_fields_and_message() -> None:
    a, b = Dataset(name="m", num_shards=4), Dataset(name="m", num_shards=8)
    for err in (
        DatasetConflict(a, b),
        StaleEpochError("m", 3, 1, 2),
        TopicMismatch("t", 8, 4),
        TopicMissing("t"),
    ):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err)
        assert str(back) == str(err)
        assert vars(back) == vars(err)


def test_a_dropped_cassandra_connection_is_an_outage_not_a_failure() -> None:
    """The flusher retries StoreUnavailable with backoff; any other StoreError stops the shard."""
    import pytest
    from cassandra.connection import ConnectionShutdown

    from store import StoreUnavailable
    from store.cassandra import _translate

    with pytest.raises(StoreUnavailable, match="connection lost"), _translate("writing chunks"):
        raise ConnectionShutdown("Connection to 127.0.0.1:9042 was closed")
