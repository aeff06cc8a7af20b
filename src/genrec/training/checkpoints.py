"""The files of a training run (the layout is in :mod:`genrec.training.loop`): checkpoint
folders written whole under a temporary name and swapped in with renames, recovery of a swap a
crash interrupted, and the RNG state a run resumes with."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

from genrec.model.checkpoint import load_model, save_model
from genrec.training.run_layout import BEST, EPOCHS, HISTORY, LAST, MODEL, epoch_folder
from genrec.utils.atomic import atomic_write, atomic_write_json

STATE_FILE = "train_state.pt"


def swap_in(src: Path, dst: Path) -> None:
    """Replace folder ``dst`` by ``src`` (renames; the old one removed)."""
    old = dst.with_name(f".{dst.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if dst.exists():
        os.replace(dst, old)
    os.replace(src, dst)
    shutil.rmtree(old, ignore_errors=True)


def recover(out: Path) -> None:
    """Finish a swap a crash interrupted; drop half-written temporary folders."""
    for name in (LAST, BEST, MODEL):
        old, dst = out / f".{name}.old", out / name
        if old.exists() and not dst.exists():
            os.replace(old, dst)
        shutil.rmtree(old, ignore_errors=True)
        shutil.rmtree(out / f".{name}.tmp", ignore_errors=True)
    for tmp in [*(out / EPOCHS).glob(".*.tmp"), *out.glob(f".{MODEL}-*.tmp")]:
        shutil.rmtree(tmp, ignore_errors=True)


def load_weights(model: nn.Module, folder: Path) -> None:
    """Load checkpoint ``folder``'s weights into ``model`` (its own ``load_weights``, else the
    HF layout)."""
    if hasattr(model, "load_weights"):
        model.load_weights(folder)
    else:
        model.load_state_dict(load_model(folder).state_dict())


def write_checkpoint(model: nn.Module, task: Any, out: Path, payload: dict) -> None:
    """``model`` (its own ``save_pretrained``, else the HF layout), the task's extras
    (``task.save_extra``) and ``payload`` (the train state) as ``out/last``, written whole and
    swapped in."""
    tmp = out / f".{LAST}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save = getattr(model, "save_pretrained", None)  # models of several parts save themselves
    save(tmp) if save is not None else save_model(model, tmp)
    task.save_extra(tmp)
    atomic_write(tmp / STATE_FILE, lambda t: torch.save(payload, t))
    swap_in(tmp, out / LAST)


def keep_epoch(out: Path, epoch: int) -> None:
    """A copy of ``out/last`` without the optimizer state as ``out/epochs/NNN``."""
    dst = epoch_folder(out, epoch)
    tmp = dst.with_name(f".{dst.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(out / LAST, tmp, ignore=shutil.ignore_patterns(STATE_FILE))
    swap_in(tmp, dst)


def publish_best(out: Path) -> None:
    """A copy of ``out/last`` as ``out/best``."""
    tmp = out / f".{BEST}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(out / LAST, tmp)
    swap_in(tmp, out / BEST)


def complete_epoch(out: Path, state: dict[str, Any], keep: bool) -> None:
    """Finish what a crash after ``out/last`` was swapped in may have left undone for its
    epoch (``state``: the loop's, read from ``out/last``): the epoch's kept copy (``keep``),
    ``best/`` when the epoch was the best, and ``history.json``."""
    epoch = state["epoch"]
    if keep and not (epoch_folder(out, epoch) / "config.json").is_file():
        keep_epoch(out, epoch)
    if state["best_epoch"] == epoch:
        publish_best(out)
    atomic_write_json(out / HISTORY, state["history"])


def rng_state() -> dict:
    """The RNG states a resumed run continues from."""
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what :func:`rng_state` saved."""
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def write_train_args(out: Path, args: dict, resume: bool) -> None:
    """A run's options in ``out/train_args.json`` (kept as first written on ``resume``); the
    folder is made."""
    from genrec.utils.atomic import atomic_write_json

    out.mkdir(parents=True, exist_ok=True)
    if not (resume and (out / "train_args.json").is_file()):
        atomic_write_json(out / "train_args.json", args)
