"""RecBole side of bench/quality.py, run under a RecBole 1.2.1 interpreter: ``IN.json OUT.json``.

The job (written by ``bench/_quality_data.py``) names a RecBole dataset folder (an atomic
``.inter`` file whose timestamp field is each user's rank: leave-one-out by "time" then equals
genrec's split), the models to train (SASRec, Pop), a training-time cap and config overrides,
and the test users: user token, target item, and every item before the target (oldest first).

For each model: RecBole's own pipeline (``create_dataset``, ``data_preparation``, its trainer
with validation every epoch, early stopping and the best epoch reloaded), with the training
time capped (a cut epoch ends early and is then validated; training stops after it). Then every
test user's scores over all items are turned into the top-K items in genrec's item indices,
once as they are and once with the user's earlier items masked. bench/quality.py computes the
metrics from those lists with genrec's own code. RecBole's own test metrics are returned too.

Shims for RecBole 1.2.1 on torch 2.13, applied here and nowhere else: its two ``torch.load``
calls (best checkpoint, resume) need ``weights_only=False``; ``recbole.quick_start`` (which
imports ray) is not used.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import time
from typing import Any


class TimeUp(Exception):
    """Raised when the training-time budget is spent: ends ``Trainer.fit``."""


CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}


class _Until:
    """A dataloader that stops yielding batches once ``clock()`` reaches ``deadline``."""

    def __init__(self, loader: Any, deadline: float, clock: Any = time.perf_counter) -> None:
        self.loader, self.deadline, self.clock = loader, deadline, clock
        self.batches, self.cut = 0, False

    def __iter__(self):  # noqa: ANN204
        for batch in self.loader:
            if self.clock() >= self.deadline:
                self.cut = True
                return
            self.batches += 1
            yield batch

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


def shim_torch_load() -> None:
    """RecBole 1.2.1 saves a checkpoint with its config object inside; torch >= 2.6 loads with
    ``weights_only=True`` by default and refuses it."""
    import torch

    load = torch.load

    @functools.wraps(load)
    def patched(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("weights_only", False)
        return load(*args, **kwargs)

    torch.load = patched


def capped_trainer(base: type, budget_s: float, clock: str = "cpu") -> type:
    """``base`` (a RecBole trainer class) whose ``_train_epoch`` calls share ``budget_s``
    seconds of ``clock`` (``"cpu"``: this process's CPU time, which on a busy machine counts
    only the compute the model got; ``"wall"``); the epoch in which the budget runs out stops
    early and the next one raises :class:`TimeUp`. Records per-epoch training times, batches,
    and validation scores."""
    tick = CLOCKS[clock]

    class Capped(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.budget_left, self.log, self.best_epoch = budget_s, [], None

        def _train_epoch(self, train_data: Any, epoch_idx: int, *args: Any,
                         **kwargs: Any) -> Any:
            if self.budget_left <= 0:
                raise TimeUp
            start, wall = tick(), time.perf_counter()
            data = _Until(train_data, start + self.budget_left, tick)
            loss = super()._train_epoch(data, epoch_idx, *args, **kwargs)
            took = tick() - start
            self.budget_left -= took
            self.log.append({"epoch": epoch_idx + 1, "train_seconds": round(took, 2),
                             "train_wall_seconds": round(time.perf_counter() - wall, 2),
                             "batches": data.batches, "of_batches": len(train_data),
                             "cut": data.cut, "loss": None if loss is None else float(
                                 sum(loss) if isinstance(loss, tuple) else loss)})
            if data.cut:
                self.budget_left = 0.0
            return loss

        def _valid_epoch(self, valid_data: Any, show_progress: bool = False) -> Any:
            start = time.perf_counter()
            score, result = super()._valid_epoch(valid_data, show_progress=show_progress)
            if self.log:
                self.log[-1].update(valid_seconds=round(time.perf_counter() - start, 2),
                                    valid_score=float(score))
            return score, result

        def _save_checkpoint(self, epoch: int, *args: Any, **kwargs: Any) -> None:
            self.best_epoch = epoch + 1
            super()._save_checkpoint(epoch, *args, **kwargs)

    return Capped


def base_config(job: dict[str, Any], model: str) -> dict[str, Any]:
    """RecBole defaults except what the protocol fixes: leave-one-out by the rank field, full
    ranking, CPU, no negative sampling for SASRec's cross-entropy and for Pop (its pointwise
    batches would add the sampled negatives to the counts); then the job's overrides."""
    cfg = {
        "data_path": job["data_path"], "checkpoint_dir": job["checkpoint_dir"],
        "use_gpu": False, "show_progress": False, "seed": job.get("seed", 2020),
        "load_col": {"inter": ["user_id", "item_id", "timestamp"]},
        "eval_args": {"split": {"LS": "valid_and_test"}, "order": "TO", "group_by": "user",
                      "mode": "full"},
        "metrics": ["Recall", "MRR", "NDCG"], "topk": [5, 10], "valid_metric": "MRR@10",
    }
    if model in ("SASRec", "Pop"):  # CE needs none; Pop would count the sampled negatives
        cfg["train_neg_sample_args"] = None
    return {**cfg, **job.get("overrides", {}).get(model, {})}


