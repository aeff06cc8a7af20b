"""train teacher / train duolm / encode-catalog / eval (rankers) end to end on generated data."""

from __future__ import annotations

import json
from pathlib import Path

from test_commands_train_generative import invoke, runner, write_dataset

from genrec.cli import app
from genrec.duolm.store import current_version, load_store

TINY = ["--hidden", "16", "--layers", "1", "--heads", "2", "--kv-heads", "1",
        "--max-history", "5", "--negatives", "4", "--users-per-step", "8", "--val-users", "6",
        "--val-negatives", "9", "--no-progress", "--device", "cpu"]


def test_teacher_student_store_eval(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "toy")
    teacher = tmp_path / "teacher"
    out = invoke("train", "teacher", "--data", data, "--out", teacher, "--epochs", "1",
                 "--max-title-tokens", "4", "--max-text-tokens", "8", *TINY)
    assert "best epoch 1" in out
    assert json.loads((teacher / "best" / "duolm.json").read_text())["kind"] == "teacher"

    student = tmp_path / "student"
    out = invoke("train", "duolm", "--data", data, "--out", student, "--teacher", teacher,
                 "--backend", "decoder", "--max-text-tokens", "8", "--epochs", "2",
                 "--user-vectors", "svd", "--user-dim", "4", *TINY)
    assert "epochs 2" in out
    assert (student / "best" / "item_encoder" / "encoder_config.json").is_file()
    assert (student / "best" / "user_vectors.npy").is_file()  # the soft token's vectors

    store = tmp_path / "store"
    for version in (1, 2):
        out = invoke("encode-catalog", "--model", student, "--data", data, "--out", store,
                     "--no-progress", "--device", "cpu")
        assert f"(version {version})" in out
    snap = load_store(store)
    assert current_version(store) == 2 and snap.vectors.shape == (40, 2, 16)

    out = invoke("eval", "--model", student, "--teacher", teacher, "--item-store", store,
                 "--data", data, "--negatives", "9", "--users", "12", "--json",
                 tmp_path / "m.json", "--no-progress", "--device", "cpu")
    assert "student / teacher NDCG@10" in out
    metrics = json.loads((tmp_path / "m.json").read_text())
    for name in ("student", "teacher"):
        assert {"ndcg@10", "recall@10", "mrr", "users"} <= set(metrics[name])
        assert metrics[name]["users"] == 12
    # without --item-store the catalog is encoded on the spot: the same table, the same metrics
    invoke("eval", "--model", student, "--data", data, "--negatives", "9", "--users", "12",
           "--json", tmp_path / "m2.json", "--no-progress", "--device", "cpu")
    again = json.loads((tmp_path / "m2.json").read_text())["student"]
    assert abs(again["ndcg@10"] - metrics["student"]["ndcg@10"]) < 1e-6
    result = runner.invoke(app, ["eval", "--model", str(student), "--ensemble", str(student),
                                 "--data", str(data), "--device", "cpu"])
    assert result.exit_code != 0 and "generative models only" in result.output


def test_minilm_teacher_trains_resumes_and_teaches(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "toy")
    teacher = tmp_path / "teacher"
    opts = ["--data", data, "--out", teacher, "--backend", "minilm", "--max-title-tokens", "4",
            "--max-text-tokens", "8", "--lr", "5e-5", "--max-examples", "16", *TINY]
    out = invoke("train", "teacher", *opts, "--epochs", "1")
    assert "22.57M parameters" in out  # all of MiniLM plus the read-out
    meta = json.loads((teacher / "best" / "duolm.json").read_text())
    assert (meta["kind"], meta["backend"]) == ("teacher", "minilm")
    assert json.loads((teacher / "best" / "config.json").read_text())["model_type"] == "bert"
    out = invoke("train", "teacher", *opts, "--epochs", "2", "--resume")
    assert "epochs 2" in out
    student = tmp_path / "student"
    out = invoke("train", "duolm", "--data", data, "--out", student, "--teacher", teacher,
                 "--backend", "decoder", "--max-text-tokens", "8", "--epochs", "1",
                 "--max-examples", "16", *TINY)
    assert "epochs 1" in out
    invoke("eval", "--model", student, "--teacher", teacher, "--data", data, "--negatives", "9",
           "--users", "6", "--json", tmp_path / "m.json", "--no-progress", "--device", "cpu")
    assert json.loads((tmp_path / "m.json").read_text())["teacher"]["users"] == 6
    result = runner.invoke(app, ["train", "teacher", *map(str, opts[:4]), "--backend", "bert"])
    assert result.exit_code == 1 and "backend must be" in result.output


def test_duolm_errors_are_clear(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "toy")
    (data / "Toy.item.json").unlink()  # no item text
    result = runner.invoke(app, ["train", "duolm", "--data", str(data), "--out",
                                 str(tmp_path / "s"), *TINY])
    assert result.exit_code == 1 and "no item text" in result.output
    result = runner.invoke(app, ["encode-catalog", "--model", str(tmp_path), "--data",
                                 str(data), "--out", str(tmp_path / "st")])
    assert result.exit_code == 1 and "duolm.json" in result.output
