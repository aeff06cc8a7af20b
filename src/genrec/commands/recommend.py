"""``genrec recommend``: the batch job, recommendations for every user of a table (or those of
a ``--users`` file) as JSON lines in the table's own ids, through the engine directly
(:mod:`genrec.jobs.recommend`).

Register in ``genrec.cli`` with one line: ``app.command("recommend")(recommend_command)``.
Heavy modules are imported inside the functions so that ``genrec --help`` stays fast.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from genrec.commands.common import INPUT_ERRORS, DeviceOpt, ThreadsOpt, fail
from genrec.commands.dataset import (
    DataOpt,
    InterOpt,
    ItemsOpt,
    TableOpt,
    load_dataset,
    table_options,
)
from genrec.utils.device import resolve_device

if TYPE_CHECKING:
    from genrec.data.dataset import Dataset
    from genrec.jobs.recommend import Rerank

_LISTED = 10


@table_options
def recommend_command(
    model: Annotated[Path, typer.Option(help="Generative model: checkpoint folder (or a "
                                             "training output folder: its best/ is used).")],
    out: Annotated[Path, typer.Option(help="Output file: one JSON line per user, {user_id, "
                                           "items, scores} (written atomically).")],
    data: DataOpt = None, interactions: InterOpt = None, items: ItemsOpt = None,
    table: TableOpt = None,
    users: Annotated[Path | None, typer.Option(
        help="File of user ids, one a line (default: every user of the table).")] = None,
    n: Annotated[int, typer.Option("--n", min=1, help="Items per user.")] = 50,
    beam_width: Annotated[int | None, typer.Option(
        min=1, help="Beam width of the search (default: --n); with --ranker, the items "
                    "the ranker orders.", show_default=False)] = None,
    include_history: Annotated[bool, typer.Option(
        "--include-history", help="Also recommend items the user already has.")] = False,
    ranker: Annotated[Path | None, typer.Option(
        help="DuoLM student: rerank each user's --beam-width items, keep its best --n.")
    ] = None,
    store: Annotated[Path | None, typer.Option(
        "--item-store",
        help="Item store of --ranker (default: encode the table's items now).")] = None,
    batch_size: Annotated[int, typer.Option(min=1, help="Users per beam search.")] = 128,
    device: DeviceOpt = "auto", threads: ThreadsOpt = None, progress: bool = True,
) -> None:
    """Batch job: the top --n items for every user (or those of --users) by constrained beam
    search over each user's whole history, written as JSON lines in the table's own ids;
    each user's history is excluded unless --include-history."""
    from genrec.commands.eval_generative import load_generative
    from genrec.jobs.recommend import BatchParams, recommend_users, write_recommendations

    if store is not None and ranker is None:
        raise typer.BadParameter("--item-store goes with --ranker")
    params = BatchParams(n=n, beam_width=beam_width, batch_size=batch_size,
                         include_history=include_history)
    try:
        params.beam()
        ds = load_dataset(data, interactions, items, table)
        rows = list(range(ds.num_users)) if users is None else user_rows(users, ds)
        dev = resolve_device(device, threads)
        engine, vectors = load_generative(model, ds, "all", dev, "--model")
        rerank = None if ranker is None else load_rerank(ranker, store, ds, progress, dev)
        item_ids = engine.vocab.index.item_ids or ds.item_ids
        start = time.perf_counter()
        found = recommend_users(engine, [ds.sequences[u] for u in rows], params,
                                None if vectors is None else vectors[rows], rerank, progress)
        count = write_recommendations(out, [ds.user_ids[u] for u in rows], item_ids, found)
        seconds = time.perf_counter() - start
    except INPUT_ERRORS as err:
        raise fail(err) from None
    typer.echo(f"{count} users in {seconds:.1f} s ({count / max(seconds, 1e-9):.1f} users/s), "
               f"{n} items each -> {out}")


def user_rows(path: Path, ds: Dataset) -> list[int]:
    """The dataset rows of the user ids in ``path`` (one a line, blank lines skipped, each
    user once, in the file's order); ``ValueError`` naming the ids the dataset lacks."""
    ids = list(dict.fromkeys(s for line in path.read_text().splitlines() if (s := line.strip())))
    if not ids:
        raise ValueError(f"--users {path}: no user ids")
    index = {u: r for r, u in enumerate(ds.user_ids)}
    unknown = [u for u in ids if u not in index]
    if unknown:
        more = f" (and {len(unknown) - _LISTED} more)" if len(unknown) > _LISTED else ""
        raise ValueError(f"--users {path}: {len(unknown)} user ids not in the dataset: "
                         f"{', '.join(map(repr, unknown[:_LISTED]))}{more}")
    return [index[u] for u in ids]


def load_rerank(path: Path, store: Path | None, ds: Dataset, progress: bool,
                device: str) -> Rerank:
    """The ``rank_rows`` of the DuoLM student in ``path`` over ``ds``'s catalog (its item store's
    ids must be the table's)."""
    from genrec.commands.eval_ranker import load_student
    from genrec.duolm.ranker import read_meta
    from genrec.training.run_layout import model_folder

    folder = model_folder(path)
    if read_meta(folder).get("kind") != "student":
        raise ValueError(f"--ranker {path}: not a DuoLM student")
    student = load_student(folder, store, ds, progress, device)
    if student.item_ids != list(ds.item_ids):
        raise ValueError("--item-store: its item ids differ from the dataset's (built for another "
                         "catalog?)")
    if student.engine.model.config.user_dim:
        raise ValueError(f"--ranker {path}: a ranker with a soft token (user vectors) is not "
                         f"supported by the batch job")
    return student.rank_rows
