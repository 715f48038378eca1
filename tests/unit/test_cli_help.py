"""Every `--help` shows its text as written: words in brackets ("the settings' [gateway]
section") are not eaten as markup, in any command's description or any option's help."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import typer.main
from typer.testing import CliRunner

from filopy.cli.main import app


def _commands(cmd: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    yield path, cmd
    if hasattr(cmd, "commands"):  # a group (Typer ships its own click)
        for name, sub in cmd.commands.items():
            yield from _commands(sub, (*path, name))


def test_every_bracketed_word_of_every_help_text_is_shown() -> None:
    root = typer.main.get_command(app)
    runner = CliRunner()
    checked = 0
    for path, cmd in _commands(root):
        texts = [cmd.help or ""] + [getattr(p, "help", None) or "" for p in cmd.params]
        wanted = {m for t in texts for m in re.findall(r"\[[a-z_]+\]", t)}
        if not wanted:
            continue
        shown = runner.invoke(app, [*path, "--help"], terminal_width=400, env={"COLUMNS": "400"})
        assert shown.exit_code == 0, shown.output
        flat = " ".join(shown.output.split())
        for word in wanted:
            assert word in flat, f"`filopy {' '.join(path)} --help` lost {word}:\n{shown.output}"
            checked += 1
    assert checked >= 1, "the gateway's help names its [gateway] section"