def rank_test_users(model: Any, test_data: Any, dataset: Any, job: dict[str, Any],
                    max_len: int) -> dict:
    """Top-K items (genrec indices) of every job test user, unmasked and masked, plus checks
    that RecBole's split is genrec's (same target; SASRec: its input is the last ``max_len``
    items before the target)."""
    import torch

    k, n_items = job["k"], job["n_items"]
    uid, iid = dataset.uid_field, dataset.iid_field
    item_tokens = dataset.field2id_token[iid]
    token_id = {t: i for i, t in enumerate(item_tokens)}
    cols = torch.tensor([token_id.get(str(g), 0) for g in range(n_items)])
    absent = cols == 0  # [PAD] or an item RecBole never saw
    genrec_of = torch.full((len(item_tokens),), -1, dtype=torch.int64)
    genrec_of[cols[~absent]] = torch.arange(n_items)[~absent]
    wanted = {u["user"]: i for i, u in enumerate(job["test"])}
    top = [None] * len(wanted)
    top_masked = [None] * len(wanted)
    target_mismatch, history_mismatch = 0, 0
    model.eval()
    with torch.no_grad():
        for inter, _history, pos_u, pos_i in test_data:
            scores = model.full_sort_predict(inter).view(len(inter), -1)[:, cols]
            scores[:, absent] = -float("inf")
            users = dataset.field2id_token[uid][inter[uid].numpy()]
            targets = torch.full((len(inter),), -1, dtype=torch.int64)
            targets[pos_u] = genrec_of[pos_i]
            for row, user in enumerate(users):
                i = wanted.get(str(user))
                if i is None:
                    continue
                case = job["test"][i]
                target_mismatch += int(targets[row]) != case["target"]
                if "item_id_list" in inter.interaction:
                    n = int(inter["item_length"][row])
                    seq = genrec_of[inter["item_id_list"][row, :n]].tolist()
                    expected = case["history"][-max_len:]
                    history_mismatch += int(seq != expected)
                row_scores = scores[row]
                top[i] = torch.topk(row_scores, k).indices.tolist()
                masked = row_scores.clone()
                masked[torch.tensor(case["history"], dtype=torch.int64)] = -float("inf")
                top_masked[i] = torch.topk(masked, k).indices.tolist()
    missing = sum(t is None for t in top)
    return {"top": top, "top_masked": top_masked, "target_mismatch": target_mismatch,
            "history_mismatch": history_mismatch, "missing_users": missing}


def run_model(job: dict[str, Any], name: str) -> dict[str, Any]:
    """Train and rank one RecBole model; see the module docstring."""
    import torch
    from recbole.config import Config
    from recbole.data import create_dataset, data_preparation
    from recbole.utils import get_model, get_trainer, init_seed

    config = Config(model=name, dataset=job["dataset"], config_dict=base_config(job, name))
    init_seed(config["seed"], config["reproducibility"])
    start = time.perf_counter()
    dataset = create_dataset(config)
    train_data, valid_data, test_data = data_preparation(config, dataset)
    prep = time.perf_counter() - start
    init_seed(config["seed"] + config["local_rank"], config["reproducibility"])
    model = get_model(config["model"])(config, train_data._dataset).to(config["device"])
    trainer = capped_trainer(get_trainer(config["MODEL_TYPE"], config["model"]),
                             job["train_seconds"], job.get("clock", "cpu"))(config, model)
    start = time.perf_counter()
    try:
        trainer.fit(train_data, valid_data, saved=True, show_progress=False, verbose=True)
        stopped = "early stopping or the epoch limit"
    except TimeUp:
        stopped = "training-time cap"
    fit_s = time.perf_counter() - start
    own = trainer.evaluate(test_data, load_best_model=True)  # torch.load of the best epoch
    start = time.perf_counter()
    ranked = rank_test_users(trainer.model, test_data, test_data._dataset, job,
                             config["MAX_ITEM_LIST_LENGTH"])
    keys = ("n_layers", "n_heads", "hidden_size", "inner_size", "hidden_dropout_prob",
            "attn_dropout_prob", "loss_type", "MAX_ITEM_LIST_LENGTH", "learning_rate",
            "train_batch_size", "epochs", "stopping_step", "valid_metric", "seed")
    return {
        **ranked, "rank_seconds": round(time.perf_counter() - start, 2),
        "prepare_seconds": round(prep, 2), "fit_seconds": round(fit_s, 2),
        "train_seconds": round(sum(e["train_seconds"] for e in trainer.log), 2),
        "train_wall_seconds": round(sum(e["train_wall_seconds"] for e in trainer.log), 2),
        "clock": job.get("clock", "cpu"),
        "epochs": trainer.log, "best_epoch": trainer.best_epoch, "stopped_by": stopped,
        "recbole_test": {k: float(v) for k, v in own.items()},
        "masked_by_recbole": config["MODEL_TYPE"].name != "SEQUENTIAL",
        "config": {k: config[k] for k in keys if k in config},
        "params": sum(p.numel() for p in model.parameters()), "threads": torch.get_num_threads(),
    }


def main(in_path: str, out_path: str) -> None:
    with open(in_path) as f:
        job = json.load(f)
    sys.argv = sys.argv[:1]  # RecBole's Config reads "--key=value" arguments from it
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(message)s")  # its training log, to the log file
    import numpy
    import recbole
    import torch

    torch.set_num_threads(job.get("threads", 1))
    shim_torch_load()
    results = {name: run_model(job, name) for name in job["models"]}
    versions = {"recbole": recbole.__version__, "torch": torch.__version__,
                "numpy": numpy.__version__, "python": sys.version.split()[0]}
    tmp = f"{out_path}.tmp"  # atomic: a kept answer is reused by --reuse-recbole
    with open(tmp, "w") as f:
        json.dump({"results": results, "versions": versions}, f)
    os.replace(tmp, out_path)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
