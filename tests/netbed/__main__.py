"""The bed from a shell, for an operator who wants to look around or reproduce a test by hand.

    python -m tests.netbed up                   make the bed (removing any earlier one)
    python -m tests.netbed status               hosts, addresses, processes, faults in force
    python -m tests.netbed exec HOST -- CMD...  run a command on a host
    python -m tests.netbed partition A B [--one-way] | isolate HOST | slow HOST [RATE] | heal
    python -m tests.netbed kill HOST | pause HOST | resume HOST
    python -m tests.netbed down                 remove the bed and everything it runs

Needs root. The work directory is $FILOPY_NETBED_DIR (default .netbed/).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from tests.netbed.bed import CHAIN, HOSTS, Bed, namespace, remove_all, run, stale_namespaces


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m tests.netbed", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("up")
    sub.add_parser("down")
    sub.add_parser("status")
    sub.add_parser("heal")
    e = sub.add_parser("exec")
    e.add_argument("host", choices=sorted(HOSTS))
    e.add_argument("argv", nargs=argparse.REMAINDER)
    pa = sub.add_parser("partition")
    pa.add_argument("a", choices=sorted(HOSTS))
    pa.add_argument("b", choices=sorted(HOSTS))
    pa.add_argument("--one-way", action="store_true")
    s = sub.add_parser("slow")
    s.add_argument("host", choices=sorted(HOSTS))
    s.add_argument("rate", nargs="?", default="1mbit")
    for name in ("isolate", "kill", "pause", "resume"):
        sub.add_parser(name).add_argument("host", choices=sorted(HOSTS))
    args = p.parse_args()
    bed = Bed(Path(os.environ.get("FILOPY_NETBED_DIR", ".netbed")).resolve())
    if args.cmd == "up":
        bed.create()
        print(f"bed up: {len(HOSTS)} hosts on {BED_RANGE}; work directory {bed.workdir}")
    elif args.cmd == "down":
        remove_all()
        print("bed removed")
    elif args.cmd == "status":
        if not stale_namespaces():
            print("no bed")
            return 0
        for host, ip in HOSTS.items():
            rules = run(["ip", "netns", "exec", namespace(host), "iptables", "-S", CHAIN],
                        check=False).count("-j DROP")  # fmt: skip
            print(f"{host:10} {ip:12} {len(bed.pids(host)):3} processes  {rules} drop rules")
    elif args.cmd == "exec":
        argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        return subprocess.call(bed.argv(args.host, argv or ["bash"]))
    elif args.cmd == "partition":
        bed.partition(args.a, args.b, one_way=args.one_way)
    elif args.cmd == "slow":
        bed.slow(args.host, args.rate)
    else:
        result = getattr(bed, args.cmd)(*([args.host] if hasattr(args, "host") else []))
        if isinstance(result, int):
            print(f"{result} processes signalled")
    return 0


BED_RANGE = "10.231.0.0/24"

if __name__ == "__main__":
    sys.exit(main())
