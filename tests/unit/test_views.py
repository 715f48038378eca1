"""The CLI's coloured shard grid: letters match the mapper's text grid, colours the status."""

from __future__ import annotations

from rich.console import Console

from core.dataset import DatasetRef
from core.mapper import ShardMapper
from core.shard_status import (
    Active,
    Degraded,
    Down,
    Error,
    IngestionDegraded,
    IngestionError,
    IngestionStarted,
    IngestionStopped,
    Recovery,
    RecoveryInProgress,
    ShardDown,
    ShardStatus,
)
from filopy.cli.views import STYLES, shard_grid
from tests.mapper_helpers import merge_from, register_node


def _mapper() -> ShardMapper:
    ref = DatasetRef(name="prom")
    m = ShardMapper(64)
    register_node(m, range(0, 20), "node-a")
    register_node(m, [20, 21, 22, 23, 30, 31], "node-b")
    for s in range(0, 10):
        m.update_from_event(IngestionStarted(ref, s, "node-a"))
    m.update_from_event(RecoveryInProgress(ref, 10, "node-a", 40))
    m.update_from_event(IngestionDegraded(ref, 11, "node-a", "store unavailable: locked"))
    m.update_from_event(IngestionError(ref, 22, "node-b", "disk full"))
    m.update_from_event(ShardDown(ref, 30, "node-b"))
    m.update_from_event(IngestionStopped(ref, 31, "node-b"))
    return m


def _render(m: ShardMapper, color: bool) -> tuple[str, list]:
    console = Console(record=True, width=120, force_terminal=color, color_system="standard")
    console.print(shard_grid(m, "prom"))
    return console.export_text(styles=False, clear=False), console


def test_grid_text_has_a_letter_per_shard_by_rows_of_32_and_node_lists() -> None:
    m = _mapper()
    text, _ = _render(m, color=False)
    lines = text.splitlines()
    assert lines[0].startswith("Status legend: .=Unassigned N=Assigned R=Recovery A=Active")
    row0 = next(line for line in lines if line.strip().startswith("0-31"))
    letters = row0.split("0-31", 1)[1].split()
    assert "".join(letters) == "".join(m.status(s).letter for s in range(32))
    assert [len(g) for g in letters] == [8, 8, 8, 8]
    assert any(line.strip().startswith("32-63") for line in lines)
    assert "  node-a: 20 shards: 0-19" in lines
    assert "  node-b: 4 shards: 20-21, 23, 31" in lines
    assert "  shard 22: disk full" in lines
    assert "  shard 11 degraded: store unavailable: locked" in lines
    assert "!=Degraded" in lines[0]


def test_each_status_letter_is_printed_in_its_colour() -> None:
    m = _mapper()
    grid = shard_grid(m, "prom")
    row0 = grid.renderables[2]  # legend, title, then the first row of shards
    styles: dict[str, set[str]] = {}
    for span in row0.spans:
        letter = row0.plain[span.start : span.end]
        styles.setdefault(letter, set()).add(str(span.style))
    assert styles["A"] == {STYLES[Active]}
    assert styles["R"] == {STYLES[Recovery]}
    assert styles["E"] == {STYLES[Error]}
    assert styles["!"] == {STYLES[Degraded]}
    assert styles["D"] == {STYLES[Down]}
    _, console = _render(m, color=True)
    assert "\x1b[32mA" in console.export_text(styles=True)  # green in a terminal


def test_degraded_is_an_ingesting_status_that_parses_and_survives_the_wire_format() -> None:
    import pickle

    ref = DatasetRef(name="prom")
    m = _mapper()
    st = m.status(11)
    assert st == Degraded("store unavailable: locked") and st.ingesting and st.letter == "!"
    assert ShardStatus.parse(str(st)) == st
    assert m.shards_for_node("node-a") == list(range(20))  # the owner keeps it
    state = pickle.loads(pickle.dumps(m.snapshot()))
    assert state.status(11) == st and 11 in state.ingesting_shards("node-a")
    # A fresh mapper rebuilt from the minimal events (singleton recovery) keeps it too.
    again = merge_from(ShardMapper(64), m, ref)
    assert again.status(11) == st and again.owner(11) == "node-a"
    assert "!" in m.render()
