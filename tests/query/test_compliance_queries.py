"""The compliance harness reads the official tester's query list as the tester expands it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.compliance import harness


def test_official_variants_expand_every_combination_first_arg_slowest() -> None:
    got = harness.expand_official(
        "{{.clampFunc}}(x[{{ .range }}]) {{- .clampFunc -}}", ["clampFunc", "range"]
    )
    ranges = harness.OFFICIAL_VARIANTS["range"]
    assert len(got) == 2 * len(ranges)
    assert got[0] == "clamp_min(x[1s])clamp_min"
    assert got[len(ranges)] == "clamp_max(x[1s])clamp_max"
    assert harness.expand_official("time()", []) == ["time()"]
    assert harness.expand_official("f({{.missing}})", []) == ["f(<no value>)"]
    with pytest.raises(ValueError, match="unknown variant arg"):
        harness.expand_official("{{.nope}}", ["nope"])


def test_an_official_format_file_keeps_every_expansion_and_its_flags(tmp_path: Path) -> None:
    f = tmp_path / "q.yml"
    f.write_text(
        "test_cases:\n"
        "  - query: 'a {{.compBinOp}} bool 1'\n"
        "    variant_args: ['compBinOp']\n"
        "  - query: 'a == bool 1'\n"
        "  - query: 'bad('\n"
        "    should_fail: true\n"
        "  - query: 'b'\n"
        "    skip_comparison: true\n"
        "query_time_parameters:\n"
        "  end_time: '2026-01-01T00:00:00Z'\n"
        "  resolution_in_seconds: 15\n"
    )
    cases = harness.load_cases(f)
    assert len(cases) == 6 + 3  # repeats are kept, as the tester keeps them
    assert [c.query for c in cases].count("a == bool 1") == 2
    assert cases[-2] == harness.Case("bad(", should_fail=True)
    assert cases[-1] == harness.Case("b", skip_comparison=True)
    window = harness.load_window(f, harness.Window(1.0, 600.0, 10.0))
    assert window == harness.Window(1_767_225_600.0, 600.0, 15.0)


def test_the_own_list_loads_and_expands() -> None:
    cases = harness.load_cases()
    assert len(cases) == len({c.query for c in cases}) > 900
