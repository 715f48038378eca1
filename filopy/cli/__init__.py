"""The shell: what people type (`filopy` CLI), the local launcher (`filopy up`), the demo and the
terminal views. Nothing below it imports it."""

from filopy.cli.main import app

__all__ = ["app"]
