"""Per-tenant ingestion limits of one gateway process: samples per second and active series.

A tenant is a write token's tenant, or else a series' `_ws_` label (docs/security.md). A request
that would take a tenant over a limit is refused whole with 429 and Retry-After before anything
of it is written, so nothing already accepted is ever dropped, and other tenants go on. The
limits hold per process: behind a load balancer of N gateways a tenant gets up to N times them.

Samples per second are a token bucket per tenant, `samples_per_s` a second up to `burst_s`
seconds' worth; a request is let in while the bucket is not empty and may take it below zero
(a request larger than the burst is not refused forever), and the debt says how long to wait.
Active series are the distinct series a tenant wrote in the last `active_window_s`.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from core.errors import Limited
from ingest.batch import SampleBatch

TENANT_LABEL = "_ws_"
NO_TENANT = "-"  # series without the label, written with a token of no tenant


class OverLimit(Limited):
    """A request a tenant may not make now: which limit, a message, when to retry."""

    def __init__(self, tenant: str, limit: str, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.tenant, self.limit, self.retry_after_s = tenant, limit, retry_after_s


@dataclass
class _Tenant:
    tokens: float
    at: float
    series: dict[tuple[tuple[str, str], ...], float] = field(default_factory=dict)
    pruned_at: float = 0.0


class TenantLimits:
    """The limits of one gateway; 0 turns a limit off. Thread-safe: requests are admitted from
    the event loop and from worker threads."""

    def __init__(
        self,
        samples_per_s: float,
        burst_s: float,
        active_series: int,
        active_window_s: float,
        series_retry_after_s: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.samples_per_s = samples_per_s
        self.burst = samples_per_s * burst_s
        self.active_series = active_series
        self.window_s = active_window_s
        self.series_retry_after_s = series_retry_after_s
        self._clock = clock
        self._tenants: dict[str, _Tenant] = {}
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.samples_per_s > 0 or self.active_series > 0

    def admit(self, batch: SampleBatch, token_tenant: str | None = None) -> dict[str, int]:
        """Take the batch's samples from its tenants' limits, or raise OverLimit (nothing
        taken). Returns samples per tenant."""
        per_series = np.bincount(batch.series_idx, minlength=len(batch.series))
        samples: Counter[str] = Counter()
        series_of: dict[str, list[tuple[tuple[str, str], ...]]] = {}
        for labels, n in zip(batch.series, per_series.tolist(), strict=True):
            tenant = token_tenant or labels.get(TENANT_LABEL) or NO_TENANT
            samples[tenant] += n
            if self.active_series:
                series_of.setdefault(tenant, []).append(tuple(sorted(labels.items())))
        now = self._clock()
        with self._lock:
            states = {t: self._state(t, now) for t in samples}
            for tenant, n in samples.items():
                self._check(tenant, states[tenant], n, series_of.get(tenant, ()), now)
            for tenant, n in samples.items():
                state = states[tenant]
                state.tokens -= n
                for key in series_of.get(tenant, ()):
                    state.series[key] = now
        return dict(samples)

    def active(self) -> dict[str, int]:
        """Active series per tenant (for the metrics)."""
        now = self._clock()
        with self._lock:
            return {t: self._prune(s, now, force=True) for t, s in self._tenants.items()}

    def _state(self, tenant: str, now: float) -> _Tenant:
        state = self._tenants.get(tenant)
        if state is None:
            state = self._tenants[tenant] = _Tenant(tokens=self.burst, at=now, pruned_at=now)
        if self.samples_per_s:
            state.tokens = min(self.burst, state.tokens + (now - state.at) * self.samples_per_s)
            state.at = now
        return state

    def _check(
        self,
        tenant: str,
        state: _Tenant,
        samples: int,
        series: list[tuple[tuple[str, str], ...]] | tuple[()],
        now: float,
    ) -> None:
        if self.samples_per_s and state.tokens <= 0:
            wait = math.ceil((1 - state.tokens) / self.samples_per_s)
            raise OverLimit(
                tenant,
                "samples_per_s",
                f"tenant {tenant!r} is over its ingestion rate of {self.samples_per_s:g} "
                f"samples/s; retry in {wait} s",
                max(1, wait),
            )
        if self.active_series and series:
            active = self._prune(state, now)
            new = sum(1 for key in set(series) if key not in state.series)
            if active + new > self.active_series:
                raise OverLimit(
                    tenant,
                    "active_series",
                    f"tenant {tenant!r} would have {active + new} active series, over its "
                    f"limit of {self.active_series} (series written in the last "
                    f"{self.window_s:g} s); nothing of this request was written",
                    self.series_retry_after_s,
                )

    def _prune(self, state: _Tenant, now: float, force: bool = False) -> int:
        """Forget series not written within the window (at most every tenth of it)."""
        if force or now - state.pruned_at >= self.window_s / 10:
            cutoff = now - self.window_s
            state.series = {k: t for k, t in state.series.items() if t >= cutoff}
            state.pruned_at = now
        return len(state.series)
