"""Dataset loaders: per-user item sequences in time order, with item id <-> index maps.

Two input formats are supported:

* the JSON format of LC-Rec / LETTER / CollisionGenRec (``<Name>.inter.json``,
  ``<Name>.item.json``, ``sid-rqvae/<Name>.index.json``): :func:`load_json_dataset`;
* an interactions table (CSV/TSV or Parquet) with user id, item id and timestamp columns, plus an
  optional items table with text columns: :func:`load_table_dataset`.

Original ids are kept as strings. Internal item indices are assigned by sorting the original ids
(numerically when every id is an integer, else lexicographically), so a dataset whose item ids are
``0..N-1`` gets index == id.
"""

from __future__ import annotations

import csv
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

_MAX_LISTED = 10


@dataclass
class Dataset:
    """Users' interaction sequences plus item id maps and optional item text.

    ``sequences[u]`` holds the internal item indices of user ``u`` in time order (oldest first).
    ``item_ids[i]`` is the original id of item index ``i``; ``item_index`` is the inverse map.
    ``item_text`` maps item index -> {field: text} (e.g. title, description, brand, categories);
    it is ``None`` when the dataset has no item text.
    """

    name: str
    sequences: list[list[int]]
    user_ids: list[str]
    item_ids: list[str]
    item_index: dict[str, int] = field(repr=False)
    item_text: dict[int, dict[str, str]] | None = field(default=None, repr=False)
    semantic_id_path: Path | None = None

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


@dataclass(frozen=True)
class JsonDatasetFiles:
    """Paths of one dataset in the JSON format; ``items`` and ``semantic_ids`` may be absent."""

    name: str
    interactions: Path
    items: Path | None
    semantic_ids: Path | None


def _listing(values: Iterable[Any]) -> str:
    values = list(values)
    shown = ", ".join(repr(v) for v in values[:_MAX_LISTED])
    more = f" (and {len(values) - _MAX_LISTED} more)" if len(values) > _MAX_LISTED else ""
    return shown + more


def _sorted_ids(ids: Iterable[str]) -> list[str]:
    """Sort ids numerically if all are integers, else as strings."""
    unique = set(ids)
    try:
        return sorted(unique, key=int)
    except ValueError:
        return sorted(unique)


