"""The suite's units of work and the seconds file they are ordered by (tests/schedule.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.schedule import DURATIONS, ROOT, durations_from_junit, expected_seconds, unit_of


def test_a_module_is_a_unit_and_the_beds_modules_make_two() -> None:
    assert unit_of("tests/rest/test_kafka.py::test_x[a-b]") == "tests/rest/test_kafka.py"
    assert unit_of("tests/netbed/test_faults.py::test_y") == "tests/netbed[faults]"
    assert unit_of("tests/netbed/test_bed.py::test_z") == "tests/netbed[faults]"
    assert unit_of("tests/netbed/test_security.py::test_w") == "tests/netbed[others]"
    assert unit_of("tests/netbed/test_cassandra.py::test_v") == "tests/netbed[others]"


def test_seconds_per_unit_are_read_from_pytests_own_junit_report(tmp_path: Path) -> None:
    """A real report (pytest names a test's module in JUnit's dotted classname)."""
    report = tmp_path / "junit.xml"
    module = "tests/unit/test_membership.py"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", module,
         f"--junitxml={report}"],
        cwd=ROOT, check=True, capture_output=True,
    )  # fmt: skip
    seconds = durations_from_junit([report, report])
    assert list(seconds) == [module]
    assert seconds[module] > 0  # the mean of the two reports: the module's set-up, calls, ends


def test_the_committed_file_knows_the_suites_longest_units() -> None:
    """The file the workers are ordered by names units that exist, the bed's two among them."""
    seconds = expected_seconds()
    assert DURATIONS.is_file() and seconds
    assert {"tests/netbed[faults]", "tests/netbed[others]"} <= set(seconds)
    for unit in seconds:
        path = unit.split("[", 1)[0]
        assert (ROOT / path).exists(), f"{unit} in {DURATIONS.name} is no test module any more"
