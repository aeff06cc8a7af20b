"""What a training step runs through: one root module whose forward is the whole loss, trained
data-parallel as it is (gradients summed by :meth:`World.all_reduce_grads`) or sharded with
PyTorch's FSDP2 (``torch.distributed.fsdp.fully_shard``, ``LoopConfig.sharding = "fsdp"``).

Training computes parts of its loss outside the decoder's forward (input embeddings, the
soft-token projector, the LM head, the DuoLM item encoder): :class:`LossModule` makes the whole
loss one module's forward, so FSDP's hooks gather every parameter before it is used. Under FSDP
each decoder layer is sharded on its own (its weights gathered for its forward and again for its
backward, then freed) and the root holds the rest as one group (embeddings, projector, final
norm, LM head, encoder); gradients are reduce-scattered in the backward, so each rank keeps 1/N
of the weights, gradients and AdamW state. With ``bf16`` FSDP's ``MixedPrecisionPolicy``
gathers the weights in bf16 (the fp32 shards stay the master weights, gradients are reduced in
fp32) and autocast runs as without FSDP.

Checkpoints are the same with and without FSDP: rank 0's plain copy of the model
(:attr:`TrainModel.view`, loaded with the gathered full weights each epoch) validates and is
saved in the HF layout, and the optimizer state is saved whole, keyed by parameter name; so a
run resumes with any number of ranks, with or without FSDP. That copy lives on rank 0's device
(weights only: no gradients, no optimizer state, 4 of the 16 bytes per parameter of fp32 AdamW
training), so a model must still fit one device for inference.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh

from genrec.model.decoder import DecoderLayer
from genrec.training.distributed import World

SHARDINGS = ("none", "fsdp")
PREFIX = "model."  # LossModule's name for the model: its parameters' names start with it
# full tensors, gathered to rank 0's CPU (the other ranks get an empty dict)
FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


class LossModule(nn.Module):
    """``task.loss(model, batch)`` as this module's forward (the root FSDP shards)."""

    def __init__(self, model: nn.Module, task: Any) -> None:
        super().__init__()
        self.model = model
        self.task = task  # not a module: holds no parameters of its own

    def forward(self, batch: Any) -> tuple[torch.Tensor, int]:
        """(mean loss of ``batch``, tokens processed)."""
        return self.task.loss(self.model, batch)


@dataclass
class TrainModel:
    """The module a run trains (``root``; its parameters are DTensor shards when ``sharded``)
    and the plain model rank 0 validates and saves (``view``: the model itself without
    sharding, a copy loaded by :meth:`sync_view` with it; ``None`` on the other ranks)."""

    root: LossModule
    view: nn.Module | None
    sharded: bool

    def loss_scale(self, world: World) -> float:
        """Factor on each rank's loss: FSDP's reduce-scatter averages over the ranks where the
        loop's shares (summing to 1 over the ranks) need the sum."""
        return float(world.size) if self.sharded else 1.0

    def reduce_grads(self, world: World) -> None:
        """The summed gradients of a step on every rank (FSDP reduced them in the backward)."""
        if not self.sharded:
            world.all_reduce_grads(self.root)

    def sync_view(self) -> None:
        """Rank 0's ``view`` gets the current full weights; every rank calls it (FSDP gathers
        the shards); nothing to do without sharding."""
        if not self.sharded:
            return
        full = get_model_state_dict(self.root, options=FULL)
        if self.view is not None:
            self.view.load_state_dict({k.removeprefix(PREFIX): v for k, v in full.items()})

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict:
        """The whole optimizer state on rank 0's CPU, keyed by parameter name (empty on the
        other ranks); every rank calls it."""
        return get_optimizer_state_dict(self.root, optimizer, options=FULL)

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        """Load what :meth:`optimizer_state` saved (any rank count, sharded or not) into this
        run's optimizer (its shards under FSDP); every rank calls it with the whole state."""
        groups = state.get("param_groups") or [{"params": []}]
        if any(isinstance(p, int) for g in groups for p in g["params"]):
            # saved before states were keyed by name: parameter order, valid unsharded only
            if self.sharded:
                raise ValueError("this checkpoint's optimizer state is keyed by position; "
                                 "resume it once without --fsdp, then with it")
            optimizer.load_state_dict(state)
            return
        set_optimizer_state_dict(self.root, optimizer, state,
                                 options=StateDictOptions(full_state_dict=True))


def train_model(model: nn.Module, task: Any, world: World, sharding: str = "none",
                precision: str = "fp32") -> TrainModel:
    """``model`` trained through a :class:`LossModule` over ``task``; with ``sharding`` "fsdp"
    and several ranks, sharded in place by FSDP2 (every rank must hold the same weights
    first). One rank has nothing to shard across: it trains unsharded."""
    if sharding not in SHARDINGS:
        raise ValueError(f"sharding: expected one of {SHARDINGS}, got {sharding!r}")
    root = LossModule(model, task)
    if sharding == "none" or world.size == 1:
        return TrainModel(root, model if world.main else None, sharded=False)
    device = next(model.parameters()).device
    fully_shard, policy = fsdp_api(device)
    if device.type == "cuda":  # FSDP gathers on the current device: this rank's own GPU
        torch.cuda.set_device(device)
    view = copy.deepcopy(model) if world.main else None  # before the parameters become shards
    mesh = init_device_mesh(device.type, (world.size,))
    # inputs are left as they come (autocast casts where needed): FSDP's input cast would
    # rebuild every dataclass argument (layouts, batches) in each layer's forward
    mp = policy(param_dtype=torch.bfloat16 if precision == "bf16" else None,
                reduce_dtype=torch.float32, cast_forward_inputs=False)
    for layer in [m for m in model.modules() if isinstance(m, DecoderLayer)]:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(root, mesh=mesh, mp_policy=mp)
    return TrainModel(root, view, sharded=True)


def fsdp_api(device: torch.device) -> tuple[Any, Any]:
    """``fully_shard`` and ``MixedPrecisionPolicy`` of ``torch.distributed.fsdp`` (public
    since torch 2.6) for training on ``device``; ValueError (a clear message, as for a bad
    option) where this torch lacks them."""
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError as err:
        raise ValueError(f"--fsdp needs torch.distributed.fsdp.fully_shard (FSDP2, torch >= "
                           f"2.6); this is torch {torch.__version__}") from err
    # FSDP2 orders its gathers with stream events; the CPU's no-op ones came in torch 2.7
    # (2.6 fails in the first forward: 'Stream' object has no attribute 'record_event')
    if device.type == "cpu" and not hasattr(torch.cpu.Stream, "record_event"):
        raise ValueError(f"--fsdp on the CPU needs torch >= 2.7 (CPU stream events for "
                           f"FSDP2); this is torch {torch.__version__}: train without --fsdp "
                           "here, or on GPUs")
    return fully_shard, MixedPrecisionPolicy
