"""A toy dataset with its Semantic index, and the config of a tiny generative run over it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from genrec.catalog import load_sid_index
from genrec.data import load_json_dataset
from genrec.training.generative_run import GenerativeTrainConfig

N_ITEMS, N_USERS = 24, 20


def toy_dataset(folder: Path) -> Path:
    """A JSON dataset folder: users walk their cluster; unique 3-level Semantic IDs."""
    g = np.random.default_rng(0)
    inter = {str(u): [(u % 3) * 8 + (int(g.integers(8)) + j) % 8
                      for j in range(int(g.integers(4, 8)))] for u in range(N_USERS)}
    codes = {str(i): [f"<a_{i // 8}>", f"<b_{i % 4}>", f"<c_{(i // 4) % 2}>"]
             for i in range(N_ITEMS)}
    (folder / "sid-rqvae").mkdir(parents=True)
    (folder / "Toy.inter.json").write_text(json.dumps(inter))
    (folder / "Toy.item.json").write_text(json.dumps({str(i): {"title": f"item {i}"}
                                                      for i in range(N_ITEMS)}))
    (folder / "sid-rqvae" / "Toy.index.json").write_text(json.dumps(codes))
    return folder


def tiny_config(tmp_path: Path, **options: object) -> GenerativeTrainConfig:
    """A one-epoch run of a tiny model over a toy dataset written under ``tmp_path`` (its
    index in ``tmp_path/index.json``, the run in ``tmp_path/run``); ``options`` override."""
    data = toy_dataset(tmp_path / "toy")
    ds = load_json_dataset(data)
    load_sid_index(ds.semantic_id_path, ds.item_index, on_collision="dedup").save(
        tmp_path / "index.json")
    given: dict = dict(
        index=tmp_path / "index.json", out=tmp_path / "run", data=data, hidden=16, layers=1,
        heads=2, kv_heads=1, head_dim=8, epochs=1, batch_tokens=200, max_history=5,
        val_users=5, beam_width=10, progress=False, device="cpu")
    return GenerativeTrainConfig(**(given | options))
