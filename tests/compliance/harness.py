"""Compare FiloPy's PromQL answers with Prometheus 3's on the same data.

    .venv/bin/python -m tests.compliance.harness            # start both, load, compare
    .venv/bin/python -m tests.compliance.harness --only rate --show-passing
    .venv/bin/python -m tests.compliance.harness --reference URL --target URL   # running servers
    .venv/bin/python -m tests.compliance.harness --queries promql-test-queries.yml  # official list

Without URLs it starts everything itself: the demo series (`demo_data`) become TSDB blocks
(`promtool tsdb create-blocks-from openmetrics`) served by Prometheus 3 (built by
`scripts/rw-compliance.sh prometheus` from the Go module source), and the same samples go to a
real two-node FiloPy cluster through its remote-write endpoint and real Kafka (needs
`scripts/services.sh up kafka`). Every query of `queries.yml` then runs against both as a range
query (the last 10 minutes at 10 s steps, as the official tester does) and as an instant query
at the end time, and the answers are compared as the official tester compares them: same
series (labels), in the same order for instant sort()/sort_desc() and outermost topk/bottomk,
same timestamps, values equal to a
relative 1e-5 (NaN equals NaN). A query the reference refuses must be refused by FiloPy with a
4xx; a 501 from FiloPy counts as unsupported.

The outcome of each (query, mode) that does not pass must be listed in `known_differences.yml`
with its reason; the exit code is 0 only when the failures are exactly those listed.

`--queries PATH` runs another query list instead: one in this harness' format (`cases:`,
`{{name}}` variants) or the official tester's (`test_cases:` with Go-template `{{.name}}`
placeholders expanded over each entry's `variant_args`, in order, from the tester's own
variant values, `OFFICIAL_VARIANTS`; `should_fail`, `skip_comparison` and an optional
`query_time_parameters` as the tester reads them). The official list is not part of this
repository: get `promql/promql-test-queries.yml` from github.com/prometheus/compliance. Such a
run's window ends 12 minutes before the data's last sample, as the tester's default end time
("now" - 12 m) does with live data, so negative offsets see samples; its exit code is 0 only
when every query passes (`--known` applies a differences list to it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.compliance import demo_data

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
END_S = 1_767_225_600  # 2026-01-01T00:00:00Z: fixed, so every run compares the same answers
RANGE_S, STEP_S = 600, 10
FRACTION = 1e-5  # the official tester's default tolerance (relative), NaN equal to NaN


def _words(text: str) -> list[str]:
    return text.split()


VARIANTS: dict[str, list[str]] = {
    "range": ["1s", "15s", "1m", "5m", "15m", "1h"],
    "offset": ["1m", "5m", "10m"],
    "aggr": ["sum", "avg", "max", "min", "count", "stddev", "stdvar", "group"],
    "topk": ["topk", "bottomk"],
    "quantile": ["-0.5", "0", "0.1", "0.5", "0.75", "0.9", "0.99", "1", "1.5"],
    "rate": ["rate", "increase", "delta"],
    "irate": ["irate", "idelta"],
    "over_time": ["sum", "avg", "min", "max", "count", "last", "stddev", "stdvar"],
    "math": _words(
        "abs ceil floor exp sqrt ln log2 log10 round sin cos tan asin acos atan sinh cosh tanh "
        "asinh acosh atanh deg rad"
    ),
    "to_nearest": ["0.1", "5", "1000"],
    "clamp": ["clamp_min", "clamp_max"],
    "date": _words("day_of_month day_of_week day_of_year days_in_month hour minute month year"),
    "binop": ["+", "-", "*", "/", "%", "^", "==", "!=", "<", ">", "<=", ">="],
    "compop": ["==", "!=", "<", ">", "<=", ">="],
    "setop": ["and", "or", "unless"],
}
_VARIANT = re.compile(r"\{\{(\w+)\}\}")

# The official tester's variant values (promql/testcases/expand.go, `testVariantArgs`).
OFFICIAL_VARIANTS: dict[str, list[str]] = {
    "range": ["1s", "15s", "1m", "5m", "15m", "1h"],
    "offset": ["1m", "5m", "10m"],
    "simpleAggrOp": ["sum", "avg", "max", "min", "count", "stddev", "stdvar"],
    "simpleTimeAggrOp": _words("sum avg max min count stddev stdvar absent last"),
    "topBottomOp": ["topk", "bottomk"],
    "quantile": _words("-0.5 0.1 0.5 0.75 0.95 0.90 0.99 1 1.5"),
    "arithBinOp": ["+", "-", "*", "/", "%", "^"],
    "compBinOp": ["==", "!=", "<", ">", "<=", ">="],
    "binOp": ["+", "-", "*", "/", "%", "^", "==", "!=", "<", ">", "<=", ">="],
    "simpleMathFunc": _words("abs ceil floor exp sqrt ln log2 log10 round"),
    "extrapolatedRateFunc": ["delta", "rate", "increase"],
    "clampFunc": ["clamp_min", "clamp_max"],
    "instantRateFunc": ["idelta", "irate"],
    "dateFunc": _words("day_of_month day_of_week days_in_month hour minute month year"),
    "smoothingFactor": ["0.1", "0.5", "0.8"],
    "trendFactor": ["0.1", "0.5", "0.8"],
}
# A Go template action naming a field of the variant map: `{{.name}}`, `{{- .name -}}` (whose
# dashes trim the white space before / after it), with the white space around it.
_GO_FIELD = re.compile(r"(\s*)\{\{(-\s)?\s*\.(\w+)\s*(\s-)?\}\}(\s*)")


# ------------------------------------------------------------------------------------ queries


@dataclass(frozen=True, slots=True)
class Case:
    query: str
    should_fail: bool = False
    skip_comparison: bool = False  # the official format's: both must answer, answers not compared


def expand(template: str) -> list[str]:
    """Every query a template stands for: each `{{name}}` takes each of `VARIANTS[name]`."""
    m = _VARIANT.search(template)
    if m is None:
        return [template]
    values = VARIANTS[m.group(1)]
    out: list[str] = []
    for v in values:
        out.extend(expand(template.replace(m.group(0), v)))
    return out


def expand_official(template: str, variant_args: list[str]) -> list[str]:
    """Every query an official test case stands for, in the tester's order: the first variant
    arg varies slowest; `{{.name}}` is replaced by the arg's value (Go's text/template on a map
    of strings does no more for these templates)."""
    values: dict[str, str] = {}
    out: list[str] = []

    def fill(m: re.Match[str]) -> str:
        before, trim_before, name, trim_after, after = m.groups()
        value = values.get(name, "<no value>")  # Go prints "<no value>" for a missing key
        return ("" if trim_before else before) + value + ("" if trim_after else after)

    def walk(remaining: list[str]) -> None:
        if not remaining:
            out.append(_GO_FIELD.sub(fill, template))
            return
        arg, rest = remaining[0], [a for a in remaining if a != remaining[0]]
        if arg not in OFFICIAL_VARIANTS:
            raise ValueError(f"unknown variant arg {arg!r} in {template!r}")
        for v in OFFICIAL_VARIANTS[arg]:
            values[arg] = v
            walk(rest)

    walk(list(variant_args))
    return out


@dataclass(frozen=True, slots=True)
class Window:
    """Where queries are asked: range queries over (end - range, end] every step, instant
    queries at the end."""

    end_s: float = END_S
    range_s: float = RANGE_S
    step_s: float = STEP_S


def load_cases(path: Path = HERE / "queries.yml") -> list[Case]:
    """The cases of a query list: this harness' format (`cases:`, `{{name}}` variants, repeats
    dropped) or the official tester's (`test_cases:`, expanded as it expands them, every
    expansion kept)."""
    doc = yaml.safe_load(path.read_text())
    cases: list[Case] = []
    if "test_cases" in doc:
        for entry in doc["test_cases"]:
            for q in expand_official(entry["query"], entry.get("variant_args") or []):
                fail, skip = bool(entry.get("should_fail")), bool(entry.get("skip_comparison"))
                cases.append(Case(q, fail, skip))
        return cases
    seen: set[str] = set()
    for entry in doc["cases"]:
        for q in expand(entry["query"]):
            if q not in seen:
                seen.add(q)
                cases.append(Case(q, bool(entry.get("should_fail", False))))
    return cases


def load_window(path: Path, default: Window) -> Window:
    """The official format's `query_time_parameters` (end time as unix seconds or RFC 3339,
    range and resolution in seconds) over `default`."""
    params = (yaml.safe_load(path.read_text()) or {}).get("query_time_parameters") or {}
    end_s = default.end_s
    if params.get("end_time"):
        end = str(params["end_time"])
        try:
            end_s = float(end)
        except ValueError:
            from datetime import datetime

            end_s = datetime.fromisoformat(end.replace("Z", "+00:00")).timestamp()
    return Window(
        end_s,
        float(params.get("range_in_seconds") or default.range_s),
        float(params.get("resolution_in_seconds") or default.step_s),
    )


# ----------------------------------------------------------------------------------- answers


@dataclass(frozen=True, slots=True)
class Answer:
    """A query API answer: `data` on success, else the HTTP status and errorType."""

    status: int
    data: dict[str, Any] | None = None
    error_type: str = ""
    error: str = ""


class Target:
    """A Prometheus-compatible query API."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.http = httpx.Client(timeout=60)

    def ask(self, mode: str, query: str, window: Window) -> Answer:
        end_s = window.end_s
        if mode == "range":
            path = "/api/v1/query_range"
            params = {
                "query": query,
                "start": end_s - window.range_s,
                "end": end_s,
                "step": window.step_s,
            }
        else:
            path, params = "/api/v1/query", {"query": query, "time": end_s}
        try:
            resp = self.http.post(self.url + path, data=params)
        except httpx.HTTPError as e:
            return Answer(0, error_type="transport", error=str(e))
        try:
            body = resp.json()
        except ValueError:
            return Answer(resp.status_code, error_type="not_json", error=resp.text[:300])
        if resp.status_code == 200 and body.get("status") == "success":
            return Answer(200, body["data"])
        return Answer(resp.status_code, None, body.get("errorType", ""), body.get("error", ""))


