"""Dataset loaders: per-user item sequences in time order, with item id <-> index maps.

Two input formats are supported:

* the JSON format of LC-Rec / LETTER / CollisionGenRec (``<Name>.inter.json``,
  ``<Name>.item.json``, ``sid-rqvae/<Name>.index.json``): :func:`load_json_dataset`;
* an interactions table (CSV/TSV, RecBole atomic files or Parquet) with user id, item id and
  (optionally) timestamp and rating columns, plus an optional items table with text columns:
  :func:`load_table_dataset`. Which column is which is detected from common layouts
  (:mod:`genrec.data.columns`) or named by the caller.

Original ids are kept as strings. Internal item indices are assigned by sorting the original ids
(numerically when every id is an integer, else lexicographically), so a dataset whose item ids are
``0..N-1`` gets index == id.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from genrec.data.columns import (
    CANDIDATES,
    TableColumns,
    field_name,
    find_column,
    find_columns,
    parse_column,
    read_table,
    text_columns,
)

log = logging.getLogger(__name__)

_MAX_LISTED = 10


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


def items_table(
    path: Path, delimiter: str | None, id_col: str | None, text_cols: Sequence[str] | None,
    columns: TableColumns,
) -> tuple[list[str], dict[str, dict[str, str]], TableColumns]:
    """The items table: its sorted ids, each item's text, and ``columns`` with its id and text
    columns added (see :func:`load_table_dataset`)."""
    table = read_table(path, delimiter)
    id_col = str(find_column(list(table), "item id", id_col, where=path.name,
                             preferred=[columns.item]))
    cols = (text_columns(table, id_col) if text_cols is None else
            find_columns(list(table), text_cols, "text", where=path.name))
    ids = parse_column(table, id_col, "id", path)
    dups = sorted(i for i, n in Counter(ids).items() if n > 1)
    if dups:
        raise ValueError(f"{path.name}: duplicate item ids: {_listing(dups)}")
    text = {iid: _text_fields({field_name(c): table[c][r] for c in cols})
            for r, iid in enumerate(ids)}
    return _sorted_ids(ids), text, dataclasses.replace(columns, items_id=id_col, text=tuple(cols))


def load_table_dataset(
    interactions: str | Path,
    items: str | Path | None = None,
    *,
    user_col: str | None = None,
    item_col: str | None = None,
    time_col: str | None = None,
    rating_col: str | None = None,
    min_rating: float | None = None,
    items_id_col: str | None = None,
    text_cols: Sequence[str] | None = None,
    delimiter: str | None = None,
    name: str | None = None,
) -> Dataset:
    """Load an interactions table (CSV/TSV/RecBole/Parquet) and an optional items table.

    Columns left ``None`` are detected (:mod:`genrec.data.columns`: MovieLens, RecBole, Amazon
    reviews and genrec's own names). Each user's interactions are sorted by timestamp; ties keep
    file order (stable sort). A table without a time column keeps each user's interactions in
    file order (with a warning in the log). ``min_rating``: rows whose rating (``rating_col``, or
    the detected rating column) is below it are dropped first. When ``items`` is given it defines
    the catalog (items without interactions are kept) and every item id in the interactions must
    appear in it; its id column is ``items_id_col``, else the interactions' item column, else
    detected. ``text_cols`` selects the item text columns (default: :func:`text_columns`, every
    non-id column that holds text); ``item_text`` keys drop RecBole ``:type`` suffixes.
    """
    inter_path = Path(interactions)
    if items is None and (items_id_col is not None or text_cols is not None):
        raise ValueError("items_id_col and text_cols (--items-id-col, --text-cols) describe an "
                         "items table; give one (--items)")
    if rating_col is not None and min_rating is None:
        raise ValueError("rating_col (--rating-col) is read only to filter by min_rating "
                         "(--min-rating); give both")
    table = read_table(inter_path, delimiter)
    where, names = inter_path.name, list(table)
    user = str(find_column(names, "user", user_col, where=where))
    item = str(find_column(names, "item", item_col, where=where))
    time = find_column(names, "time", time_col, where=where, required=False)
    rows = [parse_column(table, user, "id", inter_path),
            parse_column(table, item, "id", inter_path)]
    if time is None:
        log.warning("%s: no time column (none of %s); each user's interactions keep their file "
                    "order (name a time column with --time-col)", where,
                    ", ".join(CANDIDATES["time"]))
        rows.append([0.0] * len(rows[0]))
    else:
        rows.append(parse_column(table, time, "time", inter_path))
    rating = None
    if min_rating is not None:
        rating = str(find_column(names, "rating", rating_col, where=where,
                                 purpose=f" (for --min-rating {min_rating:g})"))
        keep = [r >= min_rating for r in parse_column(table, rating, "rating", inter_path)]
        if rows[0] and not any(keep):
            raise ValueError(f"{where}: no row has {rating} >= {min_rating:g}")
        rows = [[v for v, k in zip(col, keep, strict=True) if k] for col in rows]
    users, item_vals, times = rows
    columns = TableColumns(user, item, time, rating, min_rating)
    item_text: dict[str, dict[str, str]] | None = None
    if items is None:
        catalog = _sorted_ids(item_vals)
    else:
        catalog, item_text, columns = items_table(Path(items), delimiter, items_id_col,
                                                   text_cols, columns)
        unknown = _sorted_ids(set(item_vals) - set(item_text))
        if unknown:
            raise ValueError(f"{where}: {len(unknown)} item ids not in items table "
                             f"{Path(items).name}: {_listing(unknown)}")

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
        item_text=None if item_text is None else {item_index[k]: v for k, v in item_text.items()},
        columns=columns,
    )
