"""Compile FiloPy's numba kernels into their on-disk cache once, before many processes want them.

    .venv/bin/python scripts/warm_kernels.py

The kernels (`core.jit`) keep their machine code next to their modules; a process that finds no
cache compiles every kernel it calls itself, about 30 s of CPU for all of them. A test run on a
fresh clone starts dozens of processes within its first minutes (pytest workers, Ray actors, the
CLI), each compiling the same kernels until one has written the cache: `make test` runs this
first. With the cache in place it takes about a second.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from core import jit  # noqa: E402

# The packages whose modules register kernels' warmers (`core.jit.warms`) when imported.
KERNEL_PACKAGES = ("store", "ingest", "query")


def main() -> None:
    started = time.process_time()
    for name in KERNEL_PACKAGES:
        package = importlib.import_module(name)
        for module in pkgutil.walk_packages(package.__path__, f"{name}."):
            importlib.import_module(module.name)
    jit.warm()
    print(f"[warm] numba kernels compiled or loaded: {time.process_time() - started:.1f} s of CPU")


if __name__ == "__main__":
    main()
