"""Per-tenant query limits: how many samples and series one PromQL query may read.

A query's tenant is its token's tenant, else the `_ws_` that every selector of the query names
with `=` (one value for all of them), else "-" (docs/security.md). What counts is what the
nodes read for the query: the series its selectors match with samples in the range (`series`)
and their samples in the windows read (`samples`), over every node and every node call of the
query. Label listings (`/series`, `/labels`) are not counted.

The count is enforced where the samples are read, so a query over a limit stops early: each
node checks its own reads against what the query had already spent before the call (carried in
the request) after each slice of series it reads; the caller adds up the nodes'
answers and stops as soon as the sum passes a limit. A node of a parallel fan-out does not see
what its peers read in that round, so the whole query may read up to a round's worth more than
the limit before it is refused, never more than the limit per node.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from core.errors import ExecutionFailed
from query.promql import Expr, VectorSelector, selectors
from store.api import LabelMatcher, MatchOp

TENANT_LABEL = "_ws_"
NO_TENANT = "-"  # no token tenant and no single `_ws_` pinned by the query

# Setting names, as the refusals name them (config/filopy.toml, [query]).
SETTINGS = {"samples": "query.tenant_max_samples", "series": "query.tenant_max_series"}


class QueryLimitExceeded(ExecutionFailed):
    """A query that would read more than its tenant may: which limit (`samples` or `series`)
    and its value, so the answer (422) names both."""

    def __init__(self, tenant: str, limit: str, maximum: int) -> None:
        what = "samples" if limit == "samples" else "series"
        super().__init__(
            f"query processing would load too many {what}: tenant {tenant!r} may read at most "
            f"{maximum} {what} per query ({SETTINGS[limit]} = {maximum}); narrow the selectors "
            "or the time range"
        )
        self.tenant, self.limit, self.maximum = tenant, limit, maximum


@dataclass(frozen=True, slots=True)
class QueryLimits:
    """One query's limits (0: none) and what it spent on node calls made before this one."""

    tenant: str
    max_samples: int = 0
    max_series: int = 0
    spent_samples: int = 0
    spent_series: int = 0

    @property
    def enabled(self) -> bool:
        return self.max_samples > 0 or self.max_series > 0

    def after(self, samples: int, series: int) -> QueryLimits:
        """These limits for a later call, once `samples` and `series` are spent."""
        return replace(self, spent_samples=samples, spent_series=series)

    def check(self, samples: int, series: int) -> None:
        """Raise `QueryLimitExceeded` if reading these, on top of what was spent, is over."""
        if self.max_series and self.spent_series + series > self.max_series:
            raise QueryLimitExceeded(self.tenant, "series", self.max_series)
        if self.max_samples and self.spent_samples + samples > self.max_samples:
            raise QueryLimitExceeded(self.tenant, "samples", self.max_samples)


def pinned_tenant(sels: Sequence[Sequence[LabelMatcher]]) -> str | None:
    """The `_ws_` that every selector names with `=`, if it is one value; else None."""
    found: set[str] = set()
    for matchers in sels:
        values = {m.value for m in matchers if m.label == TENANT_LABEL and m.op is MatchOp.EQ}
        if len(values) != 1:
            return None
        found |= values
    return found.pop() if len(found) == 1 else None


def tenant_of(expr: Expr, token_tenant: str | None) -> str:
    """The tenant a query counts against (see the module's docstring)."""
    if token_tenant:
        return token_tenant
    sels: list[VectorSelector] = selectors(expr)
    return pinned_tenant([s.matchers for s in sels]) or NO_TENANT
