"""docker-compose.yml is valid and runs only commands that exist (no Docker engine needed)."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import yaml
from typer.main import get_command

from filopy.cli import app

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"


def test_compose_file_is_valid() -> None:
    out = subprocess.run(
        ["docker-compose", "-f", str(COMPOSE), "config"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    config = yaml.safe_load(out.stdout)
    assert {"kafka", "cassandra", "head", "worker1", "worker2"} <= set(config["services"])
    assert config["services"]["head"]["ports"][0]["published"] in (8080, "8080")
    for name in ("head", "worker1", "worker2"):
        assert config["services"][name]["depends_on"], name
        assert all(
            d["condition"] == "service_healthy"
            for d in config["services"][name]["depends_on"].values()
        )


def _commands() -> list[list[str]]:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    cmds = []
    for svc in services.values():
        if "build" not in svc:
            continue
        cmd = svc["command"]
        text = cmd if isinstance(cmd, str) else shlex.join(cmd)
        if text.startswith("sh -c "):
            text = shlex.split(text)[2]
        cmds += [shlex.split(part) for part in text.split("&&")]
    return cmds


def test_compose_runs_only_existing_filopy_and_ray_commands() -> None:
    cli = get_command(app)
    ray_help = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "ray"), "start", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    seen = set()
    for argv in _commands():
        if argv[0] == "exec":
            argv = argv[1:]
        seen.add(argv[0])
        if argv[0] == "filopy":
            sub = cli.commands[argv[1]]  # KeyError: the CLI has no such command
            rest = argv[2:]
            if hasattr(sub, "commands"):  # a group: `filopy node join`
                sub, rest = sub.commands[rest[0]], rest[1:]
            known = {opt for p in sub.params for opt in p.opts}
            flags = {a.split("=")[0] for a in rest if a.startswith("--")}
            assert flags <= known, (argv, flags - known)
        elif argv[:2] == ["ray", "start"]:
            for flag in (a.split("=")[0] for a in argv[2:] if a.startswith("--")):
                assert flag in ray_help, flag
        else:
            raise AssertionError(f"unexpected command in docker-compose.yml: {argv}")
    assert "filopy" in seen and seen <= {"filopy", "ray"}


def test_dockerfile_copies_what_exists() -> None:
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            for src in line.split()[1:-1]:
                assert (ROOT / src).exists(), src
