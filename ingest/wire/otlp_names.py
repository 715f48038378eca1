"""OTLP metric and attribute names as Prometheus names, as Prometheus 3.14's OTLP receiver makes
them with its defaults (`translation_strategy: UnderscoreEscapingWithSuffixes`; the rules of
github.com/prometheus/otlptranslator v1.0.0, which keeps this apart from the translation too):
metric names with unit and `_total` / `_ratio` suffixes, label names sanitised with `key`
prefixes and multiple underscores kept. Pure functions of strings; `ingest.wire.otlp` uses them.
"""

from __future__ import annotations

import functools
import re

# OTLP (UCUM) units -> Prometheus units; "per" units. As otlptranslator's unitMap / perUnitMap.
UNITS = {
    "d": "days",
    "h": "hours",
    "min": "minutes",
    "s": "seconds",
    "ms": "milliseconds",
    "us": "microseconds",
    "ns": "nanoseconds",
    "By": "bytes",
    "KiBy": "kibibytes",
    "MiBy": "mebibytes",
    "GiBy": "gibibytes",
    "TiBy": "tibibytes",
    "KBy": "kilobytes",
    "MBy": "megabytes",
    "GBy": "gigabytes",
    "TBy": "terabytes",
    "m": "meters",
    "V": "volts",
    "A": "amperes",
    "J": "joules",
    "W": "watts",
    "g": "grams",
    "Cel": "celsius",
    "Hz": "hertz",
    "1": "",
    "%": "percent",
}
PER_UNITS = {
    "s": "second",
    "m": "minute",
    "h": "hour",
    "d": "day",
    "w": "week",
    "mo": "month",
    "y": "year",
}

_NOT_METRIC_CHAR = re.compile(r"[^a-zA-Z0-9:]")
_NOT_METRIC_CHARS = re.compile(r"[^a-zA-Z0-9:]+")
_NOT_LABEL_CHAR = re.compile(r"[^a-zA-Z0-9]")

# The kinds of metric a name is made for (suffixes differ); OTHER: exponential histograms.
GAUGE, COUNTER, UPDOWN, HISTOGRAM, SUMMARY, OTHER = range(6)


def _unit_suffixes(unit: str) -> tuple[str, str]:
    """The main and "per" unit suffixes, before cleaning (otlptranslator's buildUnitSuffixes)."""
    parts = unit.split("/", 1)
    main = per = ""
    head = parts[0].strip()
    if head and "{" not in head and "}" not in head:
        main = UNITS.get(head, head)
    if len(parts) > 1 and parts[1]:
        tail = parts[1].strip()
        if tail and "{" not in tail and "}" not in tail:
            per = PER_UNITS.get(tail, tail)
        if per:
            per = "per_" + per
    return main, per


def _clean_unit(unit: str) -> str:
    """Invalid characters to `_`, runs of `_` collapsed, a leading `_` dropped."""
    return re.sub("_+", "_", _NOT_METRIC_CHAR.sub("_", unit)).removeprefix("_")


@functools.lru_cache(maxsize=4096)
def metric_name(name: str, unit: str, kind: int) -> str:
    """The Prometheus metric (family) name of an OTLP metric: name tokens joined by `_`, unit
    suffixes, `_total` for counters, `_ratio` for gauges of unit "1". "" if none is valid."""
    tokens = [t for t in _NOT_METRIC_CHARS.split(name) if t]
    main, per = _unit_suffixes(unit)
    main, per = _clean_unit(main), _clean_unit(per)
    if main in tokens:
        main = ""
    if per == "per_":
        per = ""
    else:
        per = per.removesuffix("_")
        if per in tokens:
            per = ""
    if per:
        main = main.removesuffix("_")
    if main:
        tokens.append(main)
    if per:
        tokens.append(per)
    if kind == COUNTER:
        tokens = [t for t in tokens if t != "total"] + ["total"]
    if unit == "1" and kind == GAUGE:
        tokens = [t for t in tokens if t != "ratio"] + ["ratio"]
    out = "_".join(tokens)
    if out and out[0].isdigit():
        out = "_" + out
    return out if out.strip("_") else ""


@functools.lru_cache(maxsize=8192)
def label_name(key: str) -> str:
    """A Prometheus label name for an attribute key (otlptranslator's LabelNamer, Prometheus'
    defaults: multiple underscores kept, `key_` before a digit, `key` before a single `_`).
    "" if the key is empty or only underscores."""
    if not key:
        return ""
    out = _NOT_LABEL_CHAR.sub("_", key)
    if out[0].isdigit():
        out = "key_" + out
    elif out.startswith("_") and not out.startswith("__"):
        out = "key" + out
    return out if out.strip("_") else ""
