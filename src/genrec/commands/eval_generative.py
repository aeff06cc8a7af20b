"""``genrec eval``: a generative model (or an ensemble of them) by full-catalog beam search,
or a DuoLM ranker and its teacher on sampled candidates (:mod:`genrec.commands.eval_ranker`).

Register in ``genrec.cli`` with one line: ``app.command("eval")(eval_command)``. Heavy modules
are imported inside the functions so that ``genrec --help`` stays fast.
"""

from __future__ import annotations

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
from genrec.training.run_layout import model_folder
from genrec.utils.device import resolve_device

if TYPE_CHECKING:
    import torch

    from genrec.data.dataset import Dataset
    from genrec.engine import Engine


@table_options
def eval_command(
    model: Annotated[Path, typer.Option(help="Checkpoint folder (or a training output folder: "
                                             "its best/ is used).")],
    data: DataOpt = None, interactions: InterOpt = None, items: ItemsOpt = None,
    table: TableOpt = None,
    split: Annotated[str, typer.Option(help="test | val.")] = "test",
    beam_width: Annotated[int, typer.Option(min=1)] = 20,
    users: Annotated[int | None, typer.Option(min=1, help="Evaluate a fixed random sample of "
                                                          "this many users.")] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write metrics here.")] = None,
    batch_size: Annotated[int, typer.Option(min=1, help="Requests per beam search.")] = 128,
    seed: int = 0, device: DeviceOpt = "auto", threads: ThreadsOpt = None,
    progress: bool = True,
    teacher: Annotated[Path | None, typer.Option(help="Ranker models: also evaluate this "
                                                      "DuoLM teacher, side by side.")] = None,
    store: Annotated[Path | None, typer.Option(
        "--item-store",
        help="Ranker models: item store of the student (default: encode the catalog).")] = None,
    negatives: Annotated[int, typer.Option(min=0, help="Ranker models: sampled negatives per "
                                                       "user (0: the full catalog).")] = 99,
    mask_history: Annotated[bool, typer.Option(
        help="Generative models: never recommend an item the user already has (the model and "
             "popularity alike).")] = False,
    item_weight: Annotated[float | None, typer.Option(
        min=0.0, help="Generative models with an item head: weight of its log-probability in "
                      "the ranking of the proposals (0: Semantic IDs alone; default: the "
                      "model's own, chosen on validation when trained, else 3).")] = None,
    item_weights: Annotated[str | None, typer.Option(
        help="Generative models with an item head: comma-separated weights (e.g. "
             "1,2,3,5,10,20) evaluated from one search, one row each (instead of "
             "--item-weight).")] = None,
    head_proposals: Annotated[int | None, typer.Option(
        min=0, help="Generative models with an item head: the head's own proposals per user, "
                    "pooled with the beam's (default: --beam-width).")] = None,
    ensemble: Annotated[list[Path] | None, typer.Option(
        help="Generative models: another model over the same index, ranking with --model by "
             "the mean log-probability of each item (genrec.engine.ensemble); repeat the "
             "option for more.")] = None,
    against: Annotated[Path | None, typer.Option(
        help="Generative models: a second model evaluated on the same users (with its own "
             "item weight), and the mean per-user difference of --model's metrics minus its, "
             "with the standard error of that difference.")] = None,
) -> None:
    """Evaluate on the test split. A generative model: Recall/NDCG@5/10 by full-catalog
    constrained beam search. A DuoLM student or teacher: NDCG/Recall@10 and MRR of the held-out
    item among sampled negatives (student and ``--teacher`` side by side)."""
    from genrec.engine.ensemble import Ensemble
    from genrec.evaluation.full_catalog import evaluate_split, popularity_split
    from genrec.utils.atomic import atomic_write_json

    if split not in ("test", "val"):
        raise typer.BadParameter(f"--split must be 'test' or 'val', got {split!r}")
    weights = parse_weights(item_weights) if item_weights is not None else None
    if weights is not None and (item_weight is not None or ensemble or against):
        raise typer.BadParameter("--item-weights: not with --item-weight, --ensemble or "
                                 "--against")
    folder = model_folder(model)
    if (folder / "duolm.json").is_file():
        if ensemble or against:
            raise typer.BadParameter("--ensemble, --against: generative models only (--model "
                                     "is a DuoLM ranker)")
        from genrec.commands.eval_ranker import eval_rankers

        return eval_rankers(model, teacher, store, data, interactions, items, table, split, users,
                            negatives, seed, device, threads, progress, json_path)
    try:
        ds = load_dataset(data, interactions, items, table)
        dev = resolve_device(device, threads)
        members = [load_generative(path, ds, split, dev, field)
                   for path, field in [(model, "--model"), *((p, "--ensemble")
                                                             for p in ensemble or [])]]
        engine, vectors = members[0]
        if len(members) > 1:
            try:
                engine = Ensemble([e for e, _ in members])
            except ValueError as err:
                raise ValueError(f"--ensemble: {err}") from None
        other, other_vectors = load_generative(against, ds, split, dev, "--against") \
            if against is not None else (None, None)
        metrics = evaluate_split(engine, ds.sequences, split, vectors, beam_width, users, seed,
                                 batch_size, progress, mask_history, item_weight,
                                 head_proposals, weights, other, other_vectors)
        pop = popularity_split(ds.sequences, ds.num_items, split, engine.vocab.max_history,
                               users, seed, mask_history)  # the same users and masking
    except INPUT_ERRORS as err:
        raise fail(err) from None
    metrics["wall_seconds"] = metrics.pop("seconds")
    metrics["split"] = split
    metrics["history_masked"] = mask_history
    # the weight used: given, else the model's own (an ensemble's members: each its own)
    metrics["item_weight"] = item_weight if item_weight is not None else getattr(
        engine, "item_weight", None)
    rows = [("model", metrics)]
    if weights is not None:
        metrics["item_weight"] = None
        rows = [(f"w {w:g}", m) for w, m in metrics["by_item_weight"].items()]
        metrics["by_item_weight"] = {str(w): m for w, m in metrics["by_item_weight"].items()}
    metrics["head_proposals"] = head_proposals
    metrics["models"] = [str(m) for m in [model, *(ensemble or [])]]
    keys = ("recall@5", "ndcg@5", "recall@10", "ndcg@10")
    typer.echo(f"{ds.name} {split}: {metrics['n_users']} users, beam {beam_width}, history "
               f"{'masked' if mask_history else 'not masked'}, {metrics['wall_seconds']:.1f} s")
    typer.echo(f"{'':<10}" + "  ".join(f"{k:>9}" for k in keys))
    if against is not None:
        rows.append(("against", metrics["against"]))
        metrics["against_model"] = str(against)
    for name, row in rows:
        typer.echo(f"{name:<10}" + "  ".join(f"{row[k]:>9.4f}" for k in keys))
    if against is not None:  # paired over the same users: model minus against
        paired = metrics["paired"]
        typer.echo(f"{'difference':<10}" + "  ".join(
            f"{paired[k]['difference']:>+9.4f}" for k in keys))
        typer.echo(f"{'  its SE':<10}" + "  ".join(f"{paired[k]['se']:>9.4f}" for k in keys))
    typer.echo(f"{'popularity':<10}" + "  ".join(f"{pop[k]:>9.4f}" for k in keys))
    for name, row in rows:
        typer.echo(f"{name + '/pop':<10}" + "  ".join(
            f"{row[k] / pop[k]:>8.1f}x" if pop[k] else f"{'-':>9}" for k in keys))
    metrics["popularity"] = {k: pop[k] for k in keys}
    if json_path is not None:
        atomic_write_json(json_path, metrics)


