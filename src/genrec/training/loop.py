"""A generic training loop: AdamW, warmup + cosine LR, gradient clipping, per-epoch validation,
early stopping, and atomic checkpoints that a run resumes from.

Output folder layout::

    out/last/   model (config.json, *.safetensors), the task's extras, train_state.pt
    out/best/   the same for the epoch with the best validation metric so far
    out/history.json   one entry per finished epoch
    out/epochs/NNN/    each epoch's model and extras (no train state): all of them with
                       ``keep_epochs`` (for ``genrec average``), else those ``average`` needs
    out/model/  the final model, out/model.json how it was chosen: the best epoch, or with
                ``average`` the mean of the epochs around it if that validates better
                (:mod:`genrec.training.final_model`)

A checkpoint folder is written in full under a hidden temporary name, then swapped in with
renames, so ``last/`` and ``best/`` always hold one complete epoch. ``train_state.pt`` holds the
optimizer (whole, keyed by parameter name: any rank count, with or without FSDP), scheduler,
epoch, step, best metric, early-stopping counter, history and RNG states.
"""

from __future__ import annotations

import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from genrec.training.checkpoints import (
    LAST,
    STATE_FILE,
    complete_epoch,
    keep_epoch,
    load_weights,
    publish_best,
    recover,
    rng_state,
    set_rng_state,
    write_checkpoint,
)
from genrec.training.distributed import World, current_world
from genrec.training.epoch import adamw, run_epoch
from genrec.training.final_model import finish_run, prune_epochs
from genrec.training.loop_types import LoopConfig, TrainTask
from genrec.training.run_layout import EPOCHS, HISTORY
from genrec.training.sharding import TrainModel, train_model
from genrec.utils.atomic import atomic_write_json

# a fresh run's state (train_state.pt holds it, with the optimizer, scheduler and RNG states)
FRESH_STATE: dict[str, Any] = {"epoch": 0, "best_metric": None, "best_epoch": None,
                               "bad_epochs": 0, "stopped": False, "history": []}


@dataclass
class FitResult:
    """Outcome of :func:`fit`: epochs finished so far, the best epoch (1-based) and metric."""

    epochs_done: int
    best_epoch: int | None
    best_metric: float | None
    stopped_early: bool
    history: list[dict] = field(default_factory=list)
    final: dict[str, Any] | None = None  # how OUT/model was chosen (OUT/model.json)


def warmup_cosine(step: int, total: int, warmup: int, min_ratio: float) -> float:
    """LR multiplier: linear warmup over ``warmup`` steps, then cosine down to ``min_ratio``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def fit(
    model: nn.Module, task: TrainTask, out_dir: str | Path, config: LoopConfig | None = None,
    resume: bool = False,
) -> FitResult:
    """Train ``model`` on ``task`` for ``config.epochs`` epochs, checkpointing every epoch.

    With ``resume`` an existing ``out_dir/last`` checkpoint is loaded (weights, optimizer,
    scheduler, RNG, early-stopping state) and training continues after its epoch; without it an
    existing checkpoint is an error, so a run is never overwritten by accident.

    Under ``torchrun`` (several ranks, :mod:`genrec.training.distributed`) every rank trains
    its shard of each batch (the task must implement ``shard``); rank 0 validates and writes.
    With ``config.sharding`` "fsdp" the ranks also shard the weights, gradients and optimizer
    state (FSDP2, :mod:`genrec.training.sharding`), and ``model`` is left sharded: the trained
    weights are those of ``out_dir/last``. Without FSDP ``model`` ends with the final model's
    weights (``out_dir/model``). Every rank leaves the process group when the run ends.
    """
    cfg = config or LoopConfig()
    cfg.validate()
    world = current_world(next(model.parameters()).device)
    if world.size > 1 and not hasattr(task, "shard"):
        raise ValueError(f"{type(task).__name__} does not train data-parallel yet (no shard); "
                         "run it in one process")
    out = Path(out_dir)
    state, saved = _start(model, out, cfg, world, resume)
    world.broadcast_weights(model)  # every rank starts from rank 0's weights
    train = train_model(model, task, world, cfg.sharding, cfg.precision)
    optimizer, scheduler = _optimization(train, task, cfg, saved)
    for epoch in range(state["epoch"], cfg.epochs):
        if state["stopped"]:
            break
        stats = run_epoch(train, task, epoch, cfg, optimizer, scheduler, world)
        entry, improved = _validate(train, task, cfg, world, state, epoch, stats)
        _checkpoint(train, task, out, cfg, state, optimizer, scheduler, improved)
        world.barrier()
        if cfg.progress and world.main:
            shown = {k: round(v, 4) if isinstance(v, float) else v for k, v in entry.items()}
            tqdm.write(str(shown))
    final = None
    if train.view is not None:
        final = finish_run(train.view, out, cfg.average, cfg.monitor, state, task.validate,
                           load_weights, getattr(task, "finish", None),
                           getattr(task, "final_validation", None))
        if not cfg.keep_epochs:
            shutil.rmtree(out / EPOCHS, ignore_errors=True)
    world.barrier()
    world.close()
    return FitResult(state["epoch"], state["best_epoch"], state["best_metric"], state["stopped"],
                     state["history"], final)


def _start(model: nn.Module, out: Path, cfg: LoopConfig, world: World, resume: bool
           ) -> tuple[dict[str, Any], dict | None]:
    """The run's state (:data:`FRESH_STATE`, or ``out/last``'s with ``resume``) and the saved
    train state to restore the optimizer from (``None`` for a fresh run, which is seeded).
    ``model`` gets the saved weights; ``out`` is created, an interrupted swap recovered and
    what a crash after the last checkpoint's swap left undone completed."""
    if world.main:
        out.mkdir(parents=True, exist_ok=True)
        recover(out)
    world.barrier()
    state_file = out / LAST / STATE_FILE
    if state_file.is_file() and not resume:
        raise FileExistsError(f"{out}: already holds a checkpoint; pass resume (--resume) or "
                              "choose another output folder")
    if not (resume and state_file.is_file()):
        torch.manual_seed(cfg.seed)
        return dict(FRESH_STATE, history=[]), None
    saved = torch.load(state_file, map_location="cpu", weights_only=True)
    load_weights(model, out / LAST)
    state = {k: saved[k] for k in FRESH_STATE}
    if world.main:
        complete_epoch(out, state, cfg.keep_epochs or cfg.average > 0)
    # a resumed run stops early under the patience it is given now (0: never)
    state["stopped"] = cfg.patience > 0 and state["bad_epochs"] >= cfg.patience
    return state, saved


