"""The configuration reference (docs/configuration.md), generated from config/filopy.toml.

The default file is where every setting is documented: its comment lines say what a setting
means, its value is the default. This renders them as a table and checks that the file and the
typed `Settings` name exactly the same settings, so the reference cannot drift from the code.
Run `python -m filopy.config_doc > docs/configuration.md` after changing a setting.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from pydantic import BaseModel

from core.config import DEFAULT_CONFIG_FILE, Settings

HEADER = """# Configuration reference

Generated from `config/filopy.toml` by `python -m filopy.config_doc`; a test fails when this page
and the code disagree. Precedence, highest first: environment variables
`FILOPY_<SECTION>__<KEY>`, the user file named by `FILOPY_CONFIG` (TOML, any subset of the
settings), then `config/filopy.toml`.
"""


def documented_settings(path: Path = DEFAULT_CONFIG_FILE) -> dict[str, tuple[str, str]]:
    """`section.key` -> (default as TOML text, meaning) from the default file."""
    out: dict[str, tuple[str, str]] = {}
    values = tomllib.loads(path.read_text())
    section, comment = "", []
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line.startswith("[") and line.endswith("]"):
            section, comment = line[1:-1], []
        elif line.startswith("#"):
            comment.append(line.lstrip("#").strip())
        elif "=" in line and section:
            key = line.split("=", 1)[0].strip()
            default = json.dumps(values[section][key], default=str)
            out[f"{section}.{key}"] = (default, " ".join(comment))
            comment = []
        elif not line:
            comment = []
    return out


def model_settings() -> set[str]:
    """`section.key` for every field of the typed settings."""
    names = set()
    for section, field in Settings.model_fields.items():
        model = field.annotation
        assert isinstance(model, type) and issubclass(model, BaseModel)
        names |= {f"{section}.{key}" for key in model.model_fields}
    return names


def render() -> str:
    documented = documented_settings()
    missing, unknown = model_settings() - set(documented), set(documented) - model_settings()
    if missing or unknown:
        raise ValueError(
            f"config/filopy.toml and Settings disagree: missing {sorted(missing)}, "
            f"unknown {sorted(unknown)}"
        )
    lines = [HEADER]
    section = ""
    for name, (default, meaning) in documented.items():
        sec, key = name.split(".", 1)
        if sec != section:
            section = sec
            lines += [f"\n## [{sec}]\n", "| setting | default | environment variable | meaning |"]
            lines.append("|---|---|---|---|")
        env = f"FILOPY_{sec.upper()}__{key.upper()}"
        lines.append(f"| `{key}` | `{default}` | `{env}` | {meaning or '—'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render(), end="")
