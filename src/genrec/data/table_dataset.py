"""Interaction tables (CSV/TSV, RecBole atomic files or Parquet) with user id, item id and
(optionally) timestamp and rating columns, plus an optional items table with text columns:
:func:`load_table_dataset`. Which column is which is detected from common layouts
(:mod:`genrec.data.columns`) or named by the caller.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

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
from genrec.data.dataset import Dataset, id_listing, sorted_ids, text_fields

log = logging.getLogger(__name__)


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
        raise ValueError(f"{path.name}: duplicate item ids: {id_listing(dups)}")
    text = {iid: text_fields({field_name(c): table[c][r] for c in cols})
            for r, iid in enumerate(ids)}
    return sorted_ids(ids), text, dataclasses.replace(columns, items_id=id_col, text=tuple(cols))


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
        catalog = sorted_ids(item_vals)
    else:
        catalog, item_text, columns = items_table(Path(items), delimiter, items_id_col,
                                                   text_cols, columns)
        unknown = sorted_ids(set(item_vals) - set(item_text))
        if unknown:
            raise ValueError(f"{where}: {len(unknown)} item ids not in items table "
                             f"{Path(items).name}: {id_listing(unknown)}")

    item_index = {iid: i for i, iid in enumerate(catalog)}
    per_user: dict[str, list[tuple[float, int]]] = {}
    for u, i, t in zip(users, item_vals, times, strict=True):
        per_user.setdefault(u, []).append((t, item_index[i]))
    user_ids = sorted_ids(per_user)
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
