"""Data-parallel training across processes started by ``torchrun`` (gloo on the CPU, NCCL on
GPUs).

Every rank builds the same model (its weights are then broadcast from rank 0) and walks the
same global batches (deterministic in seed and epoch); each takes its shard of every batch
(:meth:`ShardedTask.shard`) and weights its loss by its share of the batch's loss terms, so
the summed gradients (one all-reduce per step) are exactly those of one process on the whole
batch, and every rank takes the same optimizer step. Rank 0 alone validates (the metrics are
broadcast, so early stopping agrees) and writes checkpoints (the others wait), and the saved
state is the same on every rank: a run resumes with any number of ranks.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn


class ShardedTask(Protocol):
    """A training task whose batches split across ranks."""

    def shard(self, batch: Any, rank: int, world: int) -> tuple[Any | None, float]:
        """This rank's part of ``batch`` (``None``: nothing) and its share of the batch's
        loss terms (the shares of all ranks sum to 1)."""
        ...


@dataclass(frozen=True)
class World:
    """This process's place: ``rank`` of ``size`` (1: no distribution)."""

    rank: int = 0
    size: int = 1

    @property
    def main(self) -> bool:
        """Rank 0: the one that validates, writes and reports."""
        return self.rank == 0

    def all_reduce_grads(self, model: nn.Module) -> None:
        """Sum every parameter's gradient over the ranks (one flat all-reduce); a parameter
        without a gradient on this rank contributes zeros."""
        if self.size == 1:
            return
        params = [p for p in model.parameters() if p.requires_grad]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        start = 0
        for p in params:  # views of the summed buffer: no copy
            n = p.numel()
            p.grad = flat[start : start + n].view_as(p)
            start += n

    def sum(self, value: float) -> float:
        """``value`` summed over the ranks."""
        if self.size == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t)
        return float(t[0])

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if self.size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def broadcast_weights(self, model: nn.Module) -> None:
        """Rank 0's parameters and buffers on every rank."""
        if self.size == 1:
            return
        with torch.no_grad():
            for t in list(model.parameters()) + list(model.buffers()):
                dist.broadcast(t.data, src=0)

    def barrier(self) -> None:
        if self.size > 1:
            dist.barrier()

    def close(self) -> None:
        """Leave the process group once every rank is done (a no-op without distribution):
        a rank that exits with the group still open can abort in its teardown."""
        if self.size > 1 and dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()


def current_world(device: torch.device | None = None) -> World:
    """The world of this process: joins the process group ``torchrun`` describes in the
    environment (``RANK``, ``WORLD_SIZE``, ...; gloo, or NCCL for a CUDA ``device``) once;
    ``World()`` when not started by it."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return World()
    if not dist.is_initialized():
        cuda = device is not None and device.type == "cuda"
        dist.init_process_group("nccl" if cuda else "gloo")
    return World(dist.get_rank(), dist.get_world_size())


def local_rank() -> int:
    """``LOCAL_RANK`` of a ``torchrun`` process (0 otherwise): its GPU on a multi-GPU node."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def relaunch(nproc: int) -> int | None:
    """For a command given ``--nproc N`` (N > 1) outside ``torchrun``: run this same command
    line under it (without ``--nproc``) and return its exit status; ``None``: go on here."""
    if nproc <= 1 or "WORLD_SIZE" in os.environ:
        return None
    return launch(nproc, without_option(sys.argv[1:], "--nproc"))


def main_process() -> bool:
    """Whether this process writes and reports: rank 0 under ``torchrun``, else always."""
    return os.environ.get("RANK", "0") == "0"


def launch(nproc: int, argv: Sequence[str]) -> int:
    """Run ``python -m genrec.cli ARGV`` under ``torchrun --nproc-per-node NPROC`` on this
    machine (a standalone rendezvous); returns its exit status."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", "-m", "genrec.cli", *argv]
    return subprocess.call(cmd)


def without_option(argv: Sequence[str], name: str) -> list[str]:
    """``argv`` without ``--name VALUE`` / ``--name=VALUE``."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == name:
            skip = True
        elif not arg.startswith(name + "="):
            out.append(arg)
    return out
