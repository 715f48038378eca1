"""Compiled kernels (numba) for the gateway's per-request hot paths.

The HTTP gateway decodes and encodes on several request threads in one process. NumPy releases
the GIL only inside its larger loops, and a request is a few dozen small NumPy calls, so the
threads took turns on one core. A `kernel` runs as machine code without the GIL: the request
threads then work in parallel. `cache=True` keeps the machine code on disk (next to the module,
or numba's user cache directory where that is read only); `warm` compiles or loads every kernel
up front (the gateway calls it at start), so no request waits for the compiler.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numba

F = TypeVar("F", bound=Callable[..., Any])

_warmers: list[Callable[[], object]] = []


def kernel(fn: F) -> F:
    """`fn` compiled, run without the GIL, its machine code cached on disk (compiled anew in
    each process where no cache directory is writable: numba refuses `cache=True` there)."""
    return _compiled(fn)


def float_kernel(fn: F) -> F:
    """`kernel` with NumPy's float semantics: x / 0 is inf or NaN, as in the NumPy code such a
    kernel replaces (numba's default raises ZeroDivisionError)."""
    return _compiled(fn, error_model="numpy")


def _compiled(fn: F, **options: Any) -> F:
    try:
        return numba.njit(nogil=True, cache=True, **options)(fn)  # type: ignore[no-any-return]
    except RuntimeError:  # "cannot cache function ...: no locator available"
        return numba.njit(nogil=True, **options)(fn)  # type: ignore[no-any-return]


def warms(fn: Callable[[], object]) -> Callable[[], object]:
    """Register `fn` (calls of kernels with the argument types the hot paths use) for `warm`."""
    _warmers.append(fn)
    return fn


def warm() -> None:
    """Compile (or load from the cache) every registered kernel."""
    for fn in _warmers:
        fn()
