"""Per-tenant ingestion limits (filopy/ingest_http/tenants.py) with a fake clock: the rate's
bucket, its debt and Retry-After, active series over a window, one tenant over its limit
leaving the others alone, nothing taken from a refused request."""

from __future__ import annotations

import numpy as np
import pytest

from filopy.ingest_http.tenants import NO_TENANT, OverLimit, TenantLimits
from ingest.batch import SampleBatch


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def batch(tenant: str | None, series: int, samples_each: int = 1, first: int = 0) -> SampleBatch:
    labels = [
        {"__name__": "m", "host": f"h{first + i}", **({"_ws_": tenant} if tenant else {})}
        for i in range(series)
    ]
    idx = np.repeat(np.arange(series, dtype=np.int32), samples_each)
    n = len(idx)
    return SampleBatch(labels, idx, np.arange(n, dtype=np.int64), np.ones(n))


def limits(clock: Clock, rate: float = 0, series: int = 0) -> TenantLimits:
    return TenantLimits(rate, 2.0, series, 60.0, 7, clock=clock)


def test_off_by_default() -> None:
    assert not limits(Clock()).enabled


def test_rate_lets_a_burst_in_then_refuses_with_the_wait_and_refills() -> None:
    clock = Clock()
    lim = limits(clock, rate=100)  # bucket of 200
    assert lim.admit(batch("a", 150)) == {"a": 150}
    assert lim.admit(batch("a", 150)) == {"a": 150}  # the bucket was not empty: now in debt
    with pytest.raises(OverLimit) as refused:
        lim.admit(batch("a", 1))
    assert refused.value.limit == "samples_per_s" and refused.value.retry_after_s == 2
    assert "over its ingestion rate of 100 samples/s" in str(refused.value)
    clock.now += 1.0  # debt 100 -> 0: still empty
    with pytest.raises(OverLimit):
        lim.admit(batch("a", 1))
    clock.now += 0.5
    assert lim.admit(batch("a", 10)) == {"a": 10}


def test_a_tenant_over_its_rate_leaves_others_alone() -> None:
    lim = limits(Clock(), rate=10)
    lim.admit(batch("a", 30))
    with pytest.raises(OverLimit):
        lim.admit(batch("a", 1))
    assert lim.admit(batch("b", 5)) == {"b": 5}


def test_a_request_of_two_tenants_is_refused_whole_and_takes_nothing() -> None:
    clock = Clock()
    lim = limits(clock, series=3)
    mixed = batch("a", 2)
    mixed.series += batch("b", 2).series
    mixed.series_idx = np.arange(4, dtype=np.int32)
    mixed.timestamps = np.arange(4, dtype=np.int64)
    mixed.values = np.ones(4)
    assert lim.admit(mixed) == {"a": 2, "b": 2}
    with pytest.raises(OverLimit) as refused:
        lim.admit(batch("b", 2, first=10))  # b would have 4
    assert refused.value.tenant == "b" and refused.value.retry_after_s == 7
    assert lim.active() == {"a": 2, "b": 2}  # nothing of the refused request counted


def test_active_series_count_distinct_series_within_the_window() -> None:
    clock = Clock()
    lim = limits(clock, series=5)
    lim.admit(batch("a", 5, samples_each=3))
    lim.admit(batch("a", 5))  # the same five: still five
    with pytest.raises(OverLimit) as refused:
        lim.admit(batch("a", 1, first=5))
    assert "would have 6 active series, over its limit of 5" in str(refused.value)
    clock.now += 61.0  # the five went quiet for longer than the window
    assert lim.admit(batch("a", 5, first=5)) == {"a": 5}
    assert lim.active() == {"a": 5}


def test_the_token_tenant_names_the_tenant_and_series_without_one_share_a_tenant() -> None:
    lim = limits(Clock(), rate=1000)
    assert lim.admit(batch(None, 3)) == {NO_TENANT: 3}
    assert lim.admit(batch("x", 3), token_tenant="team") == {"team": 3}
