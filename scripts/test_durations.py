"""Write tests/durations.json, each test module's seconds in a `make test` run, from that run's
JUnit XML (`PYTEST_ADDOPTS=--junitxml=FILE make test`). The xdist scheduler (tests/conftest.py)
hands out the longest modules first, so that no long module starts when the others are done.

    python scripts/test_durations.py FILE
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "durations.json"


def module_seconds(junit: Path) -> dict[str, int]:
    """Seconds per test module file; a test's classname is its module, then any class names."""
    seconds: dict[str, float] = defaultdict(float)
    for case in ET.parse(junit).iter("testcase"):
        parts = case.get("classname", "").split(".")
        while parts and parts[-1][:1].isupper():
            parts.pop()
        seconds["/".join(parts) + ".py"] += float(case.get("time") or 0)
    return {module: round(s) for module, s in sorted(seconds.items())}


if __name__ == "__main__":
    OUT.write_text(json.dumps(module_seconds(Path(sys.argv[1])), indent=0) + "\n")
    print(f"wrote {OUT}")
