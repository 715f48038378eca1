"""A steady writer for fault tests: Influx line protocol to an HTTP ingestion gateway, counting
exactly what was acknowledged.

    python -m tests.netbed.producer URL --series 50 --interval 0.2 --out acked.json

Every round writes one sample to each of `--series` series (`netbed_load,series=sNN value=R`) at
the round's own timestamp (1 ms apart from the previous round's, whatever the wall clock does),
as one request. A 204 means the gateway has the samples durably in Kafka: those rounds are
counted as acknowledged. A refused or failed request (503 while Kafka is away, a cut link) is
retried with the same body, so a sample is either acknowledged once or not at all. On SIGTERM it
finishes the request in flight and writes `--out`: the acknowledged rounds' timestamps, which is
everything a checker needs to know what must be stored, once.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

START_MS = 1_750_000_000_000


def body(series: int, ts_ms: int, value: int) -> bytes:
    lines = (f"netbed_load,series=s{i:03d} value={value} {ts_ms}" for i in range(series))
    return "\n".join(lines).encode()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("url", help="the gateway's write URL (…/ingest/DATASET/api/v2/write)")
    p.add_argument("--series", type=int, default=50)
    p.add_argument("--interval", type=float, default=0.2)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    stopping = False

    def stop(_s: int, _f: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    url = args.url + ("&" if "?" in args.url else "?") + "precision=ms"
    record: dict[str, Any] = {
        "series": args.series,
        "acked_ts": [],  # the acknowledged rounds' timestamps
        "ack_times": [],  # wall clock of each acknowledgement (gaps show stalls)
        "failures": 0,  # requests that failed and were retried
        "unavailable_503": 0,  # of those, 503s with Retry-After (the gateway said so)
        "final": False,
    }
    n = 0
    while not stopping:
        ts = START_MS + n
        data = body(args.series, ts, n)
        while not stopping:  # the same round until acknowledged
            try:
                req = urllib.request.Request(url, data=data, method="POST")
                with urllib.request.urlopen(req, timeout=60) as r:  # > the ack timeout
                    if r.status == 204:
                        record["acked_ts"].append(ts)
                        record["ack_times"].append(time.time())
                        break
            except urllib.error.HTTPError as e:
                if e.code == 503 and e.headers.get("Retry-After"):
                    record["unavailable_503"] += 1
                if e.code < 500:  # refused for good: retrying cannot help
                    detail = e.read().decode(errors="replace")[:300]
                    print(f"round {n}: {e} {detail}", file=sys.stderr, flush=True)
                    _write(args.out, record, final=True)
                    sys.exit(2)
                record["failures"] += 1
            except (urllib.error.URLError, OSError) as e:
                record["failures"] += 1
                if record["failures"] <= 3 or record["failures"] % 20 == 0:
                    print(f"round {n}: {e}", file=sys.stderr, flush=True)
            _write(args.out, record, final=False)  # a stall shows while it lasts
            time.sleep(0.5)
        n += 1
        if n % 25 == 0:
            _write(args.out, record, final=False)
        time.sleep(args.interval)
    _write(args.out, record, final=True)


def _write(out: Path, record: dict[str, Any], *, final: bool) -> None:
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({**record, "final": final}))
    tmp.replace(out)


if __name__ == "__main__":
    main()
