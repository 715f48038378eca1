"""Ray on loopback, for a cluster that lives on one machine.

Ray rewrites a loopback address given to `ray.init()` into the host's "reachable" address
(`ray._private.services.resolve_ip_for_localhost`), so a driver of a cluster bound to 127.0.0.1
would dial the host's IP and hang. With Ray's cluster switch off, Ray resolves its own address to
loopback.

`bind_loopback()` turns the switch off, whatever was imported before: every place FiloPy starts
or joins a Ray cluster (`filopy.connect`, `filopy serve`, `local_cluster.LocalRayCluster`) calls
it right before, so no import order can get it wrong. Ray reads the switch into a module constant
when it is imported and looks the constant up each time it resolves an address, so the function
sets both the constant (for this process) and the environment variable (for the Ray processes
this one starts afterwards).

A cluster spread over several machines must not bind to loopback: set FILOPY_RAY_LOOPBACK=0.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

RAY_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
LOOPBACK_VAR = "FILOPY_RAY_LOOPBACK"


def loopback() -> bool:
    """Whether FiloPy binds Ray to 127.0.0.1 (the default; FILOPY_RAY_LOOPBACK=0 turns it off)."""
    return os.environ.get(LOOPBACK_VAR, "1") != "0"


def bind_loopback() -> None:
    """Make Ray resolve this machine's address to 127.0.0.1 from now on. Call before
    `ray.init()` or starting Ray nodes; a no-op with FILOPY_RAY_LOOPBACK=0."""
    if not loopback():
        return
    os.environ[RAY_SWITCH] = "0"  # Ray processes started from here on (raylets, workers)
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:  # Ray already imported: its constant was read then
        constants.ENABLE_RAY_CLUSTER = False  # type: ignore[attr-defined]


# Importing this module early still helps code that calls `ray.init()` itself.
if loopback() and "ray" not in sys.modules:
    os.environ.setdefault(RAY_SWITCH, "0")


AUTH_MODE_VAR = "RAY_AUTH_MODE"
TOKEN_PATH_VAR = "RAY_AUTH_TOKEN_PATH"


def ray_token_env(token_path: Path | None) -> dict[str, str]:
    """The environment that makes Ray's processes and drivers authenticate with the token in
    `token_path` (Ray's token authentication); nothing when there is no token, or when the user
    chose Ray's auth mode (RAY_AUTH_MODE) themselves."""
    if token_path is None or AUTH_MODE_VAR in os.environ:
        return {}
    return {AUTH_MODE_VAR: "token", TOKEN_PATH_VAR: str(token_path)}


def use_ray_token(token_path: Path | None) -> None:
    """Authenticate this process' Ray connections with the token in `token_path`, before
    `ray.init()` or starting a node. Ray reads its auth mode into its config when imported, so
    the config is read again (as Ray does when it turns token auth on itself)."""
    env = ray_token_env(token_path)
    if not env:
        return
    os.environ.update(env)
    raylet = sys.modules.get("ray._raylet")
    if raylet is not None:
        raylet.Config.initialize("")