def _value(v: str) -> float:
    return float(v)  # "NaN", "+Inf", "-Inf" included


def _close(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if a == b:
        return True
    return abs(a - b) <= FRACTION * max(abs(a), abs(b))


def _points(values: list[list[Any]]) -> list[tuple[float, float]]:
    return [(float(t), _value(v)) for t, v in values]


def diff(ref: dict[str, Any], test: dict[str, Any], ordered: bool) -> str | None:
    """Why two successful answers differ, or None. Series order matters only where the query
    sorts (`ordered`), as Prometheus keeps the order of sort() and sort_desc()."""
    if ref["resultType"] != test["resultType"]:
        return f"result type {test['resultType']!r}, expected {ref['resultType']!r}"
    kind = ref["resultType"]
    if kind in ("scalar", "string"):
        (rt, rv), (tt, tv) = ref["result"], test["result"]
        if float(rt) != float(tt):
            return f"timestamp {tt}, expected {rt}"
        same = _close(_value(rv), _value(tv)) if kind == "scalar" else rv == tv
        return None if same else f"value {tv!r}, expected {rv!r}"

    def key(s: dict[str, Any]) -> str:
        return json.dumps(s["metric"], sort_keys=True)

    def points(s: dict[str, Any]) -> list[tuple[float, float]]:
        return _points(s["values"]) if kind == "matrix" else _points([s["value"]])

    rs, ts = ref["result"], test["result"]
    rkeys, tkeys = [key(s) for s in rs], [key(s) for s in ts]
    if sorted(rkeys) != sorted(tkeys):
        missing = sorted(set(rkeys) - set(tkeys))
        extra = sorted(set(tkeys) - set(rkeys))
        counts = f"{len(ts)} series, expected {len(rs)}"
        return f"{counts}; missing {missing[:2]}; unexpected {extra[:2]}"
    if ordered and rkeys != tkeys:
        return f"series order {tkeys[:3]}..., expected {rkeys[:3]}..."
    by_key = {key(s): s for s in ts}
    for s in rs:
        k = key(s)
        rp, tp = points(s), points(by_key[k])
        if [t for t, _ in rp] != [t for t, _ in tp]:
            rt, tt = {t for t, _ in rp}, {t for t, _ in tp}
            return (
                f"{k}: {len(tp)} points, expected {len(rp)} "
                f"(missing at {sorted(rt - tt)[:3]}, extra at {sorted(tt - rt)[:3]})"
            )
        for (t, rv), (_, tv) in zip(rp, tp, strict=True):
            if not _close(rv, tv):
                return f"{k} at {t}: {tv!r}, expected {rv!r}"
    return None


@dataclass(slots=True)
class Outcome:
    query: str
    mode: str  # "range" | "instant"
    verdict: str  # "pass" | "fail" | "unsupported" | "reference_error"
    why: str = ""


def compare(case: Case, mode: str, ref: Target, test: Target, window: Window) -> Outcome:
    r = ref.ask(mode, case.query, window)
    t = test.ask(mode, case.query, window)
    if r.data is None and r.status not in (400, 422):
        return Outcome(case.query, mode, "reference_error", f"{r.status} {r.error}")
    if case.should_fail and r.data is not None:
        why = "should_fail, but the reference answered"
        if t.data is not None:  # still worth knowing whether FiloPy answers the same
            d = diff(r.data, t.data, ordered=False)
            why += "; FiloPy's answer is the same" if d is None else f"; FiloPy's differs: {d}"
        return Outcome(case.query, mode, "reference_error", why)
    if r.data is None:  # refused by both passes (the official tester does not look at codes)
        if t.data is None and (400 <= t.status < 500 or t.status == 501):
            return Outcome(case.query, mode, "pass")
        why = "answered" if t.data is not None else f"{t.status} {t.error_type}: {t.error}"
        return Outcome(case.query, mode, "fail", f"{why}; expected a refusal ({r.error})")
    if t.data is None and t.status == 501:
        return Outcome(case.query, mode, "unsupported", t.error)
    if t.data is None:
        return Outcome(case.query, mode, "fail", f"{t.status} {t.error_type}: {t.error}")
    if case.skip_comparison:
        return Outcome(case.query, mode, "pass")
    why = diff(r.data, t.data, ordered=mode == "instant" and _ordered(case.query))
    return Outcome(case.query, mode, "pass" if why is None else "fail", why or "")


_K_OUTERMOST = re.compile(r"\s*(topk|bottomk)\b")


def _ordered(query: str) -> bool:
    """Whether an instant answer's series order is part of the answer: sorts, and topk/bottomk
    (group by group in order of first appearance, each by value) outermost."""
    return "sort" in query or _K_OUTERMOST.match(query) is not None


def run(ref: Target, test: Target, cases: list[Case], window: Window) -> list[Outcome]:
    jobs = [(c, m) for c in cases for m in ("range", "instant")]
    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(lambda j: compare(j[0], j[1], ref, test, window), jobs))