def find_json_dataset(folder: str | Path, name: str | None = None) -> JsonDatasetFiles:
    """Locate ``<Name>.inter.json``, ``<Name>.item.json`` and ``sid-rqvae/<Name>.index.json``.

    ``name`` selects the dataset when the folder holds several ``*.inter.json`` files.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"dataset folder not found: {folder}")
    if name is None:
        found = sorted(folder.glob("*.inter.json"))
        if not found:
            raise FileNotFoundError(f"no '<Name>.inter.json' file in {folder}")
        if len(found) > 1:
            names = [p.name for p in found]
            raise ValueError(f"several interaction files in {folder}: {names}; pass name=")
        name = found[0].name[: -len(".inter.json")]
    inter = folder / f"{name}.inter.json"
    if not inter.is_file():
        raise FileNotFoundError(f"interactions file not found: {inter}")
    items = folder / f"{name}.item.json"
    sids = folder / "sid-rqvae" / f"{name}.index.json"
    return JsonDatasetFiles(
        name=name,
        interactions=inter,
        items=items if items.is_file() else None,
        semantic_ids=sids if sids.is_file() else None,
    )


def _text_fields(raw: dict[str, Any]) -> dict[str, str]:
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


def load_json_dataset(folder: str | Path, name: str | None = None) -> Dataset:
    """Load a dataset in the JSON format from ``folder`` (see :func:`find_json_dataset`).

    The item catalog is the union of the items in the interactions, the item text file and the
    Semantic-ID file, so that ``load_sid_index(ds.semantic_id_path, ds.item_index)`` aligns.
    """
    files = find_json_dataset(folder, name)
    with open(files.interactions) as f:
        inter = json.load(f)
    if not isinstance(inter, dict):
        raise ValueError(f"{files.interactions}: expected an object {{user: [item ids]}}")
    raw_text: dict[str, Any] = {}
    if files.items is not None:
        with open(files.items) as f:
            raw_text = json.load(f)
        if not isinstance(raw_text, dict):
            raise ValueError(f"{files.items}: expected an object {{item id: {{field: text}}}}")

    seqs_raw: dict[str, list[str]] = {}
    for user, items in inter.items():
        if not isinstance(items, list):
            raise ValueError(f"{files.interactions}: user {user!r} has no item list")
        seqs_raw[str(user)] = [str(i) for i in items]
    all_items = [i for s in seqs_raw.values() for i in s]
    if files.items is not None:
        unknown = _sorted_ids(set(all_items) - set(raw_text.keys()))
        if unknown:
            raise ValueError(
                f"{files.interactions}: {len(unknown)} item ids missing from {files.items.name}: "
                f"{_listing(unknown)}"
            )
    sid_items: list[str] = []
    if files.semantic_ids is not None:
        with open(files.semantic_ids) as f:
            sid_items = [str(k) for k in json.load(f)]
    item_ids = _sorted_ids([*all_items, *map(str, raw_text.keys()), *sid_items])
    item_index = {iid: i for i, iid in enumerate(item_ids)}
    user_ids = _sorted_ids(seqs_raw.keys())
    sequences = [[item_index[i] for i in seqs_raw[u]] for u in user_ids]
    item_text = None
    if files.items is not None:
        item_text = {
            item_index[str(k)]: _text_fields(v if isinstance(v, dict) else {"title": v})
            for k, v in raw_text.items()
        }
    return Dataset(
        name=files.name,
        sequences=sequences,
        user_ids=user_ids,
        item_ids=item_ids,
        item_index=item_index,
        item_text=item_text,
        semantic_id_path=files.semantic_ids,
    )


def _read_table(path: Path, delimiter: str | None = None) -> dict[str, list[Any]]:
    """Read a CSV/TSV (stdlib) or Parquet (pyarrow or pandas) file into column lists."""
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        try:
            import pyarrow.parquet as pq

            return pq.read_table(path).to_pydict()
        except ImportError:
            pass
        try:
            import pandas as pd
        except ImportError:
            raise ImportError(
                f"reading {path.name} needs the 'pyarrow' or 'pandas' package (with a parquet "
                "engine); install one, or convert the table to CSV"
            ) from None
        frame = pd.read_parquet(path)
        return {str(c): frame[c].tolist() for c in frame.columns}
    if delimiter is None:
        delimiter = "\t" if suffix == ".tsv" else ","
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f, delimiter=delimiter)
        try:
            header = next(reader)
        except StopIteration:
            raise ValueError(f"{path}: empty table (no header row)") from None
        columns: dict[str, list[Any]] = {h.strip(): [] for h in header}
        names = list(columns)
        for line, row in enumerate(reader, start=2):
            if not row:
                continue
            if len(row) != len(names):
                raise ValueError(f"{path}:{line}: expected {len(names)} fields, got {len(row)}")
            for name, value in zip(names, row, strict=True):
                columns[name].append(value)
    return columns


def _require_columns(path: Path, table: dict[str, list[Any]], needed: Sequence[str]) -> None:
    missing = [c for c in needed if c not in table]
    if missing:
        raise ValueError(
            f"{path.name}: missing column(s) {missing}; available columns: {list(table)}"
        )


def _id_str(value: Any, path: Path, column: str, row: int) -> str:
    if value is None or (isinstance(value, float) and value != value):
        raise ValueError(f"{path.name}: empty {column!r} in data row {row + 1}")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = str(value).strip()
    if not text:
        raise ValueError(f"{path.name}: empty {column!r} in data row {row + 1}")
    return text


def _time_key(value: Any, path: Path, column: str, row: int) -> float:
    """Convert a timestamp (number, numeric string, ISO string or datetime) to seconds."""
    if hasattr(value, "timestamp"):
        return float(value.timestamp())
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise ValueError(
            f"{path.name}: data row {row + 1}: {column!r} value {value!r} is neither a number "
            "nor an ISO date"
        ) from None


def load_table_dataset(
    interactions: str | Path,
    items: str | Path | None = None,
    *,
    user_col: str = "user_id",
    item_col: str = "item_id",
    time_col: str = "timestamp",
    items_id_col: str | None = None,
    text_cols: Sequence[str] | None = None,
    delimiter: str | None = None,
    name: str | None = None,
) -> Dataset:
    """Load an interactions table (CSV/TSV/Parquet) and an optional items table.

    Each user's interactions are sorted by timestamp; ties keep file order (stable sort).
    When ``items`` is given it defines the catalog (items without interactions are kept) and
    every item id in the interactions must appear in it. ``text_cols`` selects the item text
    columns (default: every column of the items table except the id column).
    """
    inter_path = Path(interactions)
    table = _read_table(inter_path, delimiter)
    _require_columns(inter_path, table, [user_col, item_col, time_col])
    users = [_id_str(v, inter_path, user_col, r) for r, v in enumerate(table[user_col])]
    item_vals = [_id_str(v, inter_path, item_col, r) for r, v in enumerate(table[item_col])]
    times = [_time_key(v, inter_path, time_col, r) for r, v in enumerate(table[time_col])]

    item_text: dict[str, dict[str, str]] | None = None
    if items is not None:
        items_path = Path(items)
        items_table = _read_table(items_path, delimiter)
        id_col = items_id_col or item_col
        cols = list(text_cols) if text_cols is not None else [c for c in items_table if c != id_col]
        _require_columns(items_path, items_table, [id_col, *cols])
        ids = [_id_str(v, items_path, id_col, r) for r, v in enumerate(items_table[id_col])]
        dups = sorted(i for i, n in Counter(ids).items() if n > 1)
        if dups:
            raise ValueError(f"{items_path.name}: duplicate item ids: {_listing(dups)}")
        unknown = _sorted_ids(set(item_vals) - set(ids))
        if unknown:
            raise ValueError(
                f"{inter_path.name}: {len(unknown)} item ids not in items table "
                f"{items_path.name}: {_listing(unknown)}"
            )
        item_text = {
            iid: _text_fields({c: items_table[c][r] for c in cols}) for r, iid in enumerate(ids)
        }
        catalog = _sorted_ids(ids)
    else:
        catalog = _sorted_ids(item_vals)

    item_index = {iid: i for i, iid in enumerate(catalog)}
    per_user: dict[str, list[tuple[float, int]]] = {}
    for u, i, t in zip(users, item_vals, times, strict=True):
        per_user.setdefault(u, []).append((t, item_index[i]))
    user_ids = _sorted_ids(per_user)
    # sorted() is stable: equal timestamps keep their file order
    sequences = [[i for _, i in sorted(per_user[u], key=lambda x: x[0])] for u in user_ids]
    return Dataset(
        name=name or inter_path.name.split(".")[0],
        sequences=sequences,
        user_ids=user_ids,
        item_ids=catalog,
        item_index=item_index,
        item_text=None
        if item_text is None
        else {item_index[k]: v for k, v in item_text.items()},
    )
