"""Ray on loopback, for a cluster that lives on one machine. Import before `import ray`.

Ray rewrites a loopback address given to `ray.init()` into the host's "reachable" address
(`ray._private.services.resolve_ip_for_localhost`), so a driver of a cluster bound to 127.0.0.1
would dial the host's IP and hang. With Ray's cluster switch off, Ray resolves its own address to
loopback. The switch is read when Ray is imported, hence this module's place before it.

A cluster spread over several machines must not bind to loopback: set FILOPY_RAY_LOOPBACK=0.
"""

from __future__ import annotations

import os
import sys

RAY_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
LOOPBACK = os.environ.get("FILOPY_RAY_LOOPBACK", "1") != "0"

if LOOPBACK and "ray" not in sys.modules:
    os.environ.setdefault(RAY_SWITCH, "0")


def check_loopback() -> None:
    """Fail clearly if Ray was imported too early to be bound to loopback."""
    from ray._private import ray_constants

    if LOOPBACK and ray_constants.ENABLE_RAY_CLUSTER:
        raise RuntimeError(
            f"Ray was imported before filopy.ray_env without {RAY_SWITCH}=0 in the environment, "
            "so it would dial the host's address instead of 127.0.0.1; import filopy.ray_env "
            "first, set the variable, or set FILOPY_RAY_LOOPBACK=0 for a multi-machine cluster"
        )
