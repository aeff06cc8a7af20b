"""``genrec eval`` of an ensemble of generative models, of item weights from one search and of
a model against another (single models: see test_commands_train_generative.py)."""

from __future__ import annotations

import json
from pathlib import Path

from test_commands_train_generative import invoke, runner, write_dataset

from genrec.cli import app

TINY = ["--hidden", "16", "--layers", "1", "--heads", "2", "--kv-heads", "1", "--head-dim", "8",
        "--batch-tokens", "200", "--max-history", "5", "--val-users", "10", "--beam-width",
        "10", "--no-progress", "--device", "cpu", "--epochs", "1"]
EVAL = ["--beam-width", "10", "--no-progress", "--device", "cpu"]
KEYS = ("recall@5", "ndcg@5", "recall@10", "ndcg@10")


def two_runs(tmp_path: Path) -> tuple[Path, list[Path]]:
    """A toy dataset and two tiny models trained on it with seeds 0 and 1."""
    data = write_dataset(tmp_path / "toy")
    invoke("index", "--data", data, "--out", tmp_path / "index.json")
    runs = [tmp_path / f"run{seed}" for seed in range(2)]
    for seed, run in enumerate(runs):
        invoke("train", "generative", "--data", data, "--index", tmp_path / "index.json",
               "--out", run, "--seed", str(seed), *TINY)
    return data, runs


def test_ensemble_eval(tmp_path: Path) -> None:
    data, runs = two_runs(tmp_path)
    invoke("eval", "--model", runs[0], "--data", data, "--json", tmp_path / "one.json", *EVAL)
    # a model ensembled with itself ranks as the model alone
    invoke("eval", "--model", runs[0], "--ensemble", runs[0], "--data", data, "--json",
           tmp_path / "self.json", *EVAL)
    out = invoke("eval", "--model", runs[0], "--ensemble", runs[1], "--data", data,
                 "--json", tmp_path / "two.json", "--mask-history", *EVAL)
    one, self_, two = (json.loads((tmp_path / f"{n}.json").read_text())
                       for n in ("one", "self", "two"))
    assert {k: one[k] for k in KEYS} == {k: self_[k] for k in KEYS}
    assert two["models"] == [str(runs[0]), str(runs[1])] and two["history_masked"]
    assert set(KEYS) <= set(two) and "ndcg@10" in out and two["n_users"] == one["n_users"]


def test_ensemble_refuses_soft_tokens_and_other_indexes(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "toy")
    invoke("index", "--data", data, "--out", tmp_path / "index.json")
    plain, soft = tmp_path / "plain", tmp_path / "soft"
    invoke("train", "generative", "--data", data, "--index", tmp_path / "index.json", "--out",
           plain, *TINY)
    invoke("train", "generative", "--data", data, "--index", tmp_path / "index.json", "--out",
           soft, "--user-vectors", "svd", "--user-dim", "4", *TINY)
    result = runner.invoke(app, ["eval", "--model", str(plain), "--ensemble", str(soft),
                                 "--data", str(data), *EVAL])
    assert result.exit_code == 1 and "--ensemble" in result.output
    assert "soft token" in result.output
    result = runner.invoke(app, ["eval", "--model", str(plain), "--ensemble",
                                 str(tmp_path / "missing"), "--data", str(data), *EVAL])
    assert result.exit_code == 1 and "missing" in result.output


def test_item_weights_from_one_search(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "toy")
    invoke("index", "--data", data, "--out", tmp_path / "index.json")
    run = tmp_path / "run"
    invoke("train", "generative", "--data", data, "--index", tmp_path / "index.json",
           "--out", run, "--no-choose-item-weight", *TINY)
    out = invoke("eval", "--model", run, "--data", data, "--split", "val", "--mask-history",
                 "--item-weights", "1,3,20", "--json", tmp_path / "sweep.json", *EVAL)
    assert all(f"w {w}" in out for w in ("1 ", "3 ", "20 "))
    sweep = json.loads((tmp_path / "sweep.json").read_text())
    assert set(sweep["by_item_weight"]) == {"1.0", "3.0", "20.0"}
    invoke("eval", "--model", run, "--data", data, "--split", "val", "--mask-history",
           "--item-weight", "20", "--json", tmp_path / "one.json", *EVAL)
    one = json.loads((tmp_path / "one.json").read_text())
    assert {k: one[k] for k in KEYS} == {k: sweep["by_item_weight"]["20.0"][k] for k in KEYS}
    for bad in ("0,1", "1,x", "2,2", ""):
        result = runner.invoke(app, ["eval", "--model", str(run), "--data", str(data),
                                     "--item-weights", bad, *EVAL])
        assert result.exit_code != 0 and "--item-weights" in result.output


def test_against_prints_and_saves_the_paired_difference(tmp_path: Path) -> None:
    data, runs = two_runs(tmp_path)
    singles = []
    for i, run in enumerate(runs):
        invoke("eval", "--model", run, "--data", data, "--split", "val", "--json",
               tmp_path / f"one{i}.json", *EVAL)
        singles.append(json.loads((tmp_path / f"one{i}.json").read_text()))
    out = invoke("eval", "--model", runs[0], "--against", runs[1], "--data", data, "--split",
                 "val", "--json", tmp_path / "pair.json", *EVAL)
    assert "against" in out and "difference" in out and "its SE" in out
    pair = json.loads((tmp_path / "pair.json").read_text())
    assert pair["against_model"] == str(runs[1])
    for k in KEYS:
        assert pair[k] == singles[0][k] and pair["against"][k] == singles[1][k]
        assert abs(pair["paired"][k]["difference"] - (singles[0][k] - singles[1][k])) < 1e-9
        assert pair["paired"][k]["se"] >= 0
    result = runner.invoke(app, ["eval", "--model", str(runs[0]), "--against",
                                 str(tmp_path / "missing"), "--data", str(data), *EVAL])
    assert result.exit_code == 1 and "missing" in result.output
    result = runner.invoke(app, ["eval", "--model", str(runs[0]), "--against", str(runs[1]),
                                 "--item-weights", "1,3", "--data", str(data), *EVAL])
    assert result.exit_code != 0 and "--against" in result.output
