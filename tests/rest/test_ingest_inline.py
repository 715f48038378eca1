"""Where a write request is handled (`Ingestion._inline`): a common request on the event loop,
one that could wait (its sending, or all of it) on a thread. Every way writes exactly the
samples sent to the real Kafka and answers alike; the way is seen by which work reached
`anyio.to_thread.run_sync`."""

from __future__ import annotations

import gzip
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import anyio.to_thread
import httpx
import pytest
from fastapi import FastAPI

from core.dataset import Dataset, SourceSettings
from filopy.ingest_http import Ingestion, core
from filopy.ingest_http.app import serve_ingestion
from filopy.ingest_http.core import DEFAULT_SETTINGS, Definitions
from ingest.topics import ensure_topic
from tests.rest.conftest import ServerThread, topic_batches

T0 = 1_700_000_000_000
Sample = tuple[tuple[tuple[str, str], ...], int, float]


def _lines(n: int, first: int) -> bytes:
    return "\n".join(f"cpu,host=h{i} value={i}.25 {T0 + first + i}" for i in range(n)).encode()


def _sent(n: int, first: int) -> list[Sample]:
    return sorted(
        ((("_metric_", "cpu"), ("host", f"h{i}")), T0 + first + i, i + 0.25) for i in range(n)
    )


def _topic_samples(ds: Dataset) -> list[Sample]:
    """Every sample in the dataset's topic, read straight from Kafka."""
    return sorted(
        (tuple(sorted(b.series[i].items())), int(t), float(v))
        for b in topic_batches(ds)
        for i, t, v in zip(b.series_idx, b.timestamps, b.values, strict=True)
    )


