"""The generative model's recipe from the data size, and ``train generative`` using it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from genrec.training.generative_run import RECIPE_KEYS, pick_recipe
from genrec.training.recipe import LARGE, MEDIUM, SMALL, recipe_for


def test_tiers_by_training_interactions() -> None:
    assert recipe_for(0) is SMALL and recipe_for(19_999) is SMALL
    assert recipe_for(41_858) is MEDIUM  # amazon18-scientific
    assert recipe_for(153_776) is MEDIUM  # amazon14-beauty
    assert recipe_for(500_000) is LARGE
    sizes = [r.hidden * r.layers for r in (SMALL, MEDIUM, LARGE)]
    assert sizes == sorted(sizes)
    for r in (SMALL, MEDIUM, LARGE):
        assert r.heads % r.kv_heads == 0 and 0.0 <= r.dropout < 0.5
    with pytest.raises(ValueError, match="train_interactions"):
        recipe_for(-1)


def test_given_values_win() -> None:
    seqs = [[1, 2, 3, 4]] * 10_000  # 20,000 training interactions: medium
    given = dict.fromkeys(RECIPE_KEYS) | {"hidden": 64, "dropout": 0.0}
    picked = pick_recipe(seqs, given, report=False)
    assert picked["hidden"] == 64 and picked["dropout"] == 0.0
    assert picked["layers"] == MEDIUM.layers and picked["epochs"] == MEDIUM.epochs


def test_train_command_records_the_recipe(tmp_path: Path) -> None:
    from test_commands_train_generative import invoke, write_dataset

    data = write_dataset(tmp_path / "toy")
    invoke("index", "--data", data, "--out", tmp_path / "index.json")
    out = invoke("train", "generative", "--data", data, "--index", tmp_path / "index.json",
                 "--out", tmp_path / "run", "--epochs", "1", "--layers", "1",
                 "--batch-tokens", "200", "--max-history", "5", "--val-users", "0",
                 "--no-progress", "--device", "cpu")
    assert "recipe: small data" in out and "hidden 128" in out and "layers 1" in out
    args = json.loads((tmp_path / "run" / "train_args.json").read_text())
    assert args["hidden"] == SMALL.hidden and args["layers"] == 1 and args["epochs"] == 1
    config = json.loads((tmp_path / "run" / "last" / "config.json").read_text())
    assert config["hidden_size"] == SMALL.hidden and config["num_hidden_layers"] == 1
