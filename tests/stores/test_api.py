"""Part keys and label matchers: the vocabulary both backends share."""

from __future__ import annotations

import pytest

from store import LabelMatcher, MatchOp, PartKeyRecord, decode_part_key, encode_part_key


def test_part_keys_are_canonical_and_decodable() -> None:
    a = encode_part_key({"job": "api", "__name__": "up", "zone": 'é"\n'})
    b = encode_part_key({"zone": 'é"\n', "__name__": "up", "job": "api"})
    assert a == b == '{"__name__":"up","job":"api","zone":"é\\"\\n"}'
    assert decode_part_key(a) == {"__name__": "up", "job": "api", "zone": 'é"\n'}
    assert encode_part_key({"__name__": "up", "env": ""}) == encode_part_key({"__name__": "up"})
    rec = PartKeyRecord.from_labels({"b": "2", "a": "1"}, 5, 9)
    assert rec.labels == {"a": "1", "b": "2"} and rec.part_key == '{"a":"1","b":"2"}'


@pytest.mark.parametrize("labels", [{"": "x"}, {"a": 1}])
def test_bad_labels_are_rejected(labels: dict) -> None:
    with pytest.raises(ValueError):
        encode_part_key(labels)


def test_part_key_time_range_must_be_ordered() -> None:
    with pytest.raises(ValueError):
        PartKeyRecord('{"a":"b"}', 10, 9)


@pytest.mark.parametrize(
    ("matcher", "labels", "expected"),
    [
        (LabelMatcher("job", "=", "api"), {"job": "api"}, True),
        (LabelMatcher("job", "=", ""), {}, True),
        (LabelMatcher("job", "!=", ""), {}, False),
        (LabelMatcher("job", "=~", "a.i"), {"job": "api"}, True),
        (LabelMatcher("job", "=~", "a"), {"job": "api"}, False),  # fully anchored
        (LabelMatcher("job", "=~", "p"), {"job": "api"}, False),
        (LabelMatcher("job", "=~", ".*"), {}, True),
        (LabelMatcher("job", "!~", ".+"), {}, True),
        (LabelMatcher("job", "=~", "a.c"), {"job": "a\nc"}, True),  # '.' matches newlines
        (LabelMatcher("job", MatchOp.NRE, "x|y"), {"job": "y"}, False),
        # RE2 (Go's syntax), as Prometheus: Unicode classes, `\z`, `$` only at the very end.
        (LabelMatcher("job", "=~", r"\pL+"), {"job": "héllo"}, True),
        (LabelMatcher("job", "=~", r"api\z"), {"job": "api"}, True),
        (LabelMatcher("job", "=~", "api$"), {"job": "api\n"}, False),
    ],
)
def test_matchers_follow_prometheus(
    matcher: LabelMatcher, labels: dict[str, str], expected: bool
) -> None:
    assert matcher.matches(labels) is expected


def test_bad_matchers_are_rejected() -> None:
    with pytest.raises(ValueError, match="regex"):
        LabelMatcher("job", "=~", "(")
    with pytest.raises(ValueError):
        LabelMatcher("job", "==", "x")
    assert str(LabelMatcher("job", "=~", "a.*")) == 'job=~"a.*"'


@pytest.mark.parametrize("regex", ["(?=a)b", r"(a)\1", "(?<!a)b"])
def test_regexes_go_refuses_are_refused(regex: str) -> None:
    """Lookarounds and backreferences: Python's `re` has them, RE2 and Prometheus do not."""
    with pytest.raises(ValueError, match="regex"):
        LabelMatcher("job", "=~", regex)


@pytest.mark.timeout(10)
def test_a_catastrophic_regex_runs_in_linear_time() -> None:
    """`(a+)+` against a's ending in a mismatch takes exponential time in a backtracking engine
    (Python's `re`: hours at this length); RE2 answers at once."""
    assert not LabelMatcher("job", "=~", "(a+)+").matches({"job": "a" * 5000 + "b"})
    assert not LabelMatcher("job", "=~", "(x+x+)+y").matches({"job": "x" * 5000})
