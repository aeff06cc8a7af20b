"""The index / train generative / eval commands end to end on generated JSON data."""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from genrec.cli import app
from genrec.commands.train_generative import train_generative
from genrec.training.generative_run import GenerativeTrainConfig

N_ITEMS, N_USERS = 40, 30
runner = CliRunner()


def write_dataset(folder: Path) -> Path:
    """Toy.inter.json (users walk their cluster), Toy.item.json, sid-rqvae with collisions."""
    g = np.random.default_rng(0)
    inter = {}
    for u in range(N_USERS):
        c, start = u % 4, int(g.integers(10))
        inter[str(u)] = [c * 10 + (start + j) % 10 for j in range(int(g.integers(4, 9)))]
    items = {str(i): {"title": f"item {i}", "categories": [f"c{i // 10}"]} for i in range(N_ITEMS)}
    codes = {str(i): [f"<a_{i // 10}>", f"<b_{i % 5}>", f"<c_{(i // 5) % 2}>"]
             for i in range(N_ITEMS)}  # unique 3-level IDs ...
    codes["1"] = codes["0"]  # ... but for one collision, which the index must resolve
    folder.mkdir(parents=True)
    (folder / "sid-rqvae").mkdir()
    (folder / "Toy.inter.json").write_text(json.dumps(inter))
    (folder / "Toy.item.json").write_text(json.dumps(items))
    (folder / "sid-rqvae" / "Toy.index.json").write_text(json.dumps(codes))
    return folder


def invoke(*args: str) -> str:
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output


def test_index_train_eval_end_to_end(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "toy")
    out = invoke("index", "--data", data, "--out", tmp_path / "index.json")
    assert "items 40  levels 4" in out and "collisions resolved: 2 items in 1 groups" in out
    tiny = ["--hidden", "16", "--layers", "1", "--heads", "2", "--kv-heads", "1",
            "--head-dim", "8", "--batch-tokens", "200", "--max-history", "5",
            "--val-users", "10", "--beam-width", "10", "--no-progress", "--device", "cpu"]
    run = tmp_path / "run"
    out = invoke("train", "generative", "--data", data, "--index", tmp_path / "index.json",
                 "--out", run, "--epochs", "2", "--user-vectors", "svd", "--user-dim", "4",
                 *tiny)
    assert "best epoch" in out and f"final model {run}/model: " in out
    assert (run / "best" / "user_vectors.npy").is_file()
    # the final model: epoch 1, 2 or their mean, whichever validated best; eval loads it
    final = json.loads((run / "model.json").read_text())
    assert final["chosen"] in ("epoch 1", "epoch 2", "mean of epochs 1-2")
    assert len(final["candidates"]) == 2 and (run / "model" / "user_vectors.npy").is_file()
    # ... and its item weight, chosen on validation, saved with it and ranked with by eval
    assert sorted(map(float, final["item_weights"])) == [1.0, 2.0, 3.0, 5.0, 10.0, 20.0]
    assert final["item_weights"][str(final["item_weight"])] == max(final["item_weights"].values())
    saved = json.loads((run / "model" / "generation_config.json").read_text())
    assert saved == {"item_weight": final["item_weight"]} and "item weight" in out
    assert json.loads((run / "train_args.json").read_text())["user_vectors"] == "svd"
    out = invoke("eval", "--model", run, "--data", data, "--json", tmp_path / "m.json",
                 "--beam-width", "10", "--users", "8", "--no-progress", "--device", "cpu")
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert {"recall@5", "ndcg@5", "recall@10", "ndcg@10", "n_users", "beam_width",
            "wall_seconds"} <= set(metrics)
    assert metrics["item_weight"] == final["item_weight"]
    assert metrics["n_users"] == 8 and "ndcg@10" in out
    # popularity on the same 8 users beside the model, in the output and the JSON
    from genrec.data import load_json_dataset
    from genrec.evaluation.full_catalog import popularity_split

    ds = load_json_dataset(data)
    pop = popularity_split(ds.sequences, ds.num_items, "test", 5, users=8)
    assert metrics["popularity"] == {k: pop[k] for k in ("recall@5", "ndcg@5", "recall@10",
                                                         "ndcg@10")}
    assert "popularity" in out and f"{pop['ndcg@10']:.4f}" in out.split("popularity")[1]
    assert metrics["history_masked"] is False and "history not masked" in out
    # --mask-history: the model's and popularity's recommendations skip the user's items
    out = invoke("eval", "--model", run, "--data", data, "--json", tmp_path / "masked.json",
                 "--beam-width", "10", "--users", "8", "--no-progress", "--device", "cpu",
                 "--mask-history")
    masked = json.loads((tmp_path / "masked.json").read_text())
    pop = popularity_split(ds.sequences, ds.num_items, "test", 5, users=8, mask_history=True)
    assert masked["history_masked"] is True and "history masked" in out
    assert masked["popularity"] == {k: pop[k] for k in ("recall@5", "ndcg@5", "recall@10",
                                                        "ndcg@10")}
    out = invoke("train", "generative", "--data", data, "--index", tmp_path / "index.json",
                 "--out", run, "--epochs", "3", "--resume", *tiny)
    assert json.loads((run / "history.json").read_text())[-1]["epoch"] == 3