def _optimization(train: TrainModel, task: TrainTask, cfg: LoopConfig, saved: dict | None
                  ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """AdamW and its warmup + cosine schedule over the whole run, restored from ``saved``
    (with the RNG states) when resuming."""
    # optimizer steps: one per grad_accum batches (and one for an epoch's remainder)
    total = sum(-(-task.num_batches(e) // cfg.grad_accum) for e in range(cfg.epochs))
    warmup = int(cfg.warmup_ratio * total)
    optimizer = adamw(train.root, cfg)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: warmup_cosine(s, total, warmup, cfg.min_lr_ratio)
    )
    if saved is not None:
        train.load_optimizer_state(optimizer, saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        set_rng_state(saved["rng"])
    return optimizer, scheduler


def _validate(train: TrainModel, task: TrainTask, cfg: LoopConfig, world: World,
              state: dict[str, Any], epoch: int, stats: dict) -> tuple[dict, bool]:
    """Validate after ``epoch`` (rank 0, its plain model in eval mode; the metrics sent to
    every rank) and update ``state``: history, best metric, early stopping. Returns the
    epoch's history entry and whether it improved (always, without validation)."""
    start = time.perf_counter()
    train.sync_view()  # under FSDP: rank 0's plain copy gets the gathered weights
    view = train.view
    metrics = world.broadcast(task.validate(view.eval()) if view is not None else None)
    entry = {"epoch": epoch + 1, **stats, "val_seconds": time.perf_counter() - start}
    improved = True
    if metrics is not None:
        if cfg.monitor not in metrics:
            raise KeyError(f"monitor: validation returned no {cfg.monitor!r} "
                           f"(has {sorted(metrics)})")
        entry.update({f"val_{k}": v for k, v in metrics.items()})
        value = float(metrics[cfg.monitor])
        improved = state["best_metric"] is None or value > state["best_metric"]
        if improved:
            state["best_metric"] = value
    state["bad_epochs"] = 0 if improved else state["bad_epochs"] + 1
    if improved:
        state["best_epoch"] = epoch + 1
    state["stopped"] = cfg.patience > 0 and state["bad_epochs"] >= cfg.patience
    state["epoch"] = epoch + 1
    state["history"].append(entry)
    return entry, improved


def _checkpoint(train: TrainModel, task: TrainTask, out: Path, cfg: LoopConfig,
                state: dict[str, Any], optimizer: torch.optim.Optimizer,
                scheduler: torch.optim.lr_scheduler.LRScheduler, improved: bool) -> None:
    """Write the history, then ``out/last`` (and ``best`` when ``improved``, the epoch's
    kept copy) on rank 0; every rank takes part in gathering the optimizer state. A crash
    leaves the history at most one epoch ahead of ``last``, and a resume rewrites it from
    ``last`` (:func:`genrec.training.checkpoints.complete_epoch`)."""
    optimizer_state = train.optimizer_state(optimizer)  # whole, on rank 0 (collective)
    if train.view is None:  # not rank 0; it waits: every rank holds the same state
        return
    payload = {**state, "optimizer": optimizer_state,
               "scheduler": scheduler.state_dict(), "rng": rng_state()}
    atomic_write_json(out / HISTORY, state["history"])
    write_checkpoint(train.view, task, out, payload)
    if cfg.keep_epochs or cfg.average:
        keep_epoch(out, state["epoch"])
    if cfg.average and not cfg.keep_epochs:
        prune_epochs(out, state["best_epoch"], cfg.average)
    if improved:
        publish_best(out)