# ---------------------------------------------------------------------------- known failures


def load_known(path: Path = HERE / "known_differences.yml") -> dict[tuple[str, str], str]:
    """(query, mode) -> why it differs, as listed; mode "both" stands for range and instant."""
    if not path.exists():
        return {}
    known: dict[tuple[str, str], str] = {}
    for entry in yaml.safe_load(path.read_text()) or []:
        modes = ("range", "instant") if entry["mode"] == "both" else (entry["mode"],)
        for q in expand(entry["query"]):
            for m in modes:
                known[(q, m)] = entry["reason"]
    return known


def write_known(outcomes: list[Outcome], path: Path = HERE / "known_differences.yml") -> None:
    """Rewrite the list from `outcomes`: every (query, mode) that does not pass, with the reason
    already written for it, else FiloPy's answer as a first reason to be reviewed."""
    known = load_known(path)
    by_query: dict[str, dict[str, str]] = {}
    for o in outcomes:
        if o.verdict != "pass":
            why = known.get((o.query, o.mode)) or _first_reason(o)
            by_query.setdefault(o.query, {})[o.mode] = why
    entries = []
    for q, modes in by_query.items():
        if set(modes) == {"range", "instant"} and modes["range"] == modes["instant"]:
            entries.append({"query": q, "mode": "both", "reason": modes["range"]})
        else:
            entries.extend({"query": q, "mode": m, "reason": r} for m, r in modes.items())
    header = path.read_text().split("\n- ", 1)[0] if path.exists() else ""
    body = yaml.safe_dump(entries, sort_keys=False, allow_unicode=True, width=100)
    path.write_text(header.rstrip("\n") + "\n" + body)