def test_causal_user_vectors_train_resume_and_eval(tmp_path: Path) -> None:
    import torch

    from genrec.training.user_vectors import fold_in, load_item_factors, saved_source

    data = write_dataset(tmp_path / "toy")
    invoke("index", "--data", data, "--out", tmp_path / "index.json")
    tiny = ["--hidden", "16", "--layers", "1", "--heads", "2", "--kv-heads", "1",
            "--head-dim", "8", "--batch-tokens", "200", "--max-history", "3",
            "--val-users", "10", "--beam-width", "10", "--no-progress", "--device", "cpu"]
    run = tmp_path / "run"
    invoke("train", "generative", "--data", data, "--index", tmp_path / "index.json",
           "--out", run, "--epochs", "1", "--user-vectors", "svd-causal", "--user-dim", "4",
           *tiny)
    factors = load_item_factors(run / "best")
    assert factors is not None and factors.shape == (N_ITEMS, 4)
    # the saved per-user vectors are the fold-in of each user's training items
    seqs = [v for v in json.loads((data / "Toy.inter.json").read_text()).values()]
    saved = torch.from_numpy(np.load(run / "best" / "user_vectors.npy"))
    assert torch.allclose(saved, fold_in(factors, [s[:-2] for s in seqs]), atol=1e-5)
    invoke("train", "generative", "--data", data, "--index", tmp_path / "index.json",
           "--out", run, "--epochs", "2", "--resume", *tiny)
    assert torch.equal(load_item_factors(run / "last"), factors)
    # resumed without the flag, the run keeps saying how its vectors were made; its final
    # model may be the mean of epochs 1-2
    assert saved_source(run / "last") == "svd-causal" == saved_source(run / "model")
    final = json.loads((run / "model.json").read_text())
    assert [c["epochs"] for c in final["candidates"]] == [[2], [1, 2]] or \
        [c["epochs"] for c in final["candidates"]] == [[1], [1, 2]]
    assert all("error" not in c for c in final["candidates"])
    out = invoke("eval", "--model", run, "--data", data, "--json", tmp_path / "m.json",
                 "--beam-width", "10", "--no-progress", "--device", "cpu")
    assert "ndcg@10" in out and json.loads((tmp_path / "m.json").read_text())["n_users"] > 0


