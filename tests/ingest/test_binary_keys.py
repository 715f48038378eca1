"""The binary decoder keys each series by its bytes in the message's series table: equal keys,
equal labels, across messages; the memstore finds known series by them."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from core.dataset import Dataset, SpreadSettings
from ingest.batch import KeyedBatch, SampleBatch
from ingest.memstore import ShardMemstore
from ingest.wire.binary_format import decode_binary, encode_binary

_text = st.text(st.characters(exclude_characters="\x00", codec="utf-8"), min_size=1, max_size=6)
_labels = st.dictionaries(_text, _text, max_size=4).map(lambda d: {"_metric_": "m", **d})


@settings(max_examples=80)
@given(first=st.lists(_labels, min_size=1, max_size=6), second=st.lists(_labels, max_size=6))
def test_keys_are_equal_exactly_when_labels_are(first: list, second: list) -> None:
    decoded = []
    for series in (first, first + second):
        n = len(series)
        batch = SampleBatch(
            series, np.arange(n, dtype=np.int32), np.arange(n, dtype=np.int64), np.ones(n)
        )
        out = decode_binary(encode_binary(batch)).batch
        assert isinstance(out, KeyedBatch) and len(out.keys) == len(out.series)
        assert out.series == series  # labels (in their order) come back
        decoded.append(out)
    pairs = [
        (k, tuple(lb.items())) for b in decoded for k, lb in zip(b.keys, b.series, strict=True)
    ]
    for k1, l1 in pairs:
        for k2, l2 in pairs:
            assert (k1 == k2) == (l1 == l2)


def test_the_memstore_finds_known_series_of_binary_messages_by_key() -> None:
    ds = Dataset(name="keys", num_shards=1, spread=SpreadSettings(default=0))
    series = [{"_metric_": "m", "i": str(i)} for i in range(50)]
    mem = ShardMemstore(ds, 0)
    for k in range(3):
        batch = SampleBatch(
            series[k:] + series[:k],  # the same series in another order each message
            np.arange(50, dtype=np.int32),
            np.full(50, 1000 * (k + 1), np.int64),
            np.full(50, float(k)),
        )
        mem.ingest(decode_binary(encode_binary(batch)).batch, k)
    assert mem.num_series == 50
    for i, labels in enumerate(series):
        sid = mem.series_id(labels)
        assert sid is not None, i
        ts, vals = mem.samples(sid)
        assert ts.tolist() == [1000, 2000, 3000] and vals.tolist() == [0.0, 1.0, 2.0]
