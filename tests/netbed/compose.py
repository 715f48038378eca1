"""docker-compose.yml run for real without a container engine: one bed host per service.

Each service gets a host of the bed named as the service (names resolve as on a compose network)
and runs there:
- a service built from the project's `Dockerfile`: its `command`, split as compose splits it
  (a string is split like a shell word list, with no shell; `sh -c "..."` brings its own), with
  the Dockerfile's `ENV` and the service's `environment`, the project's virtual environment
  standing in for the image's Python, from the repository root (the image's working directory);
- the `kafka` and `cassandra` images: the project's jars through `scripts/services.sh`, with what
  the compose file sets that matters here (the address Kafka advertises, Cassandra's heap).
Services start in `depends_on` order; a dependency with `condition: service_healthy` is waited
for by running its own `healthcheck.test` on its host (for the two images, whose checks call
their images' tools, by services.sh's readiness check, which asks the same question). A service
whose `restart` policy asks for it is started again on a clean host when its command exited with
an error (`restart_exited`, while the test waits for the cluster to form).
"""

from __future__ import annotations

import re
import shlex
from graphlib import TopologicalSorter
from pathlib import Path
from typing import Any

import yaml

from tests.netbed.bed import Bed, BedError
from tests.netbed.cluster import wait_for

IMAGE_SERVICES = ("kafka", "cassandra")


def load(compose: Path) -> dict[str, Any]:
    return dict(yaml.safe_load(compose.read_text())["services"])


def dockerfile_env(dockerfile: Path) -> dict[str, str]:
    """The `ENV` of the Dockerfile (KEY=VALUE pairs, continued lines joined)."""
    text = dockerfile.read_text().replace("\\\n", " ")
    env: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("ENV "):
            for pair in shlex.split(line[4:]):
                key, _, value = pair.partition("=")
                env[key] = value
    return env


def command_argv(command: str | list[str]) -> list[str]:
    """A service's command as compose runs it: a list as is, a string split into words."""
    return list(command) if isinstance(command, list) else shlex.split(command)


def start_order(services: dict[str, Any]) -> list[str]:
    graph = {name: set(svc.get("depends_on") or {}) for name, svc in services.items()}
    return list(TopologicalSorter(graph).static_order())


class ComposeRun:
    def __init__(self, bed: Bed, root: Path, compose: Path) -> None:
        self.bed, self.root = bed, root
        self.services = load(compose)
        self.image_env = dockerfile_env(root / "Dockerfile")
        self.tmp = Path("/tmp") / bed.prefix.rstrip(
            "-"
        )  # each service's own /tmp, as in a container

    def start(self) -> None:
        for name in start_order(self.services):
            svc = self.services[name]
            for dep, cond in (svc.get("depends_on") or {}).items():
                if isinstance(cond, dict) and cond.get("condition") == "service_healthy":
                    self.wait_healthy(dep)
            self.start_service(name)

    def start_service(self, name: str) -> None:
        svc = self.services[name]
        if name in IMAGE_SERVICES:
            self._start_image(name, svc)
            return
        assert "build" in svc, f"{name}: neither built from the Dockerfile nor a known image"
        env = {
            "PATH": f"{self.root / '.venv' / 'bin'}:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            **self.image_env,
            **{k: str(v) for k, v in (svc.get("environment") or {}).items()},
        }
        argv = command_argv(svc["command"])
        self.bed.spawn(name, argv, env=env, log=f"compose-{name}.log", cwd=self.root)

    def restart_exited(self) -> None:
        """Start again, on a clean host, each built service whose command exited and whose
        `restart` policy says so (`on-failure`: after an error), as compose would."""
        for name, svc in self.services.items():
            policy = svc.get("restart", "no")
            if "build" in svc and policy != "no":
                self.bed.restart_exited(name, failed_only=policy == "on-failure")

    def exec(self, name: str, argv: list[str]) -> str:
        """`docker compose exec NAME ARGV`: a command on a built service's host, in its
        environment; its stdout."""
        svc = self.services[name]
        env = {
            "PATH": f"{self.root / '.venv' / 'bin'}:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            **self.image_env,
            **{k: str(v) for k, v in (svc.get("environment") or {}).items()},
        }
        return self.bed.sh(name, argv, env=env, cwd=self.root, timeout=120).stdout

    def _start_image(self, name: str, svc: dict[str, Any]) -> None:
        env = {k: str(v) for k, v in (svc.get("environment") or {}).items()}
        services_env = {
            "FILOPY_SERVICES_DIR": str(self.bed.workdir / f"compose-{name}"),
            "FILOPY_SERVICES_CACHE": str(self.root / ".services" / "cache"),
        }
        if name == "kafka":
            m = re.fullmatch(r"PLAINTEXT://([\w.-]+):(\d+)", env["KAFKA_ADVERTISED_LISTENERS"])
            assert m, env["KAFKA_ADVERTISED_LISTENERS"]
            services_env |= {"FILOPY_SERVICES_HOST": m.group(1), "FILOPY_KAFKA_PORT": m.group(2)}
        else:
            services_env |= {
                "FILOPY_SERVICES_HOST": name,
                "FILOPY_CASSANDRA_HEAP": env.get("MAX_HEAP_SIZE", "1G"),
            }
        script = str(self.root / "scripts" / "services.sh")
        self.bed.sh(name, ["bash", script, "up", name], env=services_env, timeout=900)

    def healthy(self, name: str) -> bool:
        if name in IMAGE_SERVICES:
            return True  # services.sh returned only once it answered a real request
        test = self.services[name]["healthcheck"]["test"]
        kind, *rest = test
        argv = ["sh", "-c", rest[0]] if kind == "CMD-SHELL" else rest
        if argv[0] == "python":
            argv = [str(self.root / ".venv" / "bin" / "python"), *argv[1:]]
        try:
            self.bed.sh(name, argv, timeout=30)
        except (BedError, TimeoutError):
            return False
        return True

    def wait_healthy(self, name: str, timeout_s: float = 300.0) -> None:
        def healthy() -> bool:
            self.restart_exited()
            return self.healthy(name)

        wait_for(f"compose service {name} healthy", healthy, timeout_s)

    def logs(self, lines: int = 20) -> str:
        out = []
        for log in sorted(self.bed.workdir.glob("compose-*.log")):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {log.name}\n" + "\n".join(tail))
        return "\n".join(out)
