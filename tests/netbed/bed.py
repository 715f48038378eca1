"""A test bed of hosts on one machine: one Linux network namespace per host, on one bridge.

Every host of the bed is a network namespace `fpb-NAME` with one interface (`eth0`, a veth whose
other end sits on the bridge `fpb-br0`) and one address in 10.231.0.0/24, a range nothing else on
these machines uses. The root namespace has no address on the bridge, so traffic stays between the
bed's own hosts. Names resolve through `/etc/netns/fpb-NAME/hosts` (what `ip netns exec` mounts
over `/etc/hosts`), so a process in the bed dials `kafka:9092` as it would on real machines.

Faults are iptables rules in a chain of each host's own (`FPB`, jumped to from INPUT and OUTPUT)
and a token bucket (`tc ... tbf`) on a host's links; `heal()` removes them all. `kill(host)` and
`pause(host)` reach every process of the host: whatever runs in its namespace.

The bed is made and removed by itself, idempotently: `create()` first removes whatever an earlier
bed left (namespaces, their processes, veths, the bridge, hosts files), also one whose test was
killed, so one run never inherits another's state. The file system is shared: hosts keep their
data in directories of their own under the bed's work directory.

Needs root and iproute2 + iptables (scripts/system-deps.sh). Run `python -m tests.netbed` for a
command line over the same functions (`up`, `down`, `status`, `exec HOST -- CMD`, the faults).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# FILOPY_NETBED_PREFIX (at most 6 bytes, 5 under pytest-xdist, which adds the worker's number:
# interface names are short) makes an independent bed, so two sessions on one machine do not
# remove each other's.
PREFIX = os.environ.get("FILOPY_NETBED_PREFIX", "fpb-")
BRIDGE = PREFIX + "br0"
SUBNET = "10.231.0"
CHAIN = "FPB"
# Each host's own /tmp/ray (sessions, logs, sockets) lives under here, by bed prefix and host:
# short, as a socket's path is at most 107 bytes.
RAY_TEMP = Path("/tmp/netbed")

# The hosts of the bed and their addresses; `redis` holds Ray's control store (head failover).
HOSTS: dict[str, str] = {
    "kafka": f"{SUBNET}.2",
    "cassandra": f"{SUBNET}.3",
    "redis": f"{SUBNET}.4",
    "head": f"{SUBNET}.10",
    "node-1": f"{SUBNET}.11",
    "node-2": f"{SUBNET}.12",
    "node-3": f"{SUBNET}.13",
    "gateway": f"{SUBNET}.20",
    "client": f"{SUBNET}.30",
}


# What the test process set for itself and a fresh shell on a host would not have: Ray's loopback
# switch (tests bind one-host clusters to 127.0.0.1) and a Ray address to join.
NOT_INHERITED = ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "FILOPY_RAY_LOOPBACK", "RAY_ADDRESS")


def host_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a command on a host: this process's, less `NOT_INHERITED`."""
    env = {k: v for k, v in os.environ.items() if k not in NOT_INHERITED}
    return {**env, **(extra or {})}


class BedError(RuntimeError):
    """A bed command failed; the message holds the command and what it printed."""


