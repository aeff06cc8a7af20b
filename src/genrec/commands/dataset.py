"""The dataset options shared by every command that reads one: ``--data`` (JSON format) or
``--interactions`` [``--items``] (tables), plus the table's column flags.

A command takes ``data: DataOpt = None, interactions: InterOpt = None, items: ItemsOpt = None``
and a ``table: TableOpt = None`` placeholder, is decorated with :func:`table_options` (below the
typer decorator), and calls ``load_dataset(data, interactions, items, table)``. The decorator
puts the column flags (``--user-col``, ``--item-col``, ``--time-col``, ``--rating-col``,
``--min-rating``, ``--items-id-col``, ``--text-cols``) where the placeholder stands and hands them
to the command as one ``table`` dict of :func:`genrec.data.load_table_dataset` arguments.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

if TYPE_CHECKING:
    from genrec.data.dataset import Dataset

DataOpt = Annotated[Path | None, typer.Option(help="Dataset folder in the JSON format "
                                                   "(*.inter.json, optional *.item.json).")]
InterOpt = Annotated[Path | None, typer.Option(
    help="Interactions table (CSV/TSV, RecBole .inter, Parquet); its columns are detected or "
         "named with the flags below.")]
ItemsOpt = Annotated[Path | None, typer.Option(help="Items table (with --interactions): item "
                                                    "id and text columns.")]
#: The placeholder a command declares where the column flags go (see :func:`table_options`).
TableOpt = Mapping[str, Any] | None

_PANEL = "Interactions table (with --interactions)"


def _flag(kind: type, text: str) -> Any:
    return Annotated[kind | None, typer.Option(help=text, rich_help_panel=_PANEL)]


#: The column flags: loader argument -> its option (default: detect).
TABLE_FLAGS: dict[str, Any] = {
    "user_col": _flag(str, "User id column (default: detected, e.g. user_id, userId, "
                           "reviewerID, user)."),
    "item_col": _flag(str, "Item id column (default: detected, e.g. item_id, movieId, asin, "
                           "item)."),
    "time_col": _flag(str, "Timestamp column: numbers or ISO dates (default: detected, e.g. "
                           "timestamp, unixReviewTime, time; none: file order)."),
    "rating_col": _flag(str, "Rating column for --min-rating (default: detected: rating, "
                             "overall, score)."),
    "min_rating": _flag(float, "Keep only interactions rated at least this (explicit ratings "
                               "as implicit feedback)."),
    "items_id_col": _flag(str, "Item id column of --items (default: the interactions' item "
                               "column's name, else detected)."),
    "text_cols": _flag(str, "Comma-separated text columns of --items (default: its non-id "
                            "columns that hold text)."),
}

F = TypeVar("F", bound=Callable[..., Any])


def table_options(command: F) -> F:
    """Replace ``command``'s ``table`` parameter by the :data:`TABLE_FLAGS` options; the
    command receives them as ``table``: a dict of the flags given (``text_cols`` as a list)."""
    signature = inspect.signature(command, eval_str=True)
    params = []
    for param in signature.parameters.values():
        if param.name == "table":
            params += [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                         default=None, annotation=kind)
                       for name, kind in TABLE_FLAGS.items()]
        else:
            params.append(param)
    if len(params) == len(signature.parameters):
        raise TypeError(f"{command.__name__} has no 'table' parameter to put the flags at")

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        given = {name: kwargs.pop(name) for name in TABLE_FLAGS if name in kwargs}
        return command(*args, table=table_arguments(**given), **kwargs)

    wrapper.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper  # type: ignore[return-value]


def table_arguments(**flags: Any) -> dict[str, Any]:
    """The :data:`TABLE_FLAGS` values given (not ``None``), as loader arguments: ``text_cols``
    ``"title, genres"`` -> ``["title", "genres"]``."""
    table = {name: value for name, value in flags.items() if value is not None}
    if "text_cols" in table:
        names = [c.strip() for c in table["text_cols"].split(",") if c.strip()]
        if not names:
            raise typer.BadParameter(f"--text-cols: no column names in {table['text_cols']!r}")
        table["text_cols"] = names
    return table


def load_dataset(
    data: Path | None, interactions: Path | None, items: Path | None, table: TableOpt = None
) -> Dataset:
    """The dataset named by exactly one of ``--data`` / ``--interactions``; ``table``: the
    column flags of :func:`table_options`. Which columns a table was read by goes to stderr."""
    from genrec.data import load_json_dataset, load_table_dataset

    if (data is None) == (interactions is None):
        raise typer.BadParameter("give exactly one of --data FOLDER or --interactions FILE")
    if data is not None:
        flags = ["--items"] * (items is not None) + [
            "--" + name.replace("_", "-") for name in (table or {})]
        if flags:
            verb = "goes" if len(flags) == 1 else "go"
            raise typer.BadParameter(f"{', '.join(flags)} {verb} with --interactions (a --data "
                                     "folder has its own items and columns)")
        return load_json_dataset(data)
    ds = load_table_dataset(interactions, items, **(table or {}))
    if ds.columns is not None:
        typer.echo(f"{interactions.name}: {ds.columns.describe()}", err=True)
    return ds
