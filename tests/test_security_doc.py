"""docs/security.md's shell blocks, as written, on a fresh store: making, listing and revoking
tokens with the CLI (no cluster needed: tokens live in the store the settings name)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "security.md"


def test_the_token_block_runs_as_written(tmp_path: Path) -> None:
    (block,) = re.findall(r"^```bash\n(.*?)^```\s*$", DOC.read_text(), re.S | re.M)
    env = {
        "PATH": f"{ROOT / '.venv' / 'bin'}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "FILOPY_STORE__SQLITE_PATH": str(tmp_path / "filopy.db"),
        "FILOPY_STATE_DIR": str(tmp_path / "state"),
        **({"FILOPY_CONFIG": os.environ["FILOPY_CONFIG"]} if "FILOPY_CONFIG" in os.environ else {}),
    }
    proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert re.search(r"^fpy_[0-9a-f]{12}_\S{43}$", proc.stdout, re.M), out  # vmagent-eu's token
    assert "grafana" in proc.stdout and "vmagent-eu" in proc.stdout  # the list
    assert re.search(r"token 'grafana' \(id [0-9a-f]{12}\) revoked", proc.stdout), out
