"""The bed itself: hosts reach each other by name, faults cut what they say and heal undoes them,
and removing the bed leaves nothing behind."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from tests.netbed.bed import Bed, run, stale_namespaces
from tests.netbed.cluster import wait_for

PORT = 7777
SERVE = (
    "import socket\n"
    "s = socket.create_server(('0.0.0.0', 7777))\n"
    "while True:\n"
    "    c, _ = s.accept()\n"
    "    while c.recv(65536): pass\n"
    "    c.close()\n"
)


def _state(pid: int) -> str:
    """A process's state letter (R, S, T stopped, Z dead but not yet reaped), "" if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


def _comm(pid: int) -> str:
    """A process's command name, "" if gone."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _running(pid: int) -> bool:
    return _state(pid) not in ("", "Z")


def _serve(bed: Bed, host: str) -> None:
    bed.spawn(host, ["python3", "-c", SERVE], log=f"listener-{host}.log")
    wait_for(f"listener on {host}", lambda: bed.reaches(host, host, PORT))


def test_hosts_reach_each_other_by_name_and_faults_cut_exactly_what_they_say(bed: Bed) -> None:
    for host in ("node-1", "node-2", "head"):
        _serve(bed, host)
    resolved = bed.sh("client", ["getent", "hosts", "node-1"]).stdout.split()[0]
    assert resolved == bed.ip("node-1")
    assert bed.reaches("node-1", "node-2", PORT) and bed.reaches("node-2", "node-1", PORT)
    try:
        bed.partition("node-1", "node-2")
        assert not bed.reaches("node-1", "node-2", PORT)
        assert not bed.reaches("node-2", "node-1", PORT)
        assert bed.reaches("node-1", "head", PORT), "a partition cuts one link only"
        bed.heal()
        assert bed.reaches("node-1", "node-2", PORT)

        bed.isolate("node-2")
        assert not bed.reaches("node-1", "node-2", PORT)
        assert not bed.reaches("node-2", "head", PORT)
        assert bed.reaches("node-2", "node-2", PORT), "an isolated host still reaches itself"
        bed.heal()
        assert bed.reaches("node-2", "head", PORT)
    finally:
        bed.heal()


def test_one_way_partition_drops_packets_from_a_to_b_only(bed: Bed) -> None:
    _serve(bed, "node-3")
    try:
        bed.partition("node-3", "head", one_way=True)
        out = bed.sh("node-3", ["iptables", "-S", "FPB"]).stdout
        assert f"-d {bed.ip('head')}/32 -j DROP" in out
        assert f"-s {bed.ip('head')}" not in out, "the head's packets still arrive"
        # A TCP connection needs both directions: neither way completes, but the head's SYN
        # reaches node-3 (its listener's counter shows it), which a two-way cut would not allow.
        assert not bed.reaches("head", "node-3", PORT)
        assert not bed.reaches("node-3", "head", PORT)
    finally:
        bed.heal()
    assert bed.reaches("head", "node-3", PORT)


def test_slow_link_holds_its_rate(bed: Bed) -> None:
    """1 MB through a 1 Mbit/s link cannot take less than ~8 s less the bucket's burst: a bound a
    loaded machine can only exceed, never undercut."""
    _serve(bed, "gateway")
    send = (
        "import socket, time\n"
        "c = socket.create_connection(('gateway', 7777))\n"
        "t = time.monotonic(); c.sendall(b'x' * 1_000_000); c.shutdown(socket.SHUT_WR)\n"
        "c.recv(1); print(time.monotonic() - t)\n"
    )
    try:
        bed.slow("gateway", "1mbit")
        took = float(bed.sh("client", ["python3", "-c", send], timeout=120).stdout)
        assert took > 6.0, f"1 MB over a 1 Mbit/s link took {took:.1f} s"
    finally:
        bed.heal()
    took = float(bed.sh("client", ["python3", "-c", send], timeout=120).stdout)
    assert took < 6.0, f"after heal, 1 MB took {took:.1f} s"


def test_kill_and_pause_reach_every_process_of_a_host(bed: Bed) -> None:
    procs = [bed.spawn("redis", ["sleep", "600"], log="sleepers.log") for _ in range(3)]
    # The three sleeps themselves, not yet the shells that start them: a shell paused between
    # forking a helper (mkdir, mount) and its exec leaves that helper unreaped (Z), never stopped
    # (CI saw it, with two beds busy at once).
    wait_for("3 sleeps on redis", lambda: sorted(map(_comm, bed.pids("redis"))) == ["sleep"] * 3)
    assert bed.pause("redis") >= 3
    for pid in bed.pids("redis"):
        # A process in uninterruptible sleep (D: paging in, on a busy machine) stops on waking.
        wait_for(f"process {pid} of a paused host stopped", lambda pid=pid: _state(pid) == "T")
    assert bed.kill("redis") >= 3
    for p in procs:
        assert p.wait(timeout=10) == -signal.SIGKILL
    assert bed.pids("redis") == []


def test_remove_leaves_nothing_and_a_stale_bed_is_cleaned_first(bed: Bed, tmp_path: Path) -> None:
    """A second bed with a prefix of its own, so the session's bed is left alone."""
    prefix = "fpt-"
    other = Bed(tmp_path, hosts={"client": "10.231.0.30", "kafka": "10.231.0.2"}, prefix=prefix)
    other.create()
    other.spawn("client", ["sleep", "600"])
    deadline = time.monotonic() + 30  # `ip netns exec` enters it a moment after spawn returns
    while not other.pids("client") and time.monotonic() < deadline:
        time.sleep(0.1)
    pid = other.pids("client")[0] if other.pids("client") else None
    # A killed run leaves its bed behind: the next `create` removes it before making its own.
    other.create()
    assert sorted(stale_namespaces(prefix)) == ["fpt-client", "fpt-kafka"]
    assert pid is not None and not _running(pid), "the stale bed's process is gone"
    assert other.reaches("client", "kafka", 9) is False  # a fresh bed: nothing listens yet
    other.remove()
    assert stale_namespaces(prefix) == []
    assert prefix not in run(["ip", "-o", "link", "show"])
    assert not list(Path("/etc/netns").glob(prefix + "*"))
    assert stale_namespaces(bed.prefix), "the session's bed was not touched"