def _first_reason(o: Outcome) -> str:
    if o.verdict == "unsupported" or "unsupported:" in o.why:
        return "not implemented yet: " + o.why.split("unsupported:", 1)[-1].strip()
    return "to investigate: " + o.why


def unexpected(outcomes: list[Outcome], known: dict[tuple[str, str], str]) -> list[str]:
    """What does not match the list: failures it lacks, and listed ones that now pass."""
    problems = []
    for o in outcomes:
        listed = (o.query, o.mode) in known
        if o.verdict != "pass" and not listed:
            problems.append(f"NEW {o.verdict}: [{o.mode}] {o.query}: {o.why}")
        elif o.verdict == "pass" and listed:
            problems.append(f"NOW PASSES (remove from known_differences.yml): [{o.mode}] {o.query}")
    return problems


def summary(outcomes: list[Outcome]) -> str:
    lines = []
    for mode in ("range", "instant"):
        mine = [o for o in outcomes if o.mode == mode]
        passed = sum(o.verdict == "pass" for o in mine)
        unsup = sum(o.verdict == "unsupported" for o in mine)
        pct = 100.0 * passed / max(1, len(mine))
        line = f"{mode:>7}: {passed} / {len(mine)} ({pct:.2f}%) passed, {unsup} unsupported"
        ref_errors = [o for o in mine if o.verdict == "reference_error"]
        if ref_errors:
            same = sum("FiloPy's answer is the same" in o.why for o in ref_errors)
            line += f", {len(ref_errors)} reference errors (FiloPy answers as it: {same})"
        lines.append(line)
    return "\n".join(lines)


