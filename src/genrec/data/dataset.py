"""A dataset in memory: per-user item sequences in time order, with item id <-> index maps
and optional item text, whatever format it was read from.

Original ids are kept as strings. Internal item indices are assigned by sorting the original ids
(:func:`sorted_ids`: numerically when every id is an integer, else lexicographically), so a
dataset whose item ids are ``0..N-1`` gets index == id.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from genrec.data.columns import TableColumns

MAX_LISTED = 10  # ids named in an error message


@dataclass
class Dataset:
    """Users' interaction sequences plus item id maps and optional item text.

    ``sequences[u]`` holds the internal item indices of user ``u`` in time order (oldest first).
    ``item_ids[i]`` is the original id of item index ``i``; ``item_index`` is the inverse map.
    ``item_text`` maps item index -> {field: text} (e.g. title, description, brand, categories);
    it is ``None`` when the dataset has no item text. ``columns``: the columns a table dataset
    was read by (``None`` for the JSON format).
    """

    name: str
    sequences: list[list[int]]
    user_ids: list[str]
    item_ids: list[str]
    item_index: dict[str, int] = field(repr=False)
    item_text: dict[int, dict[str, str]] | None = field(default=None, repr=False)
    semantic_id_path: Path | None = None
    columns: TableColumns | None = None

    @property
    def num_users(self) -> int:
        """Number of users (sequences)."""
        return len(self.sequences)

    @property
    def num_items(self) -> int:
        """Number of items in the catalog (including items nobody interacted with)."""
        return len(self.item_ids)

    @property
    def num_interactions(self) -> int:
        """Total number of interactions over all users."""
        return sum(len(s) for s in self.sequences)

    def summary(self) -> dict[str, Any]:
        """Counts for logging: users, items, interactions, sequence lengths."""
        lengths = [len(s) for s in self.sequences] or [0]
        return {
            "name": self.name,
            "users": self.num_users,
            "items": self.num_items,
            "interactions": self.num_interactions,
            "min_len": min(lengths),
            "max_len": max(lengths),
            "has_text": self.item_text is not None,
        }


def id_listing(values: Iterable[Any]) -> str:
    """The first :data:`MAX_LISTED` ``values`` for an error message, and how many more."""
    values = list(values)
    shown = ", ".join(repr(v) for v in values[:MAX_LISTED])
    more = f" (and {len(values) - MAX_LISTED} more)" if len(values) > MAX_LISTED else ""
    return shown + more


def sorted_ids(ids: Iterable[str]) -> list[str]:
    """Sort ids numerically if all are integers, else as strings."""
    unique = set(ids)
    try:
        return sorted(unique, key=int)
    except ValueError:
        return sorted(unique)


def text_fields(raw: dict[str, Any]) -> dict[str, str]:
    """An item's text fields as strings: lists joined by commas, empty and ``None`` values left
    out."""
    out: dict[str, str] = {}
    for key, value in raw.items():
        if value is None:
            continue
        if isinstance(value, (list, tuple)):
            value = ", ".join(str(v) for v in value)
        text = str(value).strip()
        if text:
            out[str(key)] = text
    return out
