"""The public `filopy` package gives what the docs' examples import from it, lazily."""

from __future__ import annotations

import subprocess
import sys

import filopy
from core.config import load_settings


def test_load_settings_is_public() -> None:
    from filopy import load_settings as public

    assert public is filopy.load_settings is load_settings


def test_importing_filopy_loads_no_settings_machinery() -> None:
    code = "import sys, filopy; print('core.config' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "False", out.stdout + out.stderr
