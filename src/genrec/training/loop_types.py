"""What the training loop (:func:`genrec.training.loop.fit`) is given: its settings
(:class:`LoopConfig`) and the task it trains (:class:`TrainTask`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from genrec.training.sharding import SHARDINGS


class TrainTask(Protocol):
    """What the loop needs from a task; batches must be deterministic in (seed, epoch). A
    task may also define ``finish(model, folder) -> dict``: called once with the run's final
    model and its folder before it is published, and ``final_validation``: None or the
    validation the final model is chosen with (e.g. on a larger sample;
    :mod:`genrec.training.final_model`)."""

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
    # the final model: the best epoch or the mean of epochs best-k..best+k (k <= average),
    # whichever validates best (0: the best epoch)
    average: int = 0
    grad_accum: int = 1  # batches per optimizer step (their mean gradient)
    precision: str = "fp32"  # fp32 | bf16 (autocast; fp32 master weights and optimizer)
    sharding: str = "none"  # none | fsdp (FSDP2 over the ranks: genrec.training.sharding)

    def validate(self) -> None:
        """Raise ValueError naming the first bad field."""
        checks = {
            "epochs": self.epochs >= 1, "lr": self.lr > 0, "weight_decay": self.weight_decay >= 0,
            "warmup_ratio": 0 <= self.warmup_ratio < 1, "min_lr_ratio": 0 <= self.min_lr_ratio <= 1,
            "grad_clip": self.grad_clip >= 0, "patience": self.patience >= 0,
            "average": self.average >= 0,
            "grad_accum": self.grad_accum >= 1, "precision": self.precision in ("fp32", "bf16"),
            "sharding": self.sharding in SHARDINGS,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"{name}: invalid value {getattr(self, name)!r}")
