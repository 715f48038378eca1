"""Terminal views of cluster state for the CLI: the shard grid in colour.

Colour carries the status at a glance (rich drops it when the output is not a terminal, so a
pipe or a log gets the same letters as `ShardMapper.render`).
"""

from __future__ import annotations

from collections.abc import Mapping

from rich.console import Group
from rich.text import Text

from core.mapper import ShardMapper, shard_ranges
from core.shard_status import (
    Active,
    Assigned,
    Degraded,
    Down,
    Error,
    Handoff,
    Recovery,
    ShardStatus,
    Stopped,
    Unassigned,
)

STYLES: dict[type[ShardStatus], str] = {
    Unassigned: "dim",
    Assigned: "cyan",
    Recovery: "yellow",
    Active: "green",
    Degraded: "bold yellow",
    Handoff: "bold cyan",
    Error: "bold red",
    Stopped: "blue",
    Down: "bold magenta",
}
PER_ROW = 32


def legend() -> Text:
    text = Text("Status legend: ")
    for status, style in STYLES.items():
        text.append(status.letter, style=style)
        text.append(f"={status.__name__} ")
    return text


def shard_grid(
    mapper: ShardMapper,
    title: str = "",
    names: Mapping[str, str] | None = None,
    refused: Mapping[str, str] | None = None,
) -> Group:
    """The legend, one coloured letter per shard (32 per row, in groups of 8), then the shards
    of each node (by `names`, node id -> name, where known) and the shards in Error or Degraded
    with their messages, and the nodes `refused` membership with why."""
    names = names or {}
    lines: list[Text] = [legend(), Text(f"----- {title or 'Status map'} -----", style="bold")]
    statuses = mapper.statuses
    for start in range(0, mapper.num_shards, PER_ROW):
        row = statuses[start : start + PER_ROW]
        line = Text(f"  {start:5d}-{start + len(row) - 1:<5d}  ")
        for i, st in enumerate(row):
            if i and i % 8 == 0:
                line.append(" ")
            line.append(st.letter, style=STYLES.get(type(st), ""))
        lines.append(line)
    lines.append(Text("----- Nodes -----", style="bold"))
    nodes = sorted(mapper.all_nodes(), key=lambda n: (names.get(n, n), n))
    for node in nodes:
        shards = mapper.shards_for_node(node)
        lines.append(
            Text(f"  {names.get(node, node)}: {len(shards)} shards: {shard_ranges(shards)}")
        )
    if not nodes:
        lines.append(Text("  (none)"))
    for node, why in sorted((refused or {}).items()):
        lines.append(Text(f"  refused {node}: {why}", style=STYLES[Error]))
    for shard, st in enumerate(statuses):
        if isinstance(st, Error):
            lines.append(Text(f"  shard {shard}: {st.message}", style=STYLES[Error]))
        elif isinstance(st, Degraded):
            lines.append(Text(f"  shard {shard} degraded: {st.message}", style=STYLES[Degraded]))
    return Group(*lines)