def run(argv: Sequence[str], *, check: bool = True, timeout: float = 30.0) -> str:
    """Run a command of the bed's plumbing; its output, or BedError with it."""
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise BedError(f"{shlex.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def namespace(host: str, prefix: str = PREFIX) -> str:
    return prefix + host


def _veth(host: str, prefix: str = PREFIX) -> str:
    return prefix + host  # the bridge's end of the host's link (interface names <= 15 bytes)


def stale_namespaces(prefix: str = PREFIX) -> list[str]:
    """Namespaces of a bed (this one or one left by an earlier run)."""
    out = run(["ip", "netns", "list"], check=False)
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return [n for n in names if n.startswith(prefix)]


def pids_of(ns: str) -> list[int]:
    """Every process whose network namespace is `ns`."""
    out = run(["ip", "netns", "pids", ns], check=False)
    return [int(p) for p in out.split() if p.isdigit() and int(p) != os.getpid()]


def _signal_all(ns: str, sig: int) -> int:
    sent = 0
    for pid in pids_of(ns):
        try:
            os.kill(pid, sig)
            sent += 1
        except ProcessLookupError:
            pass
    return sent


def remove_all(deadline_s: float = 20.0, prefix: str = PREFIX) -> None:
    """Remove every trace of any bed: kill its processes, delete its namespaces, veths, bridge and
    hosts files. Safe to call at any time, as often as wanted."""
    for ns in stale_namespaces(prefix):
        _signal_all(ns, signal.SIGCONT)  # a paused process cannot die of SIGKILL until resumed
        _signal_all(ns, signal.SIGKILL)
    end = time.monotonic() + deadline_s
    for ns in stale_namespaces(prefix):
        while pids_of(ns) and time.monotonic() < end:
            time.sleep(0.1)
        run(["ip", "netns", "delete", ns], check=False)
    for line in run(["ip", "-o", "link", "show"], check=False).splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if name.startswith(prefix):
            run(["ip", "link", "delete", name], check=False)
    shutil.rmtree(RAY_TEMP / prefix.rstrip("-"), ignore_errors=True)
    netns_etc = Path("/etc/netns")
    if netns_etc.is_dir():
        for d in netns_etc.glob(prefix + "*"):
            for f in d.iterdir():
                f.unlink()
            d.rmdir()


@dataclass
class Bed:
    """The bed's hosts, its work directory and the processes started in it."""

    workdir: Path
    hosts: Mapping[str, str] = field(default_factory=lambda: dict(HOSTS))
    # Names of namespaces, links and the bridge start with this; another prefix makes a second,
    # independent bed (the bed's own tests use one to check removal without touching this one).
    prefix: str = PREFIX
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    # Per host, its last long-running process and how to start that again (`restart_exited`).
    _last: dict[str, tuple[subprocess.Popen[bytes], Callable[[], object]]] = field(
        default_factory=dict
    )

    # ----- making and removing ------------------------------------------------------------------

    def create(self) -> Bed:
        """Remove any earlier bed, then make this one: namespaces, links, addresses, names."""
        remove_all(prefix=self.prefix)
        self.workdir.mkdir(parents=True, exist_ok=True)
        bridge = self.prefix + "br0"
        run(["ip", "link", "add", bridge, "type", "bridge"])
        run(["ip", "link", "set", bridge, "up"])
        hosts_file = "127.0.0.1 localhost\n" + "".join(
            f"{ip} {name}\n" for name, ip in self.hosts.items()
        )
        for name, ip in self.hosts.items():
            ns = self.ns(name)
            run(["ip", "netns", "add", ns])
            etc = Path("/etc/netns") / ns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(hosts_file)
            (etc / "hostname").write_text(name + "\n")
            # No name server: the machine's own is beyond the bed, and with a default route a
            # query to it would wait out its timeout (gRPC's resolver, Ray's, waits 5 s) before
            # the hosts file answers. Refused at once on loopback instead.
            (etc / "resolv.conf").write_text("nameserver 127.0.0.1\n")
            veth = _veth(name, self.prefix)
            run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
            run(["ip", "link", "set", veth, "master", bridge, "up"])
            run(["ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0"])
            run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            run(["ip", "-n", ns, "link", "set", "lo", "up"])
            # A default route, as machines have: programs that find their address by routing
            # towards the internet (Ray does) see eth0's. Nothing answers beyond the bridge.
            run(["ip", "-n", ns, "route", "add", "default", "dev", "eth0"])
            self._iptables(name, "-N", CHAIN)
            self._iptables(name, "-A", "INPUT", "-j", CHAIN)
            self._iptables(name, "-A", "OUTPUT", "-j", CHAIN)
        return self

    def remove(self) -> None:
        """Stop everything the bed runs and remove the bed (idempotent)."""
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
        remove_all(prefix=self.prefix)
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)
        self.procs.clear()
        self._last.clear()

    def __enter__(self) -> Bed:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.remove()

    # ----- running things on hosts -------------------------------------------------------------

    def ip(self, host: str) -> str:
        return self.hosts[host]

    def ray_dir(self, host: str) -> Path:
        """What `host` sees as /tmp/ray (its Ray sessions and their logs)."""
        return RAY_TEMP / self.prefix.rstrip("-") / host

    def clear_ray_dirs(self) -> None:
        """Empty every host's /tmp/ray (call with nothing running on the bed's hosts)."""
        shutil.rmtree(RAY_TEMP / self.prefix.rstrip("-"), ignore_errors=True)

    def ns(self, host: str) -> str:
        return namespace(host, self.prefix)

    def argv(self, host: str, argv: Sequence[str]) -> list[str]:
        """`argv` as run on `host`: inside its namespace (its hosts file mounted), with a /tmp/ray
        of its own. Machines do not share Ray's directory; hosts of one machine would (a node
        takes its head's temp directory by path, so two nodes would race for the same sockets).
        `ip netns exec` runs in a mount namespace of its own, so the bind mount stays there."""
        own = RAY_TEMP / self.prefix.rstrip("-") / host
        mount = 'mkdir -p /tmp/ray "$0" && mount --bind "$0" /tmp/ray && exec "$@"'
        return ["ip", "netns", "exec", self.ns(host), "sh", "-c", mount, str(own), *argv]

    def spawn(
        self,
        host: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        log: str | None = None,
        cwd: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start a long-running process on `host`; its output goes to `log` in the work
        directory (default: HOST.log). The bed kills it on removal, with all of the host."""
        out = open(self.workdir / (log or f"{host}.log"), "ab")  # noqa: SIM115 (the child owns it)
        proc = subprocess.Popen(
            self.argv(host, argv),
            env=host_env(env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            start_new_session=True,
        )
        out.close()
        self.procs.append(proc)
        again = functools.partial(self.spawn, host, list(argv), env=env, log=log, cwd=cwd)
        self._last[host] = (proc, again)
        return proc

    def exited(self, host: str) -> int | None:
        """The exit code of the host's last long-running command; None while it runs, or if
        none was started there."""
        return self._last[host][0].poll() if host in self._last else None

    def restart_exited(self, host: str, *, failed_only: bool = False) -> bool:
        """Start the host's last long-running command again on a clean host (its processes
        killed) if it exited (`failed_only`: with an error), as a service manager (systemd's
        Restart=, compose's `restart:`) would. Whether it did (not if none was started there)."""
        code = self.exited(host)
        if code is None or (failed_only and code == 0):
            return False
        self.restart(host)
        return True

    def restart(self, host: str) -> None:
        """Start the host's last long-running command again, on a clean host."""
        self.kill(host)
        self._last[host][1]()

    def sh(
        self,
        host: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout: float = 120.0,
        cwd: Path | None = None,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """Run a command on `host` to its end; BedError (with its output) if it fails."""
        proc = subprocess.run(
            self.argv(host, argv),
            env=host_env(env),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        if check and proc.returncode != 0:
            raise BedError(
                f"on {host}: {shlex.join(argv)} exited {proc.returncode}\n"
                f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
            )
        return proc

    def pids(self, host: str) -> list[int]:
        return pids_of(self.ns(host))

    # ----- faults ------------------------------------------------------------------------------

    def _iptables(self, host: str, *args: str) -> None:
        run(["ip", "netns", "exec", self.ns(host), "iptables", "-w", *args])

    def partition(self, a: str, *others: str, one_way: bool = False) -> None:
        """Cut the links between host `a` and each of `others`, all at once (one rule naming
        them all: cut one by one, the first could fail over before the last is cut on a busy
        machine); with `one_way`, only packets from `a` to them are dropped (they still reach
        `a`, though no TCP connection completes either way)."""
        addresses = ",".join(self.ip(b) for b in others)
        self._iptables(a, "-A", CHAIN, "-d", addresses, "-j", "DROP")
        if not one_way:
            self._iptables(a, "-A", CHAIN, "-s", addresses, "-j", "DROP")

    def isolate(self, host: str) -> None:
        """Cut `host` off from every other host (its own loopback keeps working)."""
        self._iptables(host, "-A", CHAIN, "-o", "eth0", "-j", "DROP")
        self._iptables(host, "-A", CHAIN, "-i", "eth0", "-j", "DROP")

    def slow(self, host: str, rate: str = "1mbit") -> None:
        """Limit `host`'s link to `rate` both ways (a token bucket on each end of its veth)."""
        for dev, ns in (("eth0", self.ns(host)), (_veth(host, self.prefix), None)):
            prefix = ["ip", "netns", "exec", ns] if ns else []
            run([*prefix, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
                 "burst", "32kbit", "latency", "400ms"])  # fmt: skip

    def heal(self) -> None:
        """Undo every partition, isolation and slow link."""
        for host in self.hosts:
            self._iptables(host, "-F", CHAIN)
            run(["ip", "netns", "exec", self.ns(host), "tc", "qdisc", "del", "dev", "eth0",
                 "root"], check=False)  # fmt: skip
            run(["tc", "qdisc", "del", "dev", _veth(host, self.prefix), "root"], check=False)

    def kill(self, host: str, deadline_s: float = 60.0) -> int:
        """SIGKILL every process of `host` (as when its machine dies) and wait until they are
        gone, so what they listened on is free (the next cluster's Kafka starts on the same
        port); how many there were."""
        ns = self.ns(host)
        _signal_all(ns, signal.SIGCONT)
        killed = _signal_all(ns, signal.SIGKILL)
        end = time.monotonic() + deadline_s
        while (left := pids_of(ns)) and time.monotonic() < end:
            time.sleep(0.1)
        if left:
            raise BedError(f"{host}: processes {left} still alive {deadline_s:g} s after SIGKILL")
        return killed

    def pause(self, host: str) -> int:
        """SIGSTOP every process of `host` (a machine that hangs); `resume` undoes it."""
        return _signal_all(self.ns(host), signal.SIGSTOP)

    def resume(self, host: str) -> int:
        return _signal_all(self.ns(host), signal.SIGCONT)

    def reaches(self, a: str, b: str, port: int, timeout: float = 1.0) -> bool:
        """Whether a TCP connection from `a` to `b:port` completes."""
        code = (
            "import socket,sys\n"
            "try: socket.create_connection((sys.argv[1], int(sys.argv[2])), "
            f"timeout={timeout}).close()\n"
            "except OSError: sys.exit(1)\n"
        )
        proc = self.sh(a, ["python3", "-c", code, self.ip(b), str(port)], check=False)
        return proc.returncode == 0
