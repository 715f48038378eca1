"""How `pytest -n` splits the suite into units of work and in which order workers take them.

A unit is a test module (its tests share the module's fixtures, a cluster per module), except
the many-hosts bed's modules, which go in two units of about equal time (`NETBED_UNITS`): each
unit's worker makes a bed of its own (tests/netbed/conftest.py), so the two run side by side.

Workers take the longest unit left first (longest-processing-time-first), by the seconds each
unit took in a CI run (`DURATIONS`, written by this module's command). pytest-xdist's own order
(most tests first) put the modules of one long test last: a worker started test_local.py or the
schemathesis run while the others ran out of work, and the machine idled for the last minute. A
unit the file does not know (a new module) counts as the median unit. Refresh the file when
modules grow or move, from a run's JUnit report:

    PYTEST_ADDOPTS=--junitxml=/tmp/junit.xml make test
    .venv/bin/python -m tests.schedule /tmp/junit.xml
"""

from __future__ import annotations

import json
import statistics
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DURATIONS = Path(__file__).with_name("durations.json")
NETBED = "tests/netbed"
# The many-hosts bed's modules, in two units of work of about equal time (each ~8 minutes of real
# fault timings, mostly waiting).
NETBED_UNITS = {"test_faults.py": f"{NETBED}[faults]", "test_bed.py": f"{NETBED}[faults]"}
NETBED_OTHERS = f"{NETBED}[others]"  # test_cassandra, test_security, the deployment page, compose


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its module, or one of the bed's two units."""
    module = nodeid.split("::", 1)[0]
    if not module.startswith(f"{NETBED}/"):
        return module
    return NETBED_UNITS.get(module.rsplit("/", 1)[1], NETBED_OTHERS)


def expected_seconds() -> dict[str, float]:
    """Each known unit's seconds in the run the file was written from ({} if there is none)."""
    try:
        return dict(json.loads(DURATIONS.read_text()))
    except FileNotFoundError:
        return {}


def make_scheduler(config: Any, log: Any) -> Any:
    """pytest-xdist's scope scheduling with `unit_of` as the scope and the longest unit first."""
    from xdist.scheduler import LoadScopeScheduling

    seconds = expected_seconds()
    unknown = statistics.median(seconds.values()) if seconds else 0.0

    class LongestFirst(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            longest = max(self.workqueue, key=lambda unit: seconds.get(unit, unknown))
            self.workqueue.move_to_end(longest, last=False)
            super()._assign_work_unit(node)

    return LongestFirst(config, log)


def _module_path(classname: str) -> str:
    """The module file of a JUnit classname ("tests.rest.test_x" or "tests.rest.test_x.TestY")."""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        path = "/".join(parts[:end]) + ".py"
        if (ROOT / path).is_file():
            return path
    raise ValueError(f"no module file for the JUnit class {classname!r}")


def durations_from_junit(reports: list[Path]) -> dict[str, float]:
    """Seconds per unit (set-up, call and tear-down of its tests), the mean over `reports`."""
    total: dict[str, float] = {}
    for report in reports:
        for case in ET.parse(report).iter("testcase"):
            unit = unit_of(_module_path(case.get("classname", "")))
            total[unit] = total.get(unit, 0.0) + float(case.get("time", 0.0))
    return {unit: round(s / len(reports), 1) for unit, s in sorted(total.items())}


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m tests.schedule JUNIT.xml [JUNIT.xml ...]", file=sys.stderr)
        return 2
    durations = durations_from_junit([Path(a) for a in argv])
    DURATIONS.write_text(json.dumps(durations, indent=0) + "\n")
    print(f"{DURATIONS.relative_to(ROOT)}: {len(durations)} units, {sum(durations.values()):.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
