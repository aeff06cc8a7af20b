"""The ranking side of ``genrec eval``: a DuoLM student and its teacher side by side on the
held-out item among sampled negatives (or the whole catalog)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from genrec.commands.common import INPUT_ERRORS, fail
from genrec.commands.dataset import TableOpt, load_dataset
from genrec.commands.duolm_data import (
    FEATURES_FILE,
    catalog_features,
    dataset_item_text,
    eval_split,
)
from genrec.training.run_layout import model_folder
from genrec.utils.device import resolve_device

if TYPE_CHECKING:
    from genrec.data.dataset import Dataset
    from genrec.duolm.ranker import DuoRanker


def eval_rankers(
    model: Path, teacher: Path | None, store: Path | None, data: Path | None,
    interactions: Path | None, items: Path | None, table: TableOpt, split: str, users: int | None,
    negatives: int, seed: int, device: str, threads: int | None, progress: bool,
    json_path: Path | None,
) -> None:
    """Rank each user's held-out item among ``negatives`` sampled items: the DuoLM student
    (and the teacher, when given) side by side; NDCG@10, Recall@10, MRR."""
    import time

    from genrec.duolm.cross_encoder import load_teacher
    from genrec.duolm.ranker import read_meta
    from genrec.duolm.requests import RowRankRequest
    from genrec.evaluation.ranking import evaluate_ranking
    from genrec.training.user_vectors import load_saved_user_vectors
    from genrec.utils.atomic import atomic_write_json

    dev = resolve_device(device, threads)
    try:
        ds = load_dataset(data, interactions, items, table)
        rankers = {}
        for path in [p for p in (model, teacher) if p is not None]:
            folder = model_folder(path)
            kind = read_meta(folder)["kind"]
            if kind == "teacher":
                rankers["teacher"] = load_teacher(folder, dataset_item_text(ds), ds.num_items,
                                                  device=dev, item_ids=list(ds.item_ids))
            else:
                rankers["student"] = load_student(folder, store, ds, progress, dev)
        meta_hist = int(read_meta(model_folder(model)).get("max_history", 20))
        _, exs, cands = eval_split(ds, meta_hist, users, negatives, seed, split)
        results = {}
        for name, ranker in rankers.items():
            start = time.perf_counter()

            vectors = None
            if name == "student" and ranker.engine.model.config.user_dim:
                vectors = load_saved_user_vectors(model_folder(model), ds.user_ids)

            def score(e, c, r=ranker, v=vectors):  # noqa: ANN001, ANN202
                return r.rank_rows([RowRankRequest(x.history, y,
                                                   None if v is None else v[x.user])
                                    for x, y in zip(e, c, strict=True)])

            results[name] = evaluate_ranking(score, exs, cands, progress=progress)
            results[name]["seconds"] = time.perf_counter() - start
    except INPUT_ERRORS as err:
        raise fail(err) from None
    keys = ("ndcg@10", "recall@10", "mrr", "ndcg@5", "recall@5")
    shown = f"{negatives} negatives" if negatives else "the full catalog"
    typer.echo(f"{ds.name} {split}: {len(exs)} users, 1 positive + {shown}")
    typer.echo(f"{'model':>8}  " + "  ".join(f"{k:>9}" for k in keys) + "  seconds")
    for name, m in results.items():
        typer.echo(f"{name:>8}  " + "  ".join(f"{m[k]:>9.4f}" for k in keys)
                   + f"  {m['seconds']:.1f}")
    if "teacher" in results and "student" in results:
        ratio = results["student"]["ndcg@10"] / max(results["teacher"]["ndcg@10"], 1e-12)
        typer.echo(f"student / teacher NDCG@10: {ratio:.3f}")
    if json_path is not None:
        atomic_write_json(json_path, {"split": split, "negatives": negatives, **results})


def load_student(folder: Path, store: Path | None, ds: Dataset, progress: bool,
                 dev: str) -> DuoRanker:
    """The DuoLM student in ``folder`` with the item store's table, or with ``ds``'s catalog
    encoded now by its item encoder (no ``store``)."""
    import torch

    from genrec.duolm.encoder import ItemEncoder
    from genrec.duolm.ranker import ENCODER_DIR, DuoRanker
    from genrec.duolm.store import StoreVersion

    if store is None:
        encoder = ItemEncoder.load(folder / ENCODER_DIR, dev)
        cache = folder.parent / FEATURES_FILE
        feats = catalog_features(encoder.config, ds, cache if cache.is_file() else None,
                                 progress)
        store = StoreVersion(encoder.encode_all(feats), torch.ones(ds.num_items, dtype=torch.bool),
                             0, list(ds.item_ids))
    return DuoRanker.from_pretrained(folder, store, device=dev)
