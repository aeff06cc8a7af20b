"""Which column of an interactions or items table plays which role.

A table's columns are matched against a small, explicit list of candidate names per role
(:data:`CANDIDATES`), compared case-insensitively and with RecBole's ``:type`` suffix stripped
(``user_id:token`` matches ``user_id``). The layouts this covers (interactions; items):

* genrec: ``user_id, item_id, timestamp``; ``item_id, title, ...``
* MovieLens: ``userId, movieId, rating, timestamp``; ``movieId, title, genres``
* RecBole atomic files (``.inter`` / ``.item``, tab-separated): ``user_id:token,
  item_id:token, rating:float, timestamp:float``; ``item_id:token, title:token_seq, ...``
* Amazon reviews: ``reviewerID, asin, overall, unixReviewTime``; ``asin, title, brand, ...``
* short names: ``user, item, time``; ``item, title``

A column named by the caller (``--user-col`` etc.) wins over detection; it matches exactly or,
failing that, by the same case- and suffix-insensitive key. Two columns matching one role is an
error naming both. Every error is a ``ValueError`` that says what was looked for, which columns
the file has, and which flag names the column.

Also here: :func:`read_table` (a CSV/TSV/RecBole/Parquet file -> column lists) and
:func:`parse_column` (a column's values as ids, timestamps or ratings).
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

#: Candidate column names per role, compared by :func:`column_key`.
CANDIDATES: dict[str, tuple[str, ...]] = {
    "user": ("user_id", "userid", "user", "reviewerid", "uid"),
    "item": ("item_id", "itemid", "movieid", "movie_id", "item", "asin", "iid"),
    "time": ("timestamp", "time", "unixreviewtime", "datetime", "date", "ts"),
    "rating": ("rating", "overall", "score"),
    # item text: these are text even when every value looks like a number (a title "1917")
    "text": ("title", "movie_title", "name", "genres", "genre", "categories", "category",
             "brand", "description", "tags"),
}

#: The command-line flag (and, after the slash, the loader argument) that names each role.
FLAGS: dict[str, str] = {
    "user": "--user-col / user_col=",
    "item": "--item-col / item_col=",
    "time": "--time-col / time_col=",
    "rating": "--rating-col / rating_col=",
    "text": "--text-cols / text_cols=",
    "item id": "--items-id-col / items_id_col=",
}

#: RecBole's field types (the ``:type`` suffix of an atomic file's header), and those whose
#: values are numbers, never item text.
RECBOLE_TYPES = ("token", "token_seq", "float", "float_seq")
NUMERIC_TYPES = ("float", "float_seq")
#: Tab-separated by default: ``.tsv`` and RecBole's atomic files.
TAB_SUFFIXES = (".tsv", ".inter", ".item", ".user")


@dataclass(frozen=True)
class TableColumns:
    """The columns a table dataset was read by (``None``: the table has no such column)."""

    user: str
    item: str
    time: str | None
    rating: str | None = None
    min_rating: float | None = None
    items_id: str | None = None
    text: tuple[str, ...] = ()

    def describe(self) -> str:
        """One line for the log: ``user 'userId', item 'movieId', time 'timestamp', ...``."""
        parts = [f"user {self.user!r}", f"item {self.item!r}",
                 f"time {self.time!r}" if self.time else "no time column (file order)"]
        if self.rating is not None:
            parts.append(f"rating {self.rating!r} >= {self.min_rating:g}")
        if self.items_id is not None:
            parts.append(f"items id {self.items_id!r}, text {_shown(self.text)}")
        return ", ".join(parts)


def field_type(column: str) -> str:
    """The RecBole type of a column (``title:token_seq`` -> ``token_seq``; ``""`` if none)."""
    suffix = column.rsplit(":", 1)[-1].strip() if ":" in column else ""
    return suffix if suffix in RECBOLE_TYPES else ""


def field_name(column: str) -> str:
    """The column's name without a RecBole ``:type`` suffix (``title:token_seq`` -> ``title``)."""
    return column.rsplit(":", 1)[0].strip() if field_type(column) else column.strip()


def column_key(column: str) -> str:
    """The name columns are matched by: :func:`field_name`, case-folded."""
    return field_name(column).casefold()


def _shown(names: Sequence[str]) -> str:
    return ", ".join(repr(n) for n in names) if names else "(none)"


