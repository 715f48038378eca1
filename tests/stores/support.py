"""Shared by the store tests' fixtures and tests."""

from __future__ import annotations

from collections.abc import Callable

from store import ColumnStore, MetaStore

# Short enough that the edge tests can step over it, long enough for every chunk they write.
MAX_CHUNK_SPAN_MS = 3_600_000

Stores = tuple[MetaStore, ColumnStore]
Opener = Callable[[], Stores]
