"""Test helper: the same work on several threads at once, each in its own order."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np


def in_threads(each: Callable[[int], None], items: int, threads: int = 4, seed: int = 0) -> None:
    """Call `each(k)` for every k < `items` on each of `threads` threads started together,
    every thread in its own random order; the first failure is raised here."""
    errors: list[BaseException] = []

    def work(order: list[int]) -> None:
        try:
            for k in order:
                each(k)
        except BaseException as e:  # raised below, in the test
            errors.append(e)

    rng = np.random.default_rng(seed)
    running = [
        threading.Thread(target=work, args=(rng.permutation(items).tolist(),))
        for _ in range(threads)
    ]
    for t in running:
        t.start()
    for t in running:
        t.join()
    if errors:
        raise errors[0]
