"""Versioned item-representation store: what `genrec encode-catalog` writes and the engine loads.

Layout of a store folder::

    STORE/CURRENT                  the current version's folder name, e.g. "v000002"
    STORE/v000002/items.safetensors  vectors [N, k, hidden] fp32, active [N] bool
    STORE/v000002/meta.json        version, counts, item ids, encoder config, creation time

A version folder is written under a temporary name and renamed into place; ``CURRENT`` is then
replaced atomically, so a reader sees a whole old version or a whole new one. Retired items keep
their row (ids stay stable) with ``active = False``.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from genrec.catalog.item_table import ItemTable
from genrec.utils.atomic import atomic_write, atomic_write_json

CURRENT_FILE = "CURRENT"
TENSORS_FILE = "items.safetensors"
META_FILE = "meta.json"


@dataclass
class StoreVersion:
    """One version of a store: the representations and their metadata."""

    vectors: torch.Tensor  # [N, k, hidden] fp32
    active: torch.Tensor  # [N] bool
    version: int
    item_ids: list[str]
    meta: dict[str, Any] = field(default_factory=dict)

    def table(self) -> ItemTable:
        """The engine's item table of this version."""
        return ItemTable(self.vectors, version=self.version, active=self.active)


def _version_name(version: int) -> str:
    return f"v{version:06d}"


def current_version(path: str | Path) -> int | None:
    """The store's current version number, or None when the folder holds no store."""
    pointer = Path(path) / CURRENT_FILE
    if not pointer.is_file():
        return None
    return int(pointer.read_text().strip().lstrip("v"))


def write_store(
    path: str | Path, vectors: torch.Tensor, item_ids: list[str],
    active: torch.Tensor | None = None, meta: dict[str, Any] | None = None,
) -> int:
    """Write a new version (current + 1, or 1) and make it current; returns its number."""
    path = Path(path)
    if vectors.dim() != 3:
        raise ValueError(f"vectors must be [num_items, k, hidden], got {tuple(vectors.shape)}")
    if len(item_ids) != vectors.shape[0]:
        raise ValueError(f"item_ids: {len(item_ids)} ids for {vectors.shape[0]} items")
    if not torch.isfinite(vectors).all():
        raise ValueError("vectors contain NaN or infinite values")
    n = vectors.shape[0]
    if active is not None and tuple(active.shape) != (n,):
        raise ValueError(f"active must be [{n}], got {tuple(active.shape)}")
    active = torch.ones(n, dtype=torch.bool) if active is None else active.to(torch.bool)
    path.mkdir(parents=True, exist_ok=True)
    version = (current_version(path) or 0) + 1
    final = path / _version_name(version)
    tmp = path / f".{final.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    tensors = {"vectors": vectors.detach().float().cpu().contiguous(),
               "active": active.cpu().contiguous()}
    save_file(tensors, tmp / TENSORS_FILE)
    atomic_write_json(tmp / META_FILE, {
        **(meta or {}), "version": version, "num_items": n, "k": int(vectors.shape[1]),
        "hidden_size": int(vectors.shape[2]), "num_active": int(active.sum()),
        "item_ids": list(item_ids), "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    })
    if final.exists():  # left by a crash before CURRENT moved: never current, safe to drop
        shutil.rmtree(final)
    os.replace(tmp, final)
    atomic_write(path / CURRENT_FILE, lambda t: Path(t).write_text(final.name + "\n"))
    return version


def load_store(path: str | Path, version: int | None = None) -> StoreVersion:
    """Read the current version (or ``version``) of a store."""
    import json

    path = Path(path)
    if version is None:
        version = current_version(path)
        if version is None:
            raise FileNotFoundError(f"{path}: not an item store (no {CURRENT_FILE} file)")
    folder = path / _version_name(version)
    if not folder.is_dir():
        raise FileNotFoundError(f"{path}: no version {version}")
    tensors = load_file(folder / TENSORS_FILE)
    meta = json.loads((folder / META_FILE).read_text())
    return StoreVersion(tensors["vectors"], tensors["active"], version,
                        list(meta.get("item_ids", [])), meta)
