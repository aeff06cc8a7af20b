"""One training epoch of :func:`genrec.training.loop.fit`: gradient accumulation, bf16
autocast, clipping, AdamW steps (:func:`adamw`) and the progress bar."""

from __future__ import annotations

import math
import time

import torch
from torch import nn
from tqdm.auto import tqdm

from genrec.training.distributed import World
from genrec.training.loop_types import LoopConfig, TrainTask
from genrec.training.sharding import TrainModel


def adamw(model: nn.Module, cfg: LoopConfig) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters, weight decay on the matrices only."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr)


def run_epoch(
    train: TrainModel, task: TrainTask, epoch: int, cfg: LoopConfig,
    optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler,
    world: World,
) -> dict:
    """Train one epoch (each rank its shard of every batch; an optimizer step per
    ``grad_accum`` batches, clipped) and return its statistics for the history."""
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
