"""A generative training run from a config through the Python API (no command line)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from genrec.catalog import load_sid_index
from genrec.data import load_json_dataset
from genrec.training.generative_run import GenerativeTrainConfig, train_generative

N_ITEMS, N_USERS = 24, 20


def _dataset(folder: Path) -> Path:
    # users walk their cluster; unique 3-level Semantic IDs
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


def _tiny(tmp_path: Path, **options: object) -> GenerativeTrainConfig:
    data = _dataset(tmp_path / "toy")
    ds = load_json_dataset(data)
    load_sid_index(ds.semantic_id_path, ds.item_index, on_collision="dedup").save(
        tmp_path / "index.json")
    return GenerativeTrainConfig(
        index=tmp_path / "index.json", out=tmp_path / "run", data=data, hidden=16, layers=1,
        heads=2, kv_heads=1, head_dim=8, epochs=1, batch_tokens=200, max_history=5,
        val_users=5, beam_width=10, progress=False, device="cpu", **options)


def test_a_config_trains_and_records_its_options(tmp_path: Path) -> None:
    lines: list[str] = []
    result = train_generative(_tiny(tmp_path, seed=3), echo=lines.append)
    assert result is not None and result.epochs_done == 1
    assert (tmp_path / "run" / "best" / "config.json").is_file()
    args = json.loads((tmp_path / "run" / "train_args.json").read_text())
    assert args["seed"] == 3 and args["hidden"] == 16 and args["data"] == str(tmp_path / "toy")
    assert args["item_head"] is True  # from scratch: on by default
    assert any("Toy" in line and "params on cpu" in line for line in lines)


def test_bad_options_raise_value_errors(tmp_path: Path) -> None:
    config = _tiny(tmp_path, prompt_text="hi")
    with pytest.raises(ValueError, match="--prompt-text needs --extend-vocab"):
        train_generative(config)
    config.data, config.prompt_text = None, None
    with pytest.raises(ValueError, match="exactly one of data"):
        train_generative(config)


def test_mask_history_trains_the_head_and_validates_masked(tmp_path: Path) -> None:
    from genrec import Engine
    from genrec.evaluation.full_catalog import evaluate_generative, full_histories, split_examples

    config = _tiny(tmp_path, mask_history=True, seed=1)
    result = train_generative(config, echo=lambda _: None)
    assert result is not None and result.epochs_done == 1
    args = json.loads((tmp_path / "run" / "train_args.json").read_text())
    assert args["mask_history"] is True
    # the recorded validation is the masked one: re-evaluate the saved model both ways
    ds = load_json_dataset(config.data)
    val = split_examples(ds.sequences, "val", config.max_history, config.val_users, config.seed)
    engine = Engine.from_pretrained(tmp_path / "run" / "best", device="cpu")
    masked = evaluate_generative(engine, val, beam_width=config.beam_width,
                                 exclude=full_histories(ds.sequences, val, "val"))
    assert result.history[0]["val_ndcg@10"] == pytest.approx(masked["ndcg@10"])
    assert result.history[0]["val_recall@10"] == pytest.approx(masked["recall@10"])
    with pytest.raises(ValueError, match="--mask-history trains the item head"):
        train_generative(_tiny(tmp_path / "b", mask_history=True, item_head=False))
