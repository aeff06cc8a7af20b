"""A generic training loop: AdamW, warmup + cosine LR, gradient clipping, per-epoch validation,
early stopping, and atomic checkpoints that a run resumes from.

Output folder layout::

    out/last/   model (config.json, *.safetensors), the task's extras, train_state.pt
    out/best/   the same for the epoch with the best validation metric so far
    out/history.json   one entry per finished epoch
    out/epochs/NNN/    with ``keep_epochs``: each epoch's model and extras (no train state),
                       for checkpoint averaging (``genrec average``)

A checkpoint folder is written in full under a hidden temporary name, then swapped in with
renames, so ``last/`` and ``best/`` always hold one complete epoch. ``train_state.pt`` holds the
optimizer (whole, keyed by parameter name: any rank count, with or without FSDP), scheduler,
epoch, step, best metric, early-stopping counter, history and RNG states.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn
from tqdm.auto import tqdm

from genrec.model.checkpoint import load_model
from genrec.training.checkpoints import (
    LAST,
    STATE_FILE,
    keep_epoch,
    publish_best,
    recover,
    rng_state,
    set_rng_state,
    write_checkpoint,
)
from genrec.training.distributed import World, current_world
from genrec.training.sharding import SHARDINGS, TrainModel, train_model
from genrec.utils.atomic import atomic_write_json

HISTORY_FILE = "history.json"


class TrainTask(Protocol):
    """What the loop needs from a task; batches must be deterministic in (seed, epoch)."""

    def num_batches(self, epoch: int) -> int: ...

    def batches(self, epoch: int) -> Iterable[Any]: ...

    def loss(self, model: nn.Module, batch: Any) -> tuple[torch.Tensor, int]: ...

    def validate(self, model: nn.Module) -> dict[str, float] | None: ...

    def save_extra(self, directory: Path) -> None: ...


@dataclass
class LoopConfig:
    """Optimisation and early-stopping settings (``patience`` 0: never stop early)."""

    epochs: int = 20
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup_ratio: float = 0.05
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    patience: int = 5
    monitor: str = "ndcg@10"
    seed: int = 0
    progress: bool = True
    keep_epochs: bool = False  # also keep every epoch's weights under out/epochs/NNN
    grad_accum: int = 1  # batches per optimizer step (their mean gradient)
    precision: str = "fp32"  # fp32 | bf16 (autocast; fp32 master weights and optimizer)
    sharding: str = "none"  # none | fsdp (FSDP2 over the ranks: genrec.training.sharding)

    def validate(self) -> None:
        """Raise ValueError naming the first bad field."""
        checks = {
            "epochs": self.epochs >= 1, "lr": self.lr > 0, "weight_decay": self.weight_decay >= 0,
            "warmup_ratio": 0 <= self.warmup_ratio < 1, "min_lr_ratio": 0 <= self.min_lr_ratio <= 1,
            "grad_clip": self.grad_clip >= 0, "patience": self.patience >= 0,
            "grad_accum": self.grad_accum >= 1, "precision": self.precision in ("fp32", "bf16"),
            "sharding": self.sharding in SHARDINGS,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"{name}: invalid value {getattr(self, name)!r}")


@dataclass
class FitResult:
    """Outcome of :func:`fit`: epochs finished so far, the best epoch (1-based) and metric."""

    epochs_done: int
    best_epoch: int | None
    best_metric: float | None
    stopped_early: bool
    history: list[dict] = field(default_factory=list)


def warmup_cosine(step: int, total: int, warmup: int, min_ratio: float) -> float:
    """LR multiplier: linear warmup over ``warmup`` steps, then cosine down to ``min_ratio``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def _optimizer(model: nn.Module, cfg: LoopConfig) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr)


