"""Functions that compute labels rather than values: label_replace, label_join, absent's labels.

Prometheus compiles label_replace's regex with Go's `regexp` (RE2 syntax), anchored at both ends
with `.` matching newlines, and expands the replacement with Go's `Regexp.Expand` rules. Python's
`re` differs from RE2 (it has backreferences and lookarounds, lacks `\\pL`, and `$` matches
before a final newline), so the regex goes through Google's RE2 (`google-re2`), and the
expansion is written out here to Go's rules: `$1`, `${1}`, `$name`, `${name}`, `$$`; a name is
the longest run of letters, digits and `_` (so `$1x` is the group named `1x`, which is empty);
anything else after `$` is kept as text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from core.regex import compile_anchored
from store.api import LabelMatcher, MatchOp

__all__ = ["absent_labels", "compile_anchored", "expand", "label_join", "label_replace"]


def _name_end(template: str, i: int) -> int:
    """End of the run of letters, digits and `_` starting at `i` (Go's unicode classes)."""
    while i < len(template):
        c = template[i]
        if not (c.isalpha() or c.isdecimal() or c == "_"):
            break
        i += 1
    return i


def expand(template: str, text: str, match: Any, rx: Any) -> str:
    """`template` with `$` references replaced by `match`'s groups (Go's `Regexp.Expand`)."""
    out: list[str] = []
    i = 0
    while True:
        j = template.find("$", i)
        if j < 0:
            out.append(template[i:])
            return "".join(out)
        out.append(template[i:j])
        i = j + 1
        if template.startswith("$", i):
            out.append("$")
            i += 1
            continue
        brace = template.startswith("{", i)
        start = i + 1 if brace else i
        end = _name_end(template, start)
        if end == start or (brace and not template.startswith("}", end)):
            out.append("$")  # malformed: the `$` is text
            continue
        name = template[start:end]
        i = end + 1 if brace else end
        group: int | None = None
        if name.isascii() and name.isdigit() and not (name[0] == "0" and len(name) > 1):
            group = int(name) if len(name) <= 9 else None  # Go stops at 1e8
        else:
            group = rx.groupindex.get(name)
        if group is not None and group <= rx.groups:
            a, b = match.span(group)
            if a >= 0:
                out.append(text[a:b])


def _with_label(labels: Mapping[str, str], name: str, value: str) -> dict[str, str]:
    """Set a label; an empty value removes it (as Prometheus's label builder does)."""
    out = dict(labels)
    if value:
        out[name] = value
    else:
        out.pop(name, None)
    return out


def label_replace(
    label_sets: Sequence[Mapping[str, str]], dst: str, replacement: str, src: str, regex: str
) -> list[dict[str, str]]:
    """New label sets: where `regex` matches all of label `src`, `dst` is set to the expanded
    replacement; other series are left alone. The regex runs once per distinct `src` value."""
    rx = compile_anchored(regex)
    results: dict[str, str | None] = {}
    out = []
    for labels in label_sets:
        value = labels.get(src, "")
        if value not in results:
            m = rx.fullmatch(value)
            results[value] = None if m is None else expand(replacement, value, m, rx)
        res = results[value]
        out.append(dict(labels) if res is None else _with_label(labels, dst, res))
    return out


def label_join(
    label_sets: Sequence[Mapping[str, str]], dst: str, separator: str, srcs: Sequence[str]
) -> list[dict[str, str]]:
    """New label sets with `dst` set to the `src` labels' values joined by `separator`."""
    return [
        _with_label(labels, dst, separator.join(labels.get(s, "") for s in srcs))
        for labels in label_sets
    ]


def absent_labels(matchers: Sequence[LabelMatcher]) -> dict[str, str]:
    """The labels of absent()'s series: those an equality matcher fixes, except the metric name
    and labels matched more than once or otherwise (Prometheus's createLabelsForAbsentFunction)."""
    out: dict[str, str] = {}
    seen: set[str] = set()
    for m in matchers:
        if m.label == "__name__":
            continue
        if m.op is MatchOp.EQ and m.label not in seen:
            out = _with_label(out, m.label, m.value)
            seen.add(m.label)
        else:
            out.pop(m.label, None)
    return out
