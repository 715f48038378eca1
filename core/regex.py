"""Label regexes as Prometheus runs them: Google's RE2, anchored at both ends, `.` matching
newlines (Prometheus compiles `^(?s:regex)$` with Go's `regexp`, an RE2).

RE2 runs in time linear in the input whatever the pattern, so a user's regex cannot backtrack
catastrophically (Python's `re` can: `(a+)+$` on a long string of a's runs for hours); it also
refuses what Go refuses (backreferences, lookarounds) and accepts what Go accepts (`\\pL`, ...).
"""

from __future__ import annotations

import functools
from typing import Any

import re2

__all__ = ["compile_anchored"]

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a bad regex is reported to the user, not logged by RE2


@functools.lru_cache(maxsize=1024)
def compile_anchored(regex: str) -> Any:
    """The RE2 regex `(?s:regex)`, to be used with `fullmatch` (Prometheus's `^(?s:regex)$`).

    Raises ValueError for a regex RE2 rejects."""
    try:
        return re2.compile(f"(?s:{regex})", _OPTIONS)
    except re2.error as e:
        detail = e.args[0] if e.args else ""
        if isinstance(detail, bytes):
            detail = detail.decode("utf-8", "replace")
        raise ValueError(f"invalid regex {regex!r}: {detail}") from None