# ------------------------------------------------------------------------------ the systems


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prometheus3() -> str:
    """Prometheus 3, built once from its Go module source (cached under .services/cache)."""
    out = subprocess.run(
        [str(ROOT / "scripts" / "rw-compliance.sh"), "prometheus"],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


@contextlib.contextmanager
def reference(
    workdir: Path, series: list[demo_data.Series], binary: str | None = None
) -> Iterator[str]:
    """Prometheus (3, built from source, unless `binary` says which) serving promtool-built
    blocks of `series`; yields its URL."""
    promtool = shutil.which("promtool")
    if promtool is None:
        raise SystemExit("promtool not found: run scripts/system-deps.sh (Debian's prometheus)")
    data, tsdb = workdir / "demo.om", workdir / "tsdb"
    with data.open("w") as f:
        f.writelines(demo_data.openmetrics(series))
    subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(data), str(tsdb)],
        check=True,
        capture_output=True,
    )
    config = workdir / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1h\n")
    port = free_port()
    log = (workdir / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            binary or prometheus3(),
            f"--config.file={config}",
            f"--storage.tsdb.path={tsdb}",
            "--storage.tsdb.retention.time=100y",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300  # a big TSDB takes a while to open
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/-/ready", timeout=2).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Prometheus did not start; see {workdir / 'prometheus.log'}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def remote_write_bodies(
    series: list[demo_data.Series], per_request: int = 20_000
) -> Iterator[bytes]:
    """Snappy-compressed remote write 1.0 requests carrying every sample of `series`."""
    import cramjam

    from ingest.wire.prompb.remote_pb2 import WriteRequest

    req, n = WriteRequest(), 0
    for s in series:
        ts = req.timeseries.add()
        for k, v in sorted(s.labels.items()):
            ts.labels.add(name=k, value=v)
        for t, v in zip(s.timestamps_ms.tolist(), s.values.tolist(), strict=True):
            ts.samples.add(value=v, timestamp=t)
        n += len(s.values)
        if n >= per_request:
            yield bytes(cramjam.snappy.compress_raw(req.SerializeToString()))
            req, n = WriteRequest(), 0
    if n:
        yield bytes(cramjam.snappy.compress_raw(req.SerializeToString()))


@contextlib.contextmanager
def filopy(workdir: Path, series: list[demo_data.Series], kafka: str) -> Iterator[str]:
    """A real two-node FiloPy cluster holding `series` (written through its remote-write
    endpoint and Kafka); yields the query API base URL of its dataset."""
    from tests.rest.conftest import start_rest
    from tests.runtime.conftest import cluster_settings

    settings = cluster_settings(workdir, "kafka", kafka_bootstrap=kafka)
    with contextlib.contextmanager(start_rest)(workdir, 2, settings) as rest:
        name = f"compliance{uuid.uuid4().hex[:6]}"
        body = {"name": name, "num_shards": 4, "min_num_nodes": 2,
                "source": {"bootstrap_servers": kafka}}  # fmt: skip
        resp = rest.http.post("/api/v1/datasets", json=body)
        resp.raise_for_status()
        rest.wait_for("all shards active", lambda: rest.all_active(name), timeout_s=60)
        for payload in remote_write_bodies(series):
            resp = rest.http.post(
                f"/ingest/{name}/api/v1/write",
                content=payload,
                headers={
                    "Content-Encoding": "snappy",
                    "Content-Type": "application/x-protobuf",
                    "X-Prometheus-Remote-Write-Version": "0.1.0",
                },
            )
            if resp.status_code >= 300:
                raise RuntimeError(f"remote write refused: {resp.status_code} {resp.text}")
        expected = sum(len(s.values) for s in series)

        def held() -> bool:
            samples = rest.client.series_samples(name)
            return sum(len(ts) for per in samples.values() for ts in per.values()) >= expected

        rest.wait_for(f"{expected} samples held", held, timeout_s=600)
        yield f"{rest.url}/promql/{name}"


