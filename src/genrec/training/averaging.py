"""Checkpoint averaging: the element-wise mean of the weights of several checkpoints of one run
(e.g. the last few epochs, kept with ``--keep-epochs``), written as a new checkpoint.

Averaging the weights of neighbouring epochs of a converged run usually generalises a little
better than any single one of them (fairseq's ``average_checkpoints``, stochastic weight
averaging). Choose the epochs on the validation split, never on the test split.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from genrec.training.checkpoints import STATE_FILE

SOURCES_FILE = "averaged_from.json"


class AveragingError(ValueError):
    """The checkpoints cannot be averaged (different runs, shapes or files)."""


def _files(root: Path) -> dict[str, Path]:
    # every file under root by its relative path, without the optimizer state
    return {
        str(p.relative_to(root)): p for p in sorted(root.rglob("*"))
        if p.is_file() and p.name not in (STATE_FILE, SOURCES_FILE)
    }


def _mean(name: str, key: str, tensors: list[torch.Tensor]) -> torch.Tensor:
    first = tensors[0]
    for t in tensors[1:]:
        if t.shape != first.shape or t.dtype != first.dtype:
            raise AveragingError(f"{name}: tensor {key!r} is {tuple(t.shape)} {t.dtype} in one "
                                 f"checkpoint and {tuple(first.shape)} {first.dtype} in another")
    if all(torch.equal(first, t) for t in tensors[1:]):
        return first  # identical (frozen weights, stored user vectors): kept bit for bit
    if not first.is_floating_point():
        raise AveragingError(f"{name}: integer tensor {key!r} differs between checkpoints")
    total = torch.zeros(first.shape, dtype=torch.float64)
    for t in tensors:
        total += t.double()
    return (total / len(tensors)).to(first.dtype).contiguous()


def average_checkpoints(sources: Sequence[str | Path], out: str | Path) -> Path:
    """Write the mean of ``sources``' weights to the new checkpoint folder ``out``.

    Every ``*.safetensors`` file is averaged tensor by tensor (in float64, stored in each
    tensor's dtype); every other file (config, Semantic-ID index, vocabulary) must be
    identical in all sources and is copied. ``out`` must not exist; it appears whole or not at
    all. Raises :class:`AveragingError` naming the first difference.
    """
    dirs = [Path(s) for s in sources]
    if len(dirs) < 2:
        raise AveragingError("checkpoints: give at least two to average")
    if len({d.resolve() for d in dirs}) != len(dirs):
        raise AveragingError("checkpoints: the same folder is given twice")
    for d in dirs:
        if not (d / "config.json").is_file():
            raise AveragingError(f"{d}: not a checkpoint folder (no config.json)")
    out = Path(out)
    if out.exists():
        raise AveragingError(f"--out {out}: already exists")
    listings = [_files(d) for d in dirs]
    for d, files in zip(dirs[1:], listings[1:], strict=True):
        if files.keys() != listings[0].keys():
            diff = sorted(files.keys() ^ listings[0].keys())
            raise AveragingError(f"{d}: holds other files than {dirs[0]} ({', '.join(diff)})")
    for name, path in listings[0].items():
        if not name.endswith(".safetensors"):
            for d, files in zip(dirs[1:], listings[1:], strict=True):
                if files[name].read_bytes() != path.read_bytes():
                    raise AveragingError(f"{d}: {name} differs from {dirs[0]} (checkpoints "
                                         "of different runs or settings?)")

    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        for name, path in listings[0].items():
            dst = tmp / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            if not name.endswith(".safetensors"):
                shutil.copy2(path, dst)
                continue
            states = [load_file(files[name]) for files in listings]
            for d, state in zip(dirs[1:], states[1:], strict=True):
                if state.keys() != states[0].keys():
                    raise AveragingError(f"{d}: {name} holds other tensors than {dirs[0]}")
            averaged = {key: _mean(name, key, [s[key] for s in states]) for key in states[0]}
            save_file(averaged, dst, metadata={"format": "pt"})
        (tmp / SOURCES_FILE).write_text(json.dumps([str(d) for d in dirs], indent=2) + "\n")
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