def _run_epoch(
    train: TrainModel, task: TrainTask, epoch: int, cfg: LoopConfig,
    optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler,
    world: World,
) -> dict:
    model = train.root.train()
    total_loss = torch.zeros((), device=next(model.parameters()).device)
    steps = tokens = 0
    start = time.perf_counter()
    bar = tqdm(total=task.num_batches(epoch), desc=f"epoch {epoch + 1}/{cfg.epochs}",
               unit="step", disable=not (cfg.progress and world.main), leave=False)
    n_batches, accum = task.num_batches(epoch), cfg.grad_accum
    device_type = next(model.parameters()).device.type
    for k, batch in enumerate(task.batches(epoch)):
        share = 1.0
        if world.size > 1:  # this rank's part, its loss weighted by its share of the batch
            part, share = task.shard(batch, world.rank, world.size)
            if part is None and train.sharded:  # FSDP needs every rank in every forward
                part, share = batch, 0.0
            batch = part
        first, last = k % accum == 0, (k + 1) % accum == 0 or k + 1 == n_batches
        if first:
            optimizer.zero_grad(set_to_none=True)
            group = min(accum, n_batches - k)  # batches whose mean gradient this step takes
        if batch is not None:
            with torch.autocast(device_type, torch.bfloat16, enabled=cfg.precision == "bf16"):
                loss, n_tokens = model(batch)
            (loss.float() * (share * train.loss_scale(world) / group)).backward()
            total_loss += loss.detach().float() * share
            tokens += n_tokens if share else 0
        if not last:
            continue
        train.reduce_grads(world)  # summed: the gradient of the whole batch's loss
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        scheduler.step()
        steps += 1
        if steps % 10 == 0 or k + 1 == n_batches:
            mean = float(total_loss) / (k + 1)
            if not math.isfinite(mean):
                raise FloatingPointError(f"epoch {epoch + 1}: training loss is {mean}")
            elapsed = time.perf_counter() - start
            bar.set_postfix(loss=f"{mean:.4f}", tok_s=f"{tokens / elapsed:.0f}")
        bar.update(group)
    bar.close()
    seconds = time.perf_counter() - start
    total, tokens = world.sum(float(total_loss)), int(world.sum(tokens))
    return {"train_loss": total / max(1, n_batches), "steps": steps, "tokens": tokens,
            "train_seconds": seconds, "tokens_per_s": tokens / max(seconds, 1e-9),
            "lr": scheduler.get_last_lr()[0], "ranks": world.size}


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
    weights are those of ``out_dir/last``.
    """
    cfg = config or LoopConfig()
    cfg.validate()
    world = current_world(next(model.parameters()).device)
    if world.size > 1 and not hasattr(task, "shard"):
        raise ValueError(f"{type(task).__name__} does not train data-parallel yet (no shard); "
                         "run it in one process")
    out = Path(out_dir)
    if world.main:
        out.mkdir(parents=True, exist_ok=True)
        recover(out)
    world.barrier()
    state_file = out / LAST / STATE_FILE
    if state_file.is_file() and not resume:
        raise FileExistsError(f"{out}: already holds a checkpoint; pass resume (--resume) or "
                              "choose another output folder")
    state: dict[str, Any] = {"epoch": 0, "best_metric": None, "best_epoch": None,
                             "bad_epochs": 0, "stopped": False, "history": []}
    saved = None
    if resume and state_file.is_file():
        saved = torch.load(state_file, map_location="cpu", weights_only=True)
        if hasattr(model, "load_weights"):
            model.load_weights(out / LAST)
        else:
            model.load_state_dict(load_model(out / LAST).state_dict())
        state = {k: saved[k] for k in state}
        # a resumed run stops early under the patience it is given now (0: never)
        state["stopped"] = cfg.patience > 0 and state["bad_epochs"] >= cfg.patience
    else:
        torch.manual_seed(cfg.seed)
    world.broadcast_weights(model)  # every rank starts from rank 0's weights
    train = train_model(model, task, world, cfg.sharding, cfg.precision)
    # optimizer steps: one per grad_accum batches (and one for an epoch's remainder)
    total = sum(-(-task.num_batches(e) // cfg.grad_accum) for e in range(cfg.epochs))
    warmup = int(cfg.warmup_ratio * total)
    optimizer = _optimizer(train.root, cfg)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: warmup_cosine(s, total, warmup, cfg.min_lr_ratio)
    )
    if saved is not None:
        train.load_optimizer_state(optimizer, saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        set_rng_state(saved["rng"])

    for epoch in range(state["epoch"], cfg.epochs):
        if state["stopped"]:
            break
        stats = _run_epoch(train, task, epoch, cfg, optimizer, scheduler, world)
        start = time.perf_counter()
        train.sync_view()  # under FSDP: rank 0's plain copy gets the gathered weights
        view = train.view
        # rank 0 validates its plain model, in eval mode (no dropout)
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
        optimizer_state = train.optimizer_state(optimizer)  # whole, on rank 0 (collective)
        if view is not None:  # rank 0; the others wait: every rank holds the same state
            payload = {**state, "optimizer": optimizer_state,
                       "scheduler": scheduler.state_dict(), "rng": rng_state()}
            write_checkpoint(view, task, out, payload)
            if cfg.keep_epochs:
                keep_epoch(out, epoch + 1)
            if improved:
                publish_best(out)
            atomic_write_json(out / HISTORY_FILE, state["history"])
        world.barrier()
        if cfg.progress and world.main:
            shown = {k: round(v, 4) if isinstance(v, float) else v for k, v in entry.items()}
            tqdm.write(str(shown))
    return FitResult(state["epoch"], state["best_epoch"], state["best_metric"], state["stopped"],
                     state["history"])
