"""The decoder of a dataset's Kafka messages, by its record format.

The ingesters call `decoder_for(dataset)` and need not know the formats: FiloPy's binary batch
(`ingest.wire.binary_format`, also encoded by the gateway) and Influx line protocol
(`ingest.wire.line_protocol`). What every decoder enforces and how bad records are counted is in
`ingest.bad_records`.
"""

from __future__ import annotations

from collections.abc import Callable

from core.dataset import Dataset, RecordFormat
from ingest.bad_records import DEFAULT_TS_RANGE, Decoded, undecodable
from ingest.wire.binary_format import SeriesTables, decode_binary
from ingest.wire.line_protocol import decode_influx

Decoder = Callable[[bytes, int], Decoded]


def decoder_for(dataset: Dataset, ts_range: tuple[int, int] = DEFAULT_TS_RANGE) -> Decoder:
    """The dataset's decoder: `decode(message_value, message_timestamp_ms) -> Decoded`.
    A decoder keeps state (the series tables it has seen): one per consuming thread."""
    column, limits = dataset.metric_column, dataset.limits
    if dataset.source.record_format == RecordFormat.BINARY:
        tables = SeriesTables()

        def binary(data: bytes, _ts_ms: int) -> Decoded:
            return decode_binary(data, column, ts_range, limits, tables)

        return binary

    def influx(data: bytes, ts_ms: int) -> Decoded:
        try:
            return decode_influx(data, ts_ms, column, ts_range=ts_range, limits=limits)
        except Exception as e:  # a decoder bug must not stop ingestion (binary: in decode_binary)
            return undecodable(
                f"undecodable line protocol message ({len(data)} bytes): {type(e).__name__}: {e}"
            )

    return influx