def test_index_from_embeddings_and_tables(tmp_path: Path) -> None:
    inter = tmp_path / "inter.csv"
    rows = [f"u{u},i{(u * 3 + t) % 12},{t}" for u in range(8) for t in range(5)]
    inter.write_text("user_id,item_id,timestamp\n" + "\n".join(rows) + "\n")
    np.save(tmp_path / "emb.npy", np.random.default_rng(0).normal(size=(12, 6)).astype("f4"))
    out = invoke("index", "--interactions", inter, "--embeddings", tmp_path / "emb.npy",
                 "--levels", "2", "--codebook-size", "3", "--out", tmp_path / "idx.json")
    assert "items 12  levels 3" in out
    index = json.loads((tmp_path / "idx.json").read_text())
    assert index["item_ids"][:3] == ["i0", "i1", "i10"]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_bad_input_names_the_option(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "toy")
    result = runner.invoke(app, ["index", "--out", str(tmp_path / "x.json")])
    assert result.exit_code != 0 and "--data" in result.output
    np.save(tmp_path / "emb.npy", np.zeros((3, 2), dtype="f4"))
    result = runner.invoke(app, ["index", "--data", str(data), "--embeddings",
                                 str(tmp_path / "emb.npy"), "--out", str(tmp_path / "x.json")])
    assert result.exit_code == 1 and "embeddings: 3 rows" in result.output
    result = runner.invoke(app, ["eval", "--model", str(tmp_path), "--data", str(data)])
    assert result.exit_code == 1 and "config.json" in result.output
    invoke("index", "--data", data, "--out", tmp_path / "index.json")
    result = runner.invoke(app, ["train", "generative", "--data", str(data), "--index",
                                 str(tmp_path / "index.json"), "--out", str(tmp_path / "r"),
                                 "--item-compose", "--no-item-inputs"])
    assert result.exit_code != 0 and "--item-compose" in result.output


def test_composed_item_head_with_history_bias_trains_and_evaluates(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "toy")
    invoke("index", "--data", data, "--out", tmp_path / "index.json")
    run = tmp_path / "run"
    invoke("train", "generative", "--data", data, "--index", tmp_path / "index.json",
           "--out", run, "--epochs", "1", "--item-compose", "--history-bias",
           "--item-input-dropout", "0.2", "--mask-history", "--hidden", "16",
           "--layers", "1", "--heads", "2", "--kv-heads", "1", "--head-dim", "8",
           "--batch-tokens", "200", "--max-history", "3", "--val-users", "10", "--beam-width",
           "10", "--no-progress", "--device", "cpu")
    config = json.loads((run / "model" / "config.json").read_text())["genrec"]
    assert config["item_compose"] and config["history_bias"]
    from genrec.model import load_model

    assert load_model(run / "model").item_head.history_bias.item() != 0.0  # learned
    out = invoke("eval", "--model", run, "--data", data, "--json", tmp_path / "m.json",
                 "--beam-width", "10", "--no-progress", "--device", "cpu", "--mask-history")
    assert "ndcg@10" in out and json.loads((tmp_path / "m.json").read_text())["n_users"] > 0


def _tiny_run(data: Path, index: Path) -> list[str | Path]:
    """The flags of a one-epoch run of a tiny model."""
    return ["--data", data, "--index", index, "--epochs", "1", "--hidden", "16", "--layers", "1",
            "--heads", "2", "--kv-heads", "1", "--head-dim", "8", "--batch-tokens", "200",
            "--max-history", "3", "--val-users", "10", "--beam-width", "10", "--no-progress",
            "--device", "cpu"]