# ------------------------------------------------------------------------------------- main


def compare_all(
    ref_url: str,
    test_url: str,
    only: str | None = None,
    window: Window | None = None,
    queries: Path | None = None,
) -> list[Outcome]:
    cases = load_cases(queries) if queries else load_cases()
    if only:
        cases = [c for c in cases if re.search(only, c.query)]
    return run(Target(ref_url), Target(test_url), cases, window or Window())


# The official tester asks at "now" - 12 m by default, with data scraped up to "now".
OFFICIAL_END_BEFORE_DATA_S = 12 * 60


@contextlib.contextmanager
def systems(kafka: str) -> Iterator[tuple[str, str]]:
    """Both systems loaded with the demo series: (reference URL, FiloPy URL)."""
    series = demo_data.generate(END_S)
    with tempfile.TemporaryDirectory(prefix="filopy-compliance-") as tmp:
        work = Path(tmp)
        (work / "ref").mkdir()
        (work / "filopy").mkdir()
        with reference(work / "ref", series) as ref, filopy(work / "filopy", series, kafka) as fp:
            yield ref, fp


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--reference", help="a running reference's URL (else Prometheus 3 is started)")
    ap.add_argument("--target", help="a running FiloPy query URL (else a cluster is started)")
    ap.add_argument("--kafka", default=f"127.0.0.1:{os.environ.get('FILOPY_KAFKA_PORT', '9092')}")
    ap.add_argument(
        "--queries",
        type=Path,
        help="another query list (this harness' format or the official tester's\n"
        "promql-test-queries.yml) instead of tests/compliance/queries.yml",
    )
    ap.add_argument(
        "--known",
        type=Path,
        help="the differences list to check against (default: known_differences.yml,\n"
        "none with --queries)",
    )
    ap.add_argument("--end", type=float, help="the window's end, unix seconds")
    ap.add_argument("--only", help="run only queries matching this regex")
    ap.add_argument("--show-passing", action="store_true")
    ap.add_argument("--json", type=Path, help="write every outcome here")
    ap.add_argument(
        "--write-known",
        action="store_true",
        help="rewrite known_differences.yml from this run (review the new reasons)",
    )
    args = ap.parse_args(argv)

    window = Window()
    if args.queries:
        window = load_window(args.queries, Window(END_S - OFFICIAL_END_BEFORE_DATA_S))
    if args.end is not None:
        window = Window(args.end, window.range_s, window.step_s)
    if args.reference and args.target:
        outcomes = compare_all(args.reference, args.target, args.only, window, args.queries)
    else:
        with systems(args.kafka) as (ref, fp):
            ref, fp = args.reference or ref, args.target or fp
            outcomes = compare_all(ref, fp, args.only, window, args.queries)

    if args.queries:
        known = load_known(args.known) if args.known else {}
    else:
        known = load_known(args.known) if args.known else load_known()
    for o in sorted(outcomes, key=lambda o: (o.verdict, o.query, o.mode)):
        if o.verdict != "pass" or args.show_passing:
            listed = "known" if (o.query, o.mode) in known else "NEW"
            print(f"{o.verdict:>15} {listed:>5} [{o.mode}] {o.query}  {o.why}")
    if args.json:
        args.json.write_text(json.dumps([asdict(o) for o in outcomes], indent=1))
    print(f"window: end {window.end_s:g}, range {window.range_s:g} s, step {window.step_s:g} s")
    print(summary(outcomes))
    if args.only:
        return 0
    if args.write_known:
        if args.queries:
            raise SystemExit("--write-known rewrites this harness' own list: not with --queries")
        write_known(outcomes)
    problems = unexpected(outcomes, known)
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
