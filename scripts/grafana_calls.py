#!/usr/bin/env python3
"""Replay the calls Grafana's Prometheus data source makes when a dashboard loads.

    .venv/bin/python scripts/grafana_calls.py http://127.0.0.1:8080/promql/DATASET \
        [--bearer TOKEN | --basic USER:TOKEN] [--metric METRIC] [--label LABEL]

With a FiloPy read token, sent as the data source sends it (docs/security.md): `--bearer`, as
its custom `Authorization: Bearer` header, or `--basic`, as its basic auth with the token as
the password; without either, `$FILOPY_TOKEN` as a bearer token if it is set.

There is no Grafana package on the development machines, so this stands in for one: the same
requests, in the same order and shape (POST with form bodies where Grafana posts, its default
"HTTP method: POST"), each answer checked for Prometheus' envelope and data type:

1. "Save & test": an instant query of `1+1`, then `status/buildinfo` (Grafana picks features
   by the version it reports);
2. the query editor's metric browser: label names and `__name__` values over the dashboard's
   time range (`start`, `end`), metric metadata;
3. a dashboard variable `label_values(METRIC, LABEL)`: `series` with `match[]` and the range,
   and `label/LABEL/values` with `match[]`;
4. a time-series panel: `query_range` of `sum by (LABEL) (METRIC)` at Grafana's step for a
   1 h range on a 1,000-pixel panel, its exemplars (`query_exemplars`), and an instant query
   (a "table" panel);
5. the editor's "Format query" button (`format_query`).

The metric and label are the first metric the server lists and its first label other than
`__name__` (or `--metric` / `--label`). Exits 1 at the first call that is not a 2xx with the
expected shape, naming it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import httpx


class Failed(Exception):
    pass


def check(resp: httpx.Response, kind: type | tuple[type, ...], what: str) -> Any:
    """The `data` of a successful answer, of the expected JSON type."""
    if not resp.is_success:
        raise Failed(f"{what}: HTTP {resp.status_code}: {resp.text[:300]}")
    try:
        body = resp.json()
    except ValueError:
        raise Failed(f"{what}: not JSON: {resp.text[:300]}") from None
    if body.get("status") != "success" or "data" not in body:
        raise Failed(f"{what}: not a Prometheus success envelope: {body}")
    if not isinstance(body["data"], kind):
        raise Failed(f"{what}: data is {type(body['data']).__name__}: {body['data']!r:.300}")
    return body["data"]


def replay(
    base: str,
    metric: str | None,
    label: str | None,
    out: Any = sys.stdout,
    auth: httpx.Auth | None = None,
    headers: dict[str, str] | None = None,
) -> None:
    now = time.time()
    start, end = now - 3600, now
    rng = {"start": f"{start:.3f}", "end": f"{end:.3f}"}
    with httpx.Client(base_url=base.rstrip("/"), timeout=30, auth=auth, headers=headers) as http:

        def call(method: str, path: str, params: dict[str, Any], kind: Any, what: str) -> Any:
            if method == "POST":
                resp = http.post(path, data=params)
            else:
                resp = http.get(path, params=params)
            data = check(resp, kind, what)
            print(f"ok  {method:4} {path:32} {what}", file=out)
            return data

        # 1. Save & test
        t = {"time": f"{now:.3f}"}
        res = call("POST", "/api/v1/query", {"query": "1+1", **t}, dict, "health check 1+1")
        if res.get("resultType") != "scalar" or float(res["result"][1]) != 2:
            raise Failed(f"health check 1+1: {res}")
        info = call("GET", "/api/v1/status/buildinfo", {}, dict, "buildinfo")
        if not isinstance(info.get("version"), str) or not info["version"][:1].isdigit():
            raise Failed(f"buildinfo: no version Grafana can parse: {info}")

        # 2. Metric browser
        names = call("GET", "/api/v1/labels", rng, list, "label names")
        metrics = call("GET", "/api/v1/label/__name__/values", rng, list, "metric names")
        call("GET", "/api/v1/metadata", {}, dict, "metadata")
        if metric is None:
            if not metrics:
                raise Failed("no metric to query: the server lists none in the last hour")
            metric = metrics[0]
        if label is None:
            others = [n for n in names if n != "__name__"]
            label = others[0] if others else "job"

        # 3. A variable: label_values(metric, label)
        sel = {"match[]": metric, **rng}
        series = call("POST", "/api/v1/series", sel, list, f"series of {metric}")
        if not all(isinstance(s, dict) and s.get("__name__") == metric for s in series):
            raise Failed(f"series of {metric}: not label sets of it: {series[:3]}")
        values = call("GET", f"/api/v1/label/{label}/values", sel, list, f"values of {label}")

        # 4. A panel: Grafana's step for 1 h over ~1000 px is 15 s (rounded to the interval)
        expr = f"sum by ({label}) ({metric})"
        q = {"query": expr, **rng, "step": "15"}
        matrix = call("POST", "/api/v1/query_range", q, dict, f"query_range {expr}")
        if matrix.get("resultType") != "matrix":
            raise Failed(f"query_range: resultType {matrix.get('resultType')}")
        call("POST", "/api/v1/query_exemplars", {"query": expr, **rng}, list, "exemplars")
        table = call("POST", "/api/v1/query", {"query": expr, **t}, dict, f"instant {expr}")
        if table.get("resultType") != "vector":
            raise Failed(f"instant query: resultType {table.get('resultType')}")

        # 5. Format query
        pretty = call("GET", "/api/v1/format_query", {"query": expr}, str, "format_query")
        print(
            f"{metric}: {len(series)} series, {len(values)} values of {label}, "
            f"{len(matrix['result'])} panel series; formatted: {pretty}",
            file=out,
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("url", help="the data source URL, e.g. http://127.0.0.1:8080/promql/prom")
    ap.add_argument("--metric", help="the metric to query (default: the first listed)")
    ap.add_argument("--label", help="the label of the variable (default: the first listed)")
    how = ap.add_mutually_exclusive_group()
    how.add_argument(
        "--bearer",
        metavar="TOKEN",
        help="send 'Authorization: Bearer TOKEN' (default: $FILOPY_TOKEN)",
    )
    how.add_argument(
        "--basic", metavar="USER:PASSWORD", help="basic auth, as Grafana's (the token as password)"
    )
    args = ap.parse_args(argv)
    auth: httpx.Auth | None = None
    headers: dict[str, str] = {}
    if args.basic is not None:
        user, sep, password = args.basic.partition(":")
        if not sep:
            ap.error("--basic wants USER:PASSWORD")
        auth = httpx.BasicAuth(user, password)
    elif token := args.bearer or os.environ.get("FILOPY_TOKEN"):
        headers["Authorization"] = f"Bearer {token}"
    try:
        replay(args.url, args.metric, args.label, auth=auth, headers=headers)
    except (Failed, httpx.HTTPError) as e:
        print(f"FAILED {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