def test_a_run_distils_its_item_head_from_teachers(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "toy")
    invoke("index", "--data", data, "--out", tmp_path / "index.json")
    tiny = _tiny_run(data, tmp_path / "index.json")
    invoke("train", "generative", "--out", tmp_path / "t1", *tiny)
    invoke("train", "generative", "--out", tmp_path / "t2", "--seed", "1", "--mask-history",
           "--no-history-bias", *tiny)
    run = tmp_path / "student"
    out = invoke("train", "generative", "--out", run, "--teacher", tmp_path / "t1" / "model",
                 "--teacher", tmp_path / "t2" / "model", "--distill-weight", "0.7",
                 "--sid-distill-weight", "0.5", "--distill-temperature", "2", *tiny)
    assert "final model" in out
    args = json.loads((run / "train_args.json").read_text())
    assert args["teacher"] == [str(tmp_path / "t1" / "model"), str(tmp_path / "t2" / "model")]
    assert args["distill_weight"] == 0.7 and args["sid_distill_weight"] == 0.5
    assert args["distill_temperature"] == 2.0
    # one teacher that hides the user's items (-inf there) trains to a finite loss
    out = invoke("train", "generative", "--out", tmp_path / "s2", "--teacher",
                 tmp_path / "t2" / "model", "--sid-distill-weight", "1", *tiny)
    history = json.loads((tmp_path / "s2" / "history.json").read_text())
    assert all(math.isfinite(entry["train_loss"]) for entry in history)
    # a teacher over another index (the same codes, given to other items) is refused
    codes = json.loads((data / "sid-rqvae" / "Toy.index.json").read_text())
    keys = list(codes)
    (tmp_path / "other-sid.json").write_text(json.dumps(dict(zip(keys, reversed(codes.values()),
                                                                 strict=True))))
    invoke("index", "--data", data, "--sid-file", tmp_path / "other-sid.json",
           "--out", tmp_path / "other.json")
    result = runner.invoke(app, ["train", "generative", "--out", str(tmp_path / "bad"),
                                 "--teacher", str(tmp_path / "t1" / "model"),
                                 *[str(a) for a in tiny[:2]], "--index",
                                 str(tmp_path / "other.json"), *[str(a) for a in tiny[4:]]])
    assert result.exit_code == 1 and "teacher 0" in result.output
    result = runner.invoke(app, ["train", "generative", "--out", str(tmp_path / "bad"),
                                 "--teacher", str(tmp_path / "t1" / "model"), "--no-item-head",
                                 *[str(a) for a in tiny]])
    assert result.exit_code == 1 and "--teacher" in result.output
    result = runner.invoke(app, ["train", "generative", "--out", str(tmp_path / "bad"),
                                 "--sid-distill-weight", "0.5", *[str(a) for a in tiny]])
    assert result.exit_code == 1 and "--sid-distill-weight" in result.output
    result = runner.invoke(app, ["train", "generative", "--out", str(tmp_path / "bad"),
                                 "--distill-temperature", "0.5", *[str(a) for a in tiny]])
    assert result.exit_code == 1 and "--distill-temperature" in result.output


def test_one_flag_trains_the_teachers_then_the_student(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "toy")
    invoke("index", "--data", data, "--out", tmp_path / "index.json")
    tiny = _tiny_run(data, tmp_path / "index.json")
    run = tmp_path / "run"
    out = invoke("train", "generative", "--out", run, "--distill", *tiny)
    assert "teacher defaults: training" in out and "teacher mask-history: training" in out
    assert "student: distilled from 2 teachers" in out and f"final model {run}/model" in out
    args = json.loads((run / "train_args.json").read_text())
    assert args["distill"] is True and len(args["teacher"]) == 2
    out = invoke("eval", "--model", run, "--data", data, "--users", "5", "--device", "cpu")
    assert "ndcg@10" in out.lower()
    result = runner.invoke(app, ["train", "generative", "--out", str(tmp_path / "bad"),
                                 "--distill", "--teacher", str(run / "model"),
                                 *[str(a) for a in tiny]])
    assert result.exit_code == 1 and "--distill or --teacher" in result.output
    result = runner.invoke(app, ["train", "generative", "--out", str(tmp_path / "bad"),
                                 "--distill", "--nproc", "2", *[str(a) for a in tiny]])
    assert result.exit_code == 1 and "one process" in result.output


def test_the_command_and_the_config_have_the_same_defaults() -> None:
    # a run started from Python (GenerativeTrainConfig) trains what the command trains
    config = {f.name: f.default for f in dataclasses.fields(GenerativeTrainConfig)}
    flags = inspect.signature(train_generative).parameters
    shared = [name for name in flags if name in config
              and config[name] is not dataclasses.MISSING]
    assert {"distill_weight", "item_loss_weight", "lr", "patience", "average"} <= set(shared)
    for name in shared:
        assert flags[name].default == config[name], name