class _Served:
    """A gateway app on a real uvicorn server, writing to a fresh dataset's topic, and the
    work its requests handed to threads."""

    def __init__(self, url: str, ingestion: Ingestion, dataset: Dataset) -> None:
        self.url, self.ingestion, self.dataset = url, ingestion, dataset
        self.threaded: list[str] = []  # names of the functions run on a thread

    def warm(self) -> None:
        """A first request: the definitions read, the producer made (on threads)."""
        assert self.post(_lines(5, 0)).status_code == 204
        self.threaded.clear()

    def post(self, body: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
        with httpx.Client(base_url=self.url, timeout=60) as http:
            path = f"/ingest/{self.dataset.name}/write?precision=ms"
            return http.post(path, content=body, headers=headers)


@pytest.fixture
def served(kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[_Served]:
    ds = Dataset(
        name=f"inline{uuid.uuid4().hex[:8]}",
        num_shards=2,
        source=SourceSettings(bootstrap_servers=kafka_bootstrap),
    )
    ensure_topic(ds, kafka_bootstrap)
    app = FastAPI()
    ingestion = Ingestion(lambda: [ds], DEFAULT_SETTINGS)
    serve_ingestion(app, ingestion)
    real = anyio.to_thread.run_sync
    with ServerThread(app) as url:
        s = _Served(url, ingestion, ds)

        async def spy(fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
            s.threaded.append(getattr(fn, "__name__", repr(fn)))
            return await real(fn, *args, **kw)

        monkeypatch.setattr(anyio.to_thread, "run_sync", spy)
        yield s


@pytest.mark.kafka
def test_a_common_request_is_handled_on_the_event_loop(served: _Served) -> None:
    first = served.post(_lines(50, 0))  # reads the definitions, makes the producer
    assert first.status_code == 204, first.text
    assert served.threaded == ["blocking"]
    served.threaded.clear()
    again = served.post(_lines(50, 1000))
    assert again.status_code == 204, again.text
    assert served.threaded == []
    assert _topic_samples(served.dataset) == sorted(_sent(50, 0) + _sent(50, 1000))


@pytest.mark.kafka
def test_a_large_body_is_handled_on_a_thread(
    served: _Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    served.warm()
    monkeypatch.setattr(core, "INLINE_BYTES", 1000)
    big = served.post(_lines(200, 1000))  # ~7 KB
    assert big.status_code == 204, big.text
    assert served.threaded == ["blocking"]
    assert _topic_samples(served.dataset) == sorted(_sent(5, 0) + _sent(200, 1000))


@pytest.mark.kafka
def test_a_body_over_the_bound_once_decompressed_is_handled_on_a_thread(
    served: _Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    served.warm()
    body = _lines(300, 1000)
    monkeypatch.setattr(core, "INLINE_BYTES", len(body) - 1)
    r = served.post(gzip.compress(body), {"Content-Encoding": "gzip"})
    assert r.status_code == 204, r.text
    assert served.threaded == ["blocking"]
    assert _topic_samples(served.dataset) == sorted(_sent(5, 0) + _sent(300, 1000))


@pytest.mark.kafka
def test_a_busy_producer_sends_from_a_thread(served: _Served) -> None:
    """Another request sending holds the dataset's producer: this one is decoded on the event
    loop, and waits for the producer on a thread (the event loop never waits for it)."""
    served.warm()
    shared = served.ingestion.pool._shared[served.dataset.name]
    held = threading.Event()

    def hold() -> None:  # until the request below has gone to a thread
        with shared.lock:
            held.set()
            deadline = time.monotonic() + 30
            while "write" not in served.threaded and time.monotonic() < deadline:
                time.sleep(0.01)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    try:
        with httpx.Client(base_url=served.url, timeout=60) as http:
            alive = http.get(f"/ingest/{served.dataset.name}/ping")  # the loop is free
        assert alive.status_code == 204 and shared.lock.locked()
        served.threaded.clear()
        r = served.post(_lines(40, 1000))
    finally:
        holder.join()
    assert r.status_code == 204, r.text
    assert served.threaded == ["write"]
    assert _topic_samples(served.dataset) == sorted(_sent(5, 0) + _sent(40, 1000))


@pytest.mark.kafka
def test_a_backlog_for_kafka_sends_from_a_thread(
    served: _Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Messages queued for Kafka past the bound (a full queue blocks `produce`)."""
    served.warm()
    monkeypatch.setattr(core, "INLINE_BACKLOG", -1)
    assert served.post(_lines(30, 1000)).status_code == 204
    assert served.threaded == ["write"]
    assert _topic_samples(served.dataset) == sorted(_sent(5, 0) + _sent(30, 1000))


@pytest.mark.kafka
def test_stale_definitions_are_read_on_a_thread(served: _Served) -> None:
    served.warm()
    served.ingestion.definitions._read_at = -float("inf")  # as after the TTL
    assert served.post(_lines(30, 1000)).status_code == 204
    assert served.threaded == ["blocking"]
    assert _topic_samples(served.dataset) == sorted(_sent(5, 0) + _sent(30, 1000))


@pytest.mark.kafka
def test_bad_requests_are_answered_alike_on_either_way(
    served: _Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    served.warm()
    bad = b"cpu,host=a value=1 " + str(T0).encode() + b"\nnot line protocol\n"
    inline = served.post(bad)
    monkeypatch.setattr(core, "INLINE_BYTES", 0)
    threaded = served.post(bad)
    assert inline.status_code == threaded.status_code == 400
    assert inline.json() == threaded.json()
    assert "not line protocol" in inline.json()["error"]


def test_definitions_at_hand_never_wait() -> None:
    ds = Dataset(name="d", num_shards=2)
    loads = []
    defs = Definitions(lambda: loads.append(1) or [ds], ttl_s=60)
    assert defs.at_hand("d") is None and not loads  # never read yet: no reading here
    assert defs.get("d") == ds and len(loads) == 1
    assert defs.at_hand("d") == ds
    assert defs.at_hand("other") is None  # `get` would read again at once: not at hand
    with defs._lock:  # another thread reading the store
        assert defs.at_hand("d") is None
    defs._read_at -= 61
    assert defs.at_hand("d") is None and len(loads) == 1
