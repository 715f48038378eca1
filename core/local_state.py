"""Where `filopy up` records the local cluster it runs (a JSON state file), and reading it back.

Its own module, below the client and the shell: `filopy.connect("auto")` finds a cluster that
`filopy up` started from here, and the launcher writes the same record.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

STATE_FILE = "local-cluster.json"
ADMIN_TOKEN_FILE = "admin-token"  # mode 0600: the admin token `filopy up` made (docs/security.md)
RAY_TOKEN_FILE = "ray-token"  # mode 0600: the token Ray's processes and drivers authenticate with


@dataclass(frozen=True)
class LocalCluster:
    """What `up` started, as written to the state file."""

    pid: int
    ray_address: str
    rest_url: str
    nodes: int
    namespace: str
    log: str
    started_services: tuple[str, ...]


def state_dir() -> Path:
    """Where the state file and log live: `$FILOPY_STATE_DIR`, else `.filopy` here."""
    return Path(os.environ.get("FILOPY_STATE_DIR", ".filopy"))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def running(directory: Path | None = None) -> LocalCluster | None:
    """The local cluster started from this state directory, if its supervisor still runs."""
    path = (directory or state_dir()) / STATE_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    data["started_services"] = tuple(data.get("started_services", ()))
    cluster = LocalCluster(**data)
    return cluster if alive(cluster.pid) else None


def admin_token(directory: Path | None = None) -> str | None:
    """The admin token `filopy up` keeps in the state directory, if there is one."""
    try:
        return ((directory or state_dir()) / ADMIN_TOKEN_FILE).read_text().strip() or None
    except OSError:
        return None


def ray_token_path(directory: Path | None = None, *, create: bool = False) -> Path | None:
    """The Ray token file of this state directory (made, 0600, if `create`), or None if there
    is none: a `filopy up` cluster admits only Ray processes and drivers that hold it."""
    path = (directory or state_dir()) / RAY_TOKEN_FILE
    if create and not path.exists():
        write_private(path, secrets.token_hex(32))
    return path.resolve() if path.exists() else None


def write_private(path: Path, text: str) -> None:
    """Replace `path` with `text`, readable by this user only (0600) from its first byte: a
    file next to it is written and renamed over it, so no reader sees it half written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o600)  # also when a stale .tmp was there with other bits
    os.replace(tmp, path)