def find_column(
    columns: Sequence[str],
    role: str,
    given: str | None = None,
    *,
    where: str,
    preferred: Sequence[str] = (),
    required: bool = True,
    purpose: str = "",
) -> str | None:
    """The column of ``columns`` that plays ``role`` (a key of :data:`FLAGS`).

    ``given`` (a name from the caller) must exist: exactly, or by :func:`column_key`. Otherwise
    the first of ``preferred`` that matches is taken, then the candidates of :data:`CANDIDATES`
    (the item id of an items table uses the item candidates). Returns ``None`` when nothing
    matches and not ``required``. ``where`` names the file in errors; ``purpose`` says why the
    column is needed (e.g. ``" (for --min-rating)"``).
    """
    flag = FLAGS[role]
    if given is not None:
        if given in columns:
            return given
        found = [c for c in columns if column_key(c) == column_key(given)]
        if len(found) == 1:
            return found[0]
        if found:
            raise ValueError(f"{where}: {_shown(found)} all match {given!r} (given by "
                             f"{flag}); name one of them exactly")
        raise ValueError(f"{where}: no column {given!r} (given by {flag}){purpose}; the file "
                         f"has columns {_shown(columns)}")
    for name in preferred:
        found = [c for c in columns if column_key(c) == column_key(name)]
        if len(found) == 1:
            return found[0]
    candidates = CANDIDATES["item" if role == "item id" else role]
    found = [c for c in columns if column_key(c) in candidates]
    if len(found) > 1:
        raise ValueError(f"{where}: {_shown(found)} could each be the {role} column; choose "
                         f"one with {flag}")
    if found:
        return found[0]
    if not required:
        return None
    looked = _shown([*dict.fromkeys([*preferred, *candidates])])
    raise ValueError(
        f"{where}: no {role} column{purpose}: looked for {looked} (any case, RecBole ':type' "
        f"suffixes ignored); the file has columns {_shown(columns)}; name the column with {flag}"
    )


def find_columns(
    columns: Sequence[str], given: Sequence[str], role: str, *, where: str
) -> list[str]:
    """:func:`find_column` for each name of ``given`` (e.g. the ``--text-cols`` list)."""
    return [str(find_column(columns, role, name, where=where)) for name in given]


def _is_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    try:
        float(str(value))
    except ValueError:
        return False
    return True


def _is_blank(value: Any) -> bool:
    return value is None or (isinstance(value, float) and value != value) or (
        isinstance(value, str) and not value.strip())


def text_columns(table: Mapping[str, Sequence[Any]], id_column: str) -> list[str]:
    """The default item text columns: every column but ``id_column`` that holds text.

    A column holds text when its name is a text candidate (title, genres, description, ...),
    or when one of its values is not a number (so ``price`` or ``year`` columns are left out);
    RecBole ``:float`` / ``:float_seq`` columns never do.
    """
    out = []
    for column, values in table.items():
        if column == id_column or field_type(column) in NUMERIC_TYPES:
            continue
        if column_key(column) in CANDIDATES["text"] or any(
            not _is_blank(v) and not _is_number(v) for v in values
        ):
            out.append(column)
    return out


def read_table(path: Path, delimiter: str | None = None) -> dict[str, list[Any]]:
    """Read a CSV/TSV (stdlib) or Parquet (pyarrow or pandas) file into column lists.

    Without ``delimiter``: tabs for ``.tsv`` and RecBole's ``.inter`` / ``.item`` / ``.user``
    files, and for a header with tabs but no commas; commas otherwise.
    """
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
    with open(path, newline="", encoding="utf-8-sig") as f:
        if delimiter is None:
            first = f.readline()
            f.seek(0)
            tabs = suffix in TAB_SUFFIXES or ("\t" in first and "," not in first)
            delimiter = "\t" if tabs else ","
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


def _bad_value(path: Path, column: str, row: int, value: Any, expected: str) -> ValueError:
    return ValueError(f"{path.name}: data row {row + 1}: {column!r} value {value!r} is {expected}")


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
        raise _bad_value(path, column, row, value, "neither a number nor an ISO date") from None


def _rating(value: Any, path: Path, column: str, row: int) -> float:
    try:
        rating = float(value)
    except (TypeError, ValueError):
        rating = float("nan")
    if rating != rating:
        raise _bad_value(path, column, row, value, "not a number")
    return rating


_PARSERS = {"id": _id_str, "time": _time_key, "rating": _rating}


def parse_column(
    table: Mapping[str, Sequence[Any]], column: str, kind: str, path: Path
) -> list[Any]:
    """Every value of ``column`` read as ``kind``: ``"id"`` (a non-empty string; ``3.0`` reads
    ``"3"``), ``"time"`` (seconds, from a number, a numeric string, an ISO date or a datetime) or
    ``"rating"`` (a float). A bad value raises ``ValueError`` naming the file, row and column."""
    parse = _PARSERS[kind]
    return [parse(v, path, column, r) for r, v in enumerate(table[column])]
