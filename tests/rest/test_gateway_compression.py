"""`[gateway] kafka_compression`: the HTTP gateway leaves the record format's bodies uncompressed
and lets the producer compress Kafka batches. Every codec the setting takes reaches the real
broker and reads back, through a consumer, as exactly the samples sent."""

from __future__ import annotations

import uuid
from typing import get_args

import httpx
import numpy as np
import pytest
from fastapi import FastAPI

from core.config import GatewaySettings
from core.dataset import Dataset, SourceSettings
from filopy.ingest_http import Ingestion
from filopy.ingest_http.app import serve_ingestion
from filopy.ingest_http.core import DEFAULT_SETTINGS
from ingest.topics import ensure_topic
from ingest.wire.binary_format import HEADER, decode_binary
from tests.ingest.test_gateway import _consume_all
from tests.rest.conftest import ServerThread

pytestmark = [pytest.mark.kafka]

T0 = 1_700_000_000_000
SHARDS = 2
CODECS = get_args(GatewaySettings.model_fields["kafka_compression"].annotation)


def test_the_codecs_are_every_one_the_producer_knows() -> None:
    assert set(CODECS) == {"none", "gzip", "snappy", "lz4", "zstd"}
    assert DEFAULT_SETTINGS.kafka_compression == "lz4"


@pytest.mark.parametrize("codec", CODECS)
def test_each_codec_writes_what_reads_back(kafka_bootstrap: str, codec: str) -> None:
    dataset = Dataset(
        name=f"codec{uuid.uuid4().hex[:8]}",
        num_shards=SHARDS,
        source=SourceSettings(bootstrap_servers=kafka_bootstrap),
    )
    ensure_topic(dataset, kafka_bootstrap)
    settings = DEFAULT_SETTINGS.model_copy(update={"kafka_compression": codec})
    app = FastAPI()
    serve_ingestion(app, Ingestion(lambda: [dataset], settings))
    lines = "\n".join(f"cpu,host=h{i} value={i}.25 {T0 + i}" for i in range(300))
    with ServerThread(app) as url:
        r = httpx.post(f"{url}/ingest/{dataset.name}/write?precision=ms", content=lines)
    assert r.status_code == 204, r.text

    messages = [value for _, value in _consume_all(dataset)]
    flags = {HEADER.unpack_from(m)[2] for m in messages}
    assert flags == {0}, "the bodies are left to the producer to compress"
    got = [decode_binary(m).batch for m in messages]
    values = np.sort(np.concatenate([b.values for b in got]))
    stamps = np.sort(np.concatenate([b.timestamps for b in got]))
    assert values.tolist() == [i + 0.25 for i in range(300)]
    assert stamps.tolist() == [T0 + i for i in range(300)]