def parse_weights(text: str) -> list[float]:
    """``--item-weights``: comma-separated positive weights, each once."""
    try:
        weights = [float(w) for w in text.split(",") if w.strip()]
    except ValueError:
        raise typer.BadParameter(f"--item-weights: numbers separated by commas, got "
                                 f"{text!r}") from None
    if not weights or any(not 0 < w < float("inf") for w in weights) or \
            len(set(weights)) < len(weights):
        raise typer.BadParameter(f"--item-weights: distinct weights > 0, got {text!r}")
    return weights


def load_generative(model: Path, ds: Dataset, split: str, device: str,
                    field: str) -> tuple[Engine, torch.Tensor | None]:
    """A generative model's engine (``model`` or its training folder's best/) checked against
    ``ds``, and its soft-token user vectors for ``split`` (None without a soft token):
    ``test`` / ``val`` hold out the last item / two items, ``all`` the whole histories."""
    from genrec.engine import Engine
    from genrec.training.generative_run import check_index
    from genrec.training.user_vectors import fold_in, load_item_factors, load_saved_user_vectors

    folder = model_folder(model)
    engine = Engine.from_pretrained(folder, device=device)
    if engine.vocab is None:
        raise ValueError(f"{field}: {folder} has no Semantic-ID vocabulary")
    check_index(engine.vocab.index, ds, f"{field} index")
    if not engine.model.config.user_dim:
        return engine, None
    factors = load_item_factors(folder)
    if factors is not None:  # svd-causal: every item before the held-out one
        cut = {"all": 0, "test": 1, "val": 2}[split]
        return engine, fold_in(factors, [s[:len(s) - cut] if len(s) > cut else [] for s in
                                         ds.sequences])
    vectors = load_saved_user_vectors(folder, ds.user_ids)
    if vectors is None:
        raise ValueError(f"{field}: {folder} has a soft-token projector but no saved user "
                         "vectors")
    return engine, vectors
